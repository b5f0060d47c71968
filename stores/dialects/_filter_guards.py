"""What the database enforces on a ``where`` filter: it reads only the dead letters' columns,
and it runs for a bounded time.

The text check (``deadletters._filter``) is a first, friendly refusal; it reads the filter as
one lexer would, and a database reads some text differently (SQLite's ``[name]`` and backtick
names, PostgreSQL with ``standard_conforming_strings`` off). These guards do not depend on
reading the text right:

- ``SQLiteGuard``: an authorizer on the filter's connection allows a ``SELECT`` and the
  functions a filter may call, and denies everything else: reading any table (a subquery,
  ``sqlite_master``, the dead-letter rows' own CTE), a recursive CTE, a pragma. A progress
  handler interrupts the statement once the time is up, and ``SQLITE_LIMIT_LENGTH`` keeps the
  values it builds small enough that no single step outruns the time.
- ``PostgreSQLGuard``: each statement runs as the role ``FILTER_ROLE``, which holds no
  privilege (no table, no server file), with ``statement_timeout`` set to the time left and
  ``standard_conforming_strings`` on. The role and the settings are set again before every
  statement, so a filter that changed them (``set_config``) changed them for itself only.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import exc
from sqlalchemy.engine import Connection

from bolide.facade.errors import DeadLetterFilterError, StoreError

__all__ = ["FILTER_ROLE", "FilterGuard", "PostgreSQLGuard", "SQLiteGuard"]

#: The PostgreSQL role a filter runs as: NOLOGIN, granted nothing.
FILTER_ROLE = "bolide_filter"
#: SQLite virtual-machine steps between two looks at the clock.
_STEPS = 1_000
#: The least SQLite lets a filter's values grow to, in bytes.
_MIN_LENGTH = 16 * 1024 * 1024
#: SQLite's names for the JSON operators (json_extract, as an operator).
_OPERATORS = frozenset(("->", "->>"))


class FilterGuard:
    """How one database keeps a filter to the dead letters' columns and to its time.

    ``select_ids`` makes one per filtering: ``prepare`` on the fresh connection, ``enter`` once
    it is read-only, ``before`` each statement, ``refusal`` on a failure, ``leave`` at the end.
    """

    def __init__(self, functions: frozenset[str], timeout_ms: int) -> None:
        self.functions = functions
        self.timeout_ms = timeout_ms
        self.deadline = time.monotonic() + timeout_ms / 1000

    def prepare(self, conn: Connection) -> None:
        """Before the connection turns read-only."""

    def enter(self, conn: Connection) -> None:
        """Once the connection is read-only."""

    def before(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Before each statement of the filter, over ``rows``."""
        if self.left_ms() <= 0:
            raise self.too_long()

    def leave(self, conn: Connection) -> None:
        """After the last statement, or a failure."""

    def refusal(self, error: object) -> DeadLetterFilterError | None:
        """The filter error a database failure stands for, if it is the guard's doing."""
        return None

    def left_ms(self) -> int:
        return int((self.deadline - time.monotonic()) * 1000)

    def too_long(self) -> DeadLetterFilterError:
        return DeadLetterFilterError(
            f"where ran longer than where_timeout_ms={self.timeout_ms} and was stopped; "
            "nothing was chosen"
        )


class SQLiteGuard(FilterGuard):
    """An authorizer and a progress handler on the filter's ``sqlite3`` connection."""

    def __init__(self, functions: frozenset[str], timeout_ms: int) -> None:
        super().__init__(functions, timeout_ms)
        self.denied: list[str] = []

    def enter(self, conn: Connection) -> None:
        raw = _sqlite(conn)
        raw.set_authorizer(self.authorize)
        raw.set_progress_handler(self.stop, _STEPS)

    def leave(self, conn: Connection) -> None:
        raw = _sqlite(conn)
        raw.set_authorizer(None)
        raw.set_progress_handler(None, _STEPS)

    def before(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        super().before(conn, rows)
        # The clock is read between steps; one step building a huge value (nested replace())
        # would run past the time, and take the memory, unless values are kept small.
        sizes = (len(v) for r in rows for v in r.values() if isinstance(v, str | bytes))
        largest = max(sizes, default=0)
        _sqlite(conn).setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max(_MIN_LENGTH, 8 * largest))

    def stop(self) -> bool:
        """The progress handler: true (interrupt) once the time is up."""
        return time.monotonic() > self.deadline

    def authorize(
        self, action: int, first: str | None, second: str | None, db: str | None, _: str | None
    ) -> int:
        """Allow a SELECT and the filter's functions; deny (and note) anything else."""
        if action == sqlite3.SQLITE_SELECT:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION and second is not None:
            name = second.lower()
            if name in self.functions or name in _OPERATORS:
                return sqlite3.SQLITE_OK
            self.denied.append(f"function {second}()")
        elif action == sqlite3.SQLITE_READ:
            self.denied.append(f"table {first}" + (f" (column {second})" if second else ""))
        elif action == sqlite3.SQLITE_RECURSIVE:
            self.denied.append("a recursive query")
        elif action == sqlite3.SQLITE_PRAGMA:
            self.denied.append(f"pragma {first}")
        else:
            self.denied.append(f"action {action} ({first}, {second})")
        return sqlite3.SQLITE_DENY

    def refusal(self, error: object) -> DeadLetterFilterError | None:
        if not isinstance(error, sqlite3.DatabaseError):
            return None
        if self.denied:  # the statement was refused when prepared
            return _reaches(self.denied[0])
        code = getattr(error, "sqlite_errorcode", None)
        if code == sqlite3.SQLITE_INTERRUPT:
            return self.too_long()
        if code == sqlite3.SQLITE_TOOBIG:
            return DeadLetterFilterError(
                "where built a value larger than a filter may (the largest of the dead letters' "
                f"values times 8, at least {_MIN_LENGTH} bytes)"
            )
        return None


class PostgreSQLGuard(FilterGuard):
    """Every statement as ``FILTER_ROLE``, under ``statement_timeout``."""

    def prepare(self, conn: Connection) -> None:
        exists = conn.exec_driver_sql(
            "SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %(role)s", {"role": FILTER_ROLE}
        ).first()
        if exists is None:
            try:
                with conn.begin_nested():
                    conn.exec_driver_sql(f"CREATE ROLE {FILTER_ROLE} NOLOGIN")
                    # A user with CREATEROLE is not a member of the role it created.
                    conn.exec_driver_sql(f"GRANT {FILTER_ROLE} TO CURRENT_USER")
            except exc.DBAPIError as error:
                state = getattr(error.orig, "sqlstate", None)
                if state in ("42501", "25006"):  # insufficient_privilege, a read-only server
                    raise _no_role(conn, missing=True) from None
                if state not in ("42710", "23505"):  # created meanwhile by another filter
                    raise
        conn.commit()

    def before(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        super().before(conn, rows)
        try:
            conn.exec_driver_sql(f"SET LOCAL ROLE {FILTER_ROLE}")
        except exc.DBAPIError as error:
            if getattr(error.orig, "sqlstate", None) != "42501":
                raise
            raise _no_role(conn, missing=False) from None
        conn.exec_driver_sql(f"SET LOCAL statement_timeout = {max(1, self.left_ms())}")
        conn.exec_driver_sql("SET LOCAL standard_conforming_strings = on")

    def refusal(self, error: object) -> DeadLetterFilterError | None:
        state = getattr(error, "sqlstate", None)
        if state == "57014":  # query_canceled: the statement_timeout
            return self.too_long()
        # insufficient_privilege: what FILTER_ROLE may not do; undefined_table: a table the
        # role cannot see (no USAGE on its schema), or none at all: a filter names no table.
        if state in ("42501", "42P01"):
            return _reaches(str(error).strip().splitlines()[0])
        return None


def _sqlite(conn: Connection) -> sqlite3.Connection:
    raw: Any = conn.connection.dbapi_connection
    assert isinstance(raw, sqlite3.Connection)
    return raw


def _reaches(what: str) -> DeadLetterFilterError:
    return DeadLetterFilterError(
        f"where reaches beyond the dead letters' columns ({what}); a filter reads only them "
        "and calls only the functions listed in docs/dead-letters.md"
    )


def _no_role(conn: Connection, *, missing: bool) -> StoreError:
    """The error for a user that cannot run a filter as ``FILTER_ROLE``: what to run."""
    conn.rollback()
    user = conn.exec_driver_sql("SELECT current_user").scalar_one()
    grant = f"GRANT {FILTER_ROLE} TO {user}"
    if missing:
        why = f"does not exist, and {user} may not create it"
        fix = f"CREATE ROLE {FILTER_ROLE} NOLOGIN; {grant}"
    else:
        why = f"{user} may not SET ROLE to"
        fix = grant
    return StoreError(
        f"a where filter runs as the PostgreSQL role {FILTER_ROLE}, which {why}: as a "
        f"superuser, run {fix} (and grant {FILTER_ROLE} nothing else)"
    )
