"""What both engines share: free ports, waiting for a broker to answer, a log's tail."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from bolide.facade.errors import BrokerError

__all__ = [
    "free_port",
    "free_ports",
    "log_tail",
    "port_taken",
    "signal_process",
    "stop_process",
    "wait_ready",
]


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    return free_ports(1)[0]


def free_ports(count: int, taken: Collection[int] = ()) -> list[int]:
    """``count`` distinct loopback ports nothing listens on right now, none of ``taken``:
    held together while they are picked, so that processes started one after the other
    (before any of them has bound its port) never get the same one."""
    ports: list[int] = []
    with contextlib.ExitStack() as held:
        while len(ports) < count:
            sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
            if port not in taken:
                ports.append(port)
    return ports


def port_taken(port: int, host: str = "127.0.0.1") -> bool:
    """True when something already listens on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def log_tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file ('' when it cannot be read)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def wait_ready(
    bootstrap: str,
    *,
    alive: Callable[[], str | None],
    brokers: int,
    timeout_s: float,
    log_path: Path,
    settings: Mapping[str, Any] | None = None,
) -> None:
    """Wait until ``brokers`` brokers answer metadata requests at ``bootstrap``.

    Args:
        alive: Returns ``None`` while the processes run, else why not (checked every round,
            so a broker that dies during start fails at once instead of at the deadline).
        settings: librdkafka settings to connect with (a secured broker's super user).

    Raises:
        BrokerError: A process died, or the brokers did not answer within ``timeout_s``; the
            message has the tail of the log.
    """
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout_s
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, **(settings or {})})
    last = "no answer"
    while time.monotonic() < deadline:
        dead = alive()
        if dead is not None:
            raise BrokerError(f"{dead}; the end of {log_path}:\n{log_tail(log_path)}")
        try:
            metadata = admin.list_topics(timeout=1)
        except Exception as exc:
            last = str(exc)
        else:
            if len(metadata.brokers) >= brokers:
                return
            last = f"{len(metadata.brokers)} of {brokers} brokers registered"
        time.sleep(0.1)
    raise BrokerError(
        f"the embedded broker did not answer within {timeout_s}s ({last}); "
        f"the end of {log_path}:\n{log_tail(log_path)}"
    )


def signal_process(process: subprocess.Popen[bytes] | None, signum: int, what: str) -> None:
    """Send ``signum`` to ``process``, which must be running.

    Raises:
        BrokerError: ``process`` is not running (``what`` names it in the message).
    """
    if process is None or process.poll() is not None:
        raise BrokerError(f"{what} is not running")
    process.send_signal(signum)


def stop_process(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM ``process``, then SIGKILL it if it has not exited within ``timeout_s``.

    A stopped (SIGSTOPped) process is continued first, or it would not act on the SIGTERM."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGCONT)
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout_s)
