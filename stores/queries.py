"""One SQL statement over the history store, read-only unless asked: ``bolide sql`` and the
console's query form run it here.

The database itself refuses what must not run (several statements in one, any change on a
read-only session, a statement past its time limit): no parsing of the query is trusted. A
read-only session never goes back to the pool, so its settings cannot leak into the store's
own work.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc

from bolide.facade.errors import StoreError
from bolide.stores.store import SqlStore

__all__ = ["QueryResult", "run_query"]


@dataclass(frozen=True)
class QueryResult:
    """What a statement returned.

    Attributes:
        columns: The result's column names (none for a statement without rows).
        rows: The rows, at most the ``max_rows`` asked for.
        truncated: More rows were there than ``max_rows``.
        changed: Rows a write changed (``None`` for a query with rows).
        elapsed_s: How long it ran.
    """

    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    truncated: bool
    changed: int | None
    elapsed_s: float


def run_query(
    store: SqlStore,
    query: str,
    params: Mapping[str, Any] | None = None,
    *,
    write: bool = False,
    timeout_ms: int | None = None,
    max_rows: int | None = None,
    read_only_hint: str = "the query runs read-only",
) -> QueryResult:
    """Run ``query`` on ``store``: one statement (with ``params``, its ``:name``
    placeholders bound from them, else sent as written), read-only unless ``write`` (then
    committed), stopped after ``timeout_ms``; at most ``max_rows`` rows are kept (psycopg
    reads a result whole: on PostgreSQL the time limit is what bounds it).
    ``read_only_hint`` follows the database's refusal of a change.

    Raises:
        ValueError: The query holds several statements.
        StoreError: The database refused it (a change on a read-only session says to pass
            ``write``), it ran past ``timeout_ms``, or the database failed.
    """
    dialect = store.sql_dialect
    started = time.monotonic()
    try:
        with store.engine.connect() as conn:
            try:
                dialect.one_statement(conn)
                if not write:
                    dialect.read_only(conn)
                if timeout_ms is not None:
                    dialect.time_limit(conn, timeout_ms)
                if params is None:
                    result = conn.exec_driver_sql(query)
                else:
                    result = conn.execute(sa.text(query), dict(params))
                if result.returns_rows:
                    columns = tuple(result.keys())
                    fetched = result.fetchmany(max_rows + 1) if max_rows is not None else None
                    rows = [tuple(r) for r in (fetched if fetched is not None else result)]
                    changed = None
                else:
                    columns, rows, changed = (), [], result.rowcount
                if write:
                    conn.commit()
            finally:
                if not write or timeout_ms is not None:
                    conn.invalidate()  # its session settings never go back to the pool
    except exc.SQLAlchemyError as error:
        detail = error.orig if isinstance(error, exc.DBAPIError) else error
        if dialect.refused_several(detail):
            raise ValueError("the query must be one statement") from None
        if dialect.timed_out(detail):
            raise StoreError(f"query stopped after {timeout_ms} ms (its time limit)") from None
        hint = f"; {read_only_hint}" if dialect.refused_change(detail) else ""
        raise StoreError(f"query failed: {store.scrub(str(detail)).strip()}{hint}") from None
    truncated = max_rows is not None and len(rows) > max_rows
    return QueryResult(columns, rows[:max_rows], truncated, changed, time.monotonic() - started)
