"""``Leash``: a child process group that dies with this Python process, however it dies.

The embedded broker's nodes and the Spark cluster's JVMs run in sessions of their own (so a
terminal's Ctrl-C reaches the program that owns them, which stops them in order). A program
that dies hard (SIGKILL, a test run's timeout, a crash in native code) cannot stop them, and
they would live on, holding ports and memory. A leash is a small watcher process holding one
end of a pipe whose other end only this process holds: when this process dies, however, the
pipe closes and the watcher SIGKILLs the group; ``release`` tells it to go quietly instead.

A pipe rather than Linux's parent-death signal, which follows the thread that started the
child: a node restarted from a worker thread would die when that thread ends.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import weakref

__all__ = ["Leash"]

#: The watcher: wait for a byte; EOF (the owner died) kills the group, ``q`` just ends.
_WATCHER = """
import os, signal, sys
if sys.stdin.buffer.read(1) != b"q":
    try:
        os.killpg(int(sys.argv[1]), signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
"""


#: Every leash of this process, so that a child forked without exec closes their pipes (or it
#: would hold them open, and a dead owner's watcher would never see the end).
_LEASHES: weakref.WeakSet[Leash] = weakref.WeakSet()


def _close_in_child() -> None:
    for leash in list(_LEASHES):
        leash.forget()


os.register_at_fork(after_in_child=_close_in_child)


class Leash:
    """Kills process group ``pgid`` (a child started with ``start_new_session=True``: its pid)
    when this process dies, unless ``release``d first.

    Caller: the code that started the child, right after starting it. Affects: one watcher
    process, which lives until ``release`` or this process's death.
    """

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid
        self._watcher: subprocess.Popen[bytes] | None = subprocess.Popen(
            # Isolated, no site: no file of the working directory or .pth hook runs in it.
            [sys.executable, "-I", "-S", "-c", _WATCHER, str(pgid)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C meant for this program is not meant for it
        )
        _LEASHES.add(self)

    def forget(self) -> None:
        """In a forked child: close this process's end of the pipe without a word (the
        parent still holds its own)."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None and watcher.stdin is not None:
            with contextlib.suppress(OSError):
                os.close(watcher.stdin.fileno())

    def release(self) -> None:
        """Let the group live on without the watcher (call it once the child has exited, or
        to hand the group over). Idempotent.

        Caller: whoever stops or reaps the child. Affects: ends the watcher.
        """
        watcher, self._watcher = self._watcher, None
        if watcher is None:
            return
        with contextlib.suppress(OSError):  # the watcher may be gone already
            assert watcher.stdin is not None
            watcher.stdin.write(b"q")
            watcher.stdin.close()
        try:
            watcher.wait(10)
        except subprocess.TimeoutExpired:
            watcher.kill()
            watcher.wait()
