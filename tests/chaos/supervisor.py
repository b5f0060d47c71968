"""One worker slot: its process, restarted whenever it dies, until the run ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from tests.chaos.history import History

__all__ = ["PARENT_ENV", "ROOT", "Supervisor"]

ROOT = Path(__file__).resolve().parents[2]
#: The campaign's pid, in a worker's environment: the worker ends when that process is gone.
PARENT_ENV = "BOLIDE_CHAOS_PARENT"


class Supervisor:
    """Runs ``python -m tests.chaos.worker MODE ... HISTORY PROC STOP`` for one slot.

    ``args`` are the worker's arguments before its history, name and stop file. Each start
    is a new incarnation: ``<workload>-<slot>.<n>``, with a history file of its own.
    """

    def __init__(
        self, folder: Path, workload: str, slot: int, args: Sequence[str], history: History
    ) -> None:
        self.folder = folder
        self.name = f"{workload}-{slot}"
        self.args = list(args)
        self.history = history
        self.stop_path = folder / f"{self.name}.stop"
        self.incarnation = 0
        self.exits: dict[int, int] = {}
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    @property
    def proc(self) -> str:
        return f"{self.name}.{self.incarnation}"

    def start(self) -> None:
        with self._lock:
            self.incarnation += 1
            with (self.folder / f"{self.proc}.err").open("wb") as err:
                self._process = subprocess.Popen(
                    [sys.executable, "-m", "tests.chaos.worker", *self.args,
                     str(self.folder / f"{self.proc}.jsonl"), self.proc, str(self.stop_path)],
                    cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                    start_new_session=True,  # Ctrl-C reaches the campaign, which ends them
                    env={**os.environ, PARENT_ENV: str(os.getpid())},
                )  # fmt: skip

    def signal(self, signum: int) -> None:
        with self._lock:
            if self._process is not None and self._process.poll() is None:
                self._process.send_signal(signum)

    def check(self) -> None:
        """Start a new incarnation when the current one has died."""
        process = self._process
        if process is None or process.poll() is None or self.stop_path.exists():
            return
        code = process.returncode
        self.exits[code] = self.exits.get(code, 0) + 1
        tail = (self.folder / f"{self.proc}.err").read_text(errors="replace")[-800:]
        self.history.add("worker-exit", target=self.proc, code=code, stderr=tail)
        self.start()

    def finish(self, timeout_s: float) -> None:
        """Ask the worker to stop, then make sure it did: nothing outlives the run."""
        self.stop_path.touch()
        with self._lock:
            process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
