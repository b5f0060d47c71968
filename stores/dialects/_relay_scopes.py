"""How an outbox relay holds its rows on each database: the scope of its transactions and
what keeps relays apart (``SqlDialect.relay_scope`` and ``relay_guard`` pick one).

On PostgreSQL a relay locks the rows it claims (``FOR UPDATE SKIP LOCKED``) and keeps them
locked while it publishes: one transaction from the claim to the mark, ended by a crash as
surely as by a commit, while other relays take other rows and the application inserts freely.
SQLite has no row locks, and an open write transaction would stop the application's writes
for as long as Kafka takes: each step is its own short transaction, and one relay at a time
holds the database (a lock on a file beside it, named for the database file's inode, dropped
by the kernel when the process dies).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from types import TracebackType
from typing import IO, Protocol, Self, TypeVar

from sqlalchemy.engine import Connection, Engine

from bolide.facade.errors import StoreError

__all__ = ["EachStep", "FileGuard", "NoGuard", "OneTransaction", "RelayGuard", "RelayScope"]

T = TypeVar("T")


class RelayScope(Protocol):
    """One claim-publish-mark round of a relay: ``run`` its database steps inside ``with``."""

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    def run(self, step: Callable[[Connection], T]) -> T:
        """Run one database step of the round."""
        ...


class OneTransaction:
    """Every step in one transaction: committed when the round ends, rolled back (its locks
    let go) when it raises."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._conn: Connection | None = None

    def __enter__(self) -> Self:
        self._conn = self._engine.connect()
        self._conn.begin()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            if exc_type is None:
                conn.commit()
            else:
                conn.rollback()
        finally:
            conn.close()

    def run(self, step: Callable[[Connection], T]) -> T:
        assert self._conn is not None, "run() belongs inside `with scope:`"
        return step(self._conn)


class EachStep:
    """Every step its own transaction, committed when the step returns."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def run(self, step: Callable[[Connection], T]) -> T:
        with self._engine.begin() as conn:
            return step(conn)


class RelayGuard(Protocol):
    """Keeps relays that must not share a database apart."""

    def acquire(self) -> bool:
        """Take the database for this relay; ``False`` when another relay holds it."""
        ...

    def release(self) -> None:
        """Let the database go (idempotent)."""
        ...


class NoGuard:
    """Relays share the database: their row locks keep them apart."""

    def acquire(self) -> bool:
        return True

    def release(self) -> None:
        return None


class FileGuard:
    """An exclusive lock on ``bolide-outbox-relay-<inode>.lock`` beside the database file
    (``flock``: the kernel drops it with the process that held it).

    The lock goes by the file, not by the path a relay was given: beside the file that
    symbolic links lead to, and named for its inode, so a relay reaching the database through
    a symbolic link, or a hard link in the same directory, meets the same lock. The directory
    already names the file system, so the inode alone names the file (and stays the same seen
    from every machine mounting a network file system, where the device number does not).
    """

    def __init__(self, database: str) -> None:
        self.database = database
        self.path: str | None = None  # set by acquire()
        self._file: IO[bytes] | None = None

    def lock_path(self) -> str:
        """The lock file of the database file as it is now.

        Raises:
            StoreError: There is no database file.
        """
        real = os.path.realpath(self.database)
        try:
            inode = os.stat(real).st_ino
        except OSError as exc:
            raise StoreError(f"no database file at {self.database}: {exc.strerror}") from exc
        return os.path.join(os.path.dirname(real), f"bolide-outbox-relay-{inode}.lock")

    def acquire(self) -> bool:
        path = self.lock_path()
        handle = open(path, "ab")  # noqa: SIM115 - held until release()
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        self._file, self.path = handle, path
        return True

    def release(self) -> None:
        handle, self._file = self._file, None
        if handle is not None:
            handle.close()  # closing the file lets the lock go
