"""The interface every embedded engine implements, so ``EmbeddedBroker`` holds no engine code."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

__all__ = ["Engine"]


class Engine(Protocol):
    """One embedded broker implementation (Apache Kafka or Tansu).

    ``EmbeddedBroker`` calls these from one thread; an engine starts, stops and kills only the
    processes it started itself.
    """

    #: ``"kafka"`` or ``"tansu"``.
    name: str
    host: str
    #: The port of the first node's client listener.
    port: int
    log_path: Path

    @property
    def node_ids(self) -> tuple[int, ...]:
        """The ids of the nodes, running or not."""
        ...

    @property
    def bootstrap(self) -> str:
        """``host:port`` of every node, comma-separated (``bootstrap.servers``)."""
        ...

    def pids(self) -> tuple[int, ...]:
        """Process ids of the nodes that run."""
        ...

    def running(self) -> bool:
        """True while every node runs."""
        ...

    def start(self, timeout_s: float) -> None:
        """Start every node that does not run and wait until all answer."""
        ...

    def stop(self, timeout_s: float) -> None:
        """Stop every node and remove the engine's data."""
        ...

    def kill(self) -> None:
        """SIGKILL every node; the data stays, so ``start`` brings the cluster back."""
        ...

    def kill_node(self, node_id: int) -> None:
        """SIGKILL one node; its data stays."""
        ...

    def start_node(self, node_id: int, timeout_s: float) -> None:
        """Start one node again and wait until it is back in the cluster."""
        ...

    def pause_node(self, node_id: int) -> None:
        """SIGSTOP one running node: it keeps its sockets and answers nothing (a long GC
        pause)."""
        ...

    def resume_node(self, node_id: int) -> None:
        """SIGCONT a paused node (nothing when it is not paused)."""
        ...

    def cluster_settings(self) -> dict[str, Any]:
        """``Cluster`` settings clients of this engine need (its workarounds, if any)."""
        ...
