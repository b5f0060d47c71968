"""The campaign's history: one JSON object a line, one file per process, merged by time.

Every line has ``t`` (wall-clock seconds; all processes run on one machine), ``proc`` (who
wrote it: ``producer``, ``nemesis``, ``alo-1.3``: slot 1 of workload ``alo``, its third start)
and ``type``. A process killed with SIGKILL loses nothing it wrote: lines go to the file
unbuffered.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

__all__ = ["History", "read_history"]

Event = dict[str, Any]


class History:
    """Appends events to one file; safe to call from several threads."""

    def __init__(self, path: Path, proc: str) -> None:
        self.path = path
        self.proc = proc
        self._lock = threading.Lock()
        self._out: TextIO = path.open("a", buffering=1, encoding="utf-8")

    def add(self, type_: str, **fields: Any) -> None:
        line = json.dumps({"t": time.time(), "proc": self.proc, "type": type_, **fields})
        with self._lock:
            if not self._out.closed:
                self._out.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            self._out.close()


def _lines(path: Path) -> Iterator[Event]:
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue  # the torn last line of a process killed mid-write


def read_history(paths: Iterable[Path]) -> list[Event]:
    """Every event of ``paths``, ordered by time."""
    events = [event for path in paths for event in _lines(path)]
    events.sort(key=lambda event: event["t"])
    return events
