"""``where`` filters over dead letters: one read-only SQL expression, run by the store's database.

A filter is run as ``WITH dead_letters AS (<the rows, as bound values>) SELECT id FROM
dead_letters WHERE (<filter>)``: the rows are bound values, not a table, so dead letters still
only in Kafka are filtered exactly like archived ones. Two things stand in its way:

- here, a check of its text, as a first and friendly refusal: one expression (no ``;``, no
  comment, no parenthesis closed that it did not open, no subquery, no statement keyword, no
  bound-parameter marker, only the functions of ``FUNCTIONS``). It reads the text as one lexer
  would; a database may read it otherwise, so it is not what keeps the filter in bounds.
- the database itself, which does: a connection of its own in read-only mode (the dialect's
  ``read_only``) and the dialect's ``filter_guard`` (``dialects._filter_guards``), under which
  the filter reads none of the database's tables, and stops after ``WHERE_TIMEOUT_MS``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.pool import NullPool

from bolide.facade.errors import DeadLetterFilterError
from bolide.stores.dialects import FilterGuard, SqlDialect, describe_error, dialect_of

__all__ = ["COLUMNS", "FUNCTIONS", "WHERE_TIMEOUT_MS", "check_filter", "select_ids"]

_TEXT, _INT, _BYTES = sa.Text(), sa.BigInteger(), sa.LargeBinary()

#: The columns a filter may use: name, SQL type, meaning (docs/dead-letters.md lists them).
COLUMNS: tuple[tuple[str, Any, str], ...] = (
    ("id", _TEXT, "the dead letter's id, <stream>/<partition>/<offset>"),
    ("stream", _TEXT, "the dead-letter stream"),
    ("kafka_partition", _INT, "the dead letter's partition"),
    ("kafka_offset", _INT, "the dead letter's offset"),
    ("timestamp_ms", _INT, "the dead letter's timestamp, epoch milliseconds"),
    ("key", _BYTES, "the Kafka key (bytes)"),
    ("payload", _BYTES, "the value (bytes; NULL for a tombstone)"),
    ("key_text", _TEXT, "the key as UTF-8 text, NULL when it is not"),
    ("payload_text", _TEXT, "the value as UTF-8 text, NULL when it is not"),
    ("reason", _TEXT, "bolide.reason: failed, undecodable, rejected, timeout..."),
    ("detail", _TEXT, "bolide.reason.detail"),
    ("source", _TEXT, "bolide.source, <stream>/<partition>/<offset>"),
    ("source_stream", _TEXT, "the stream part of bolide.source"),
    ("source_partition", _INT, "the partition part of bolide.source"),
    ("source_offset", _INT, "the offset part of bolide.source"),
    ("archived", _INT, "1 when the history store holds it, else 0"),
    ("replayed", _INT, "1 when a replay has published it (to any stream), else 0"),
)
COLUMN_NAMES = tuple(name for name, _, _ in COLUMNS)

# fmt: off
#: Functions a filter may call (both databases' common ones, and a few of each).
FUNCTIONS = frozenset((
    "abs", "cast", "coalesce", "concat", "convert_from", "date", "date_part", "datetime",
    "encode", "extract", "glob", "hex", "ifnull", "instr", "json_extract", "julianday", "left",
    "length", "like", "lower", "lpad", "ltrim", "nullif", "octet_length", "position", "replace",
    "right", "round", "rpad", "rtrim", "strftime", "strpos", "substr", "substring",
    "to_timestamp", "trim", "typeof", "unicode", "unixepoch", "upper",
))
#: Words that may stand before a parenthesis without being a function call.
_OPERATORS = frozenset((
    "and", "or", "not", "in", "is", "like", "ilike", "glob", "between", "when", "then", "else",
    "case", "escape",
))
#: Type names, which take a length in parentheses inside CAST.
_TYPES = frozenset(("varchar", "char", "character", "numeric", "decimal"))
#: Words that only a statement or a subquery holds.
_STATEMENT = frozenset((
    "select", "with", "values", "table", "union", "intersect", "except", "insert", "update",
    "delete", "merge", "upsert", "drop", "create", "alter", "truncate", "attach", "detach",
    "pragma", "commit", "rollback", "begin", "savepoint", "release", "grant", "revoke", "copy",
    "returning", "vacuum", "reindex", "analyze", "execute", "call", "do", "lock", "set", "reset",
    "show", "listen", "notify", "prepare", "deallocate", "declare", "fetch", "into", "exists",
))
# fmt: on
_MAX_LENGTH = 4_000
#: How long all the statements of one filtering may run, in milliseconds.
WHERE_TIMEOUT_MS = 30_000
#: Rows per statement: SQLite allows 500 SELECTs in one compound.
_CHUNK = 200
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_filter(where: object) -> str:
    """The filter, stripped, once its text is one expression this module lets through.

    Raises:
        TypeError: ``where`` is not a str.
        DeadLetterFilterError: It is empty, too long, or not one expression (the message says
            what was found).
    """
    if not isinstance(where, str):
        raise TypeError(f"where must be a str (an SQL expression), not {type(where).__name__}")
    text = where.strip()
    if not text:
        raise DeadLetterFilterError(
            "where is empty: give an SQL expression, e.g. reason = 'failed'"
        )
    if len(text) > _MAX_LENGTH:
        raise DeadLetterFilterError(f"where is longer than {_MAX_LENGTH} characters")
    _Scanner(text).run()
    return text


class _Scanner:
    """Walks a filter's text once: literals, quoted names, words, parentheses."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0
        self.depth = 0

    def refuse(self, why: str) -> DeadLetterFilterError:
        return DeadLetterFilterError(
            f"where is not one read-only SQL expression: {why} (at character {self.at + 1})"
        )

    def run(self) -> None:
        text = self.text
        while self.at < len(text):
            char = text[self.at]
            if char == "'":
                self._literal()
            elif char == '"':
                self._quoted()
            elif text.startswith(("--", "/*"), self.at):
                raise self.refuse("a comment")
            elif char == ";":
                raise self.refuse("';' ends a statement")
            elif char == ":" and text.startswith("::", self.at):
                self.at += 2  # PostgreSQL's cast; a lone ':' would be a bound parameter
            elif char in "$?:\\":
                raise self.refuse(f"{char!r} outside a literal")
            elif char == "(":
                self.depth += 1
                self.at += 1
            elif char == ")":
                if self.depth == 0:
                    raise self.refuse("')' closes a parenthesis the filter did not open")
                self.depth -= 1
                self.at += 1
            elif _WORD.match(text, self.at):
                self._word()
            else:
                self.at += 1
        if self.depth:
            raise self.refuse("a parenthesis is not closed")

    def _literal(self) -> None:
        start = self.at
        while start > 0 and (self.text[start - 1].isalnum() or self.text[start - 1] == "_"):
            start -= 1
        if self.text[start : self.at].lower() == "e":
            # E'...' takes backslash escapes: its end is not where the '' rule puts it.
            raise self.refuse("an escape-string literal (E'...')")
        self._closing("'", "a literal")

    def _quoted(self) -> None:
        start = self.at
        self._closing('"', "a quoted name")
        name = self.text[start + 1 : self.at - 1].replace('""', '"')
        self._check_call(name)

    def _closing(self, quote: str, what: str) -> None:
        end = self.at + 1
        text = self.text
        while True:
            end = text.find(quote, end)
            if end < 0:
                raise self.refuse(f"{what} is not closed")
            if text.startswith(quote * 2, end):
                end += 2
                continue
            self.at = end + 1
            return

    def _word(self) -> None:
        match = _WORD.match(self.text, self.at)
        assert match is not None
        word = match.group(0)
        if word.lower() in _STATEMENT:
            raise self.refuse(f"{word.upper()} belongs to a statement or a subquery")
        self.at = match.end()
        self._check_call(word)

    def _check_call(self, name: str) -> None:
        rest = self.text[self.at :].lstrip()
        lowered = name.lower()
        if not rest.startswith("(") or lowered in _OPERATORS or lowered in _TYPES:
            return
        if lowered not in FUNCTIONS:
            raise self.refuse(
                f"function {name}() is not one a filter may call ({', '.join(sorted(FUNCTIONS))})"
            )


def _cell(value: Any, type_: Any) -> Any:
    return sa.cast(sa.literal(value, type_), type_)


def _statement(expression: str, rows: Sequence[Mapping[str, Any]]) -> Any:
    """``WITH dead_letters AS (rows) SELECT id FROM dead_letters WHERE (expression)``.

    The expression goes in as it is (``literal_column``): ``text()`` would take a ``:word``
    inside one of its literals for a bound parameter.
    """
    selects = [
        sa.select(*[_cell(row[name], type_).label(name) for name, type_, _ in COLUMNS])
        for row in rows
    ]
    body = selects[0] if len(selects) == 1 else sa.union_all(*selects)
    table = body.cte("dead_letters")
    return sa.select(table.c.id).where(sa.literal_column(f"({expression})", sa.Boolean()))


def _blank() -> dict[str, Any]:
    return dict.fromkeys(COLUMN_NAMES)


def _batches(rows: Iterable[Mapping[str, Any]]) -> Iterator[Sequence[Mapping[str, Any]]]:
    """A row of NULLs first (so a filter the database refuses is refused even with no rows),
    then ``rows`` by ``_CHUNK``."""
    yield [_blank()]
    batch: list[Mapping[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) == _CHUNK:
            yield batch
            batch = []
    if batch:
        yield batch


def select_ids(
    url: sa.URL,
    expression: str,
    rows: Iterable[Mapping[str, Any]],
    *,
    timeout_ms: int = WHERE_TIMEOUT_MS,
) -> set[str]:
    """The ids of ``rows`` (dicts keyed by ``COLUMN_NAMES``) for which ``expression`` is true,
    asked of the database at ``url`` on a connection of its own (closed afterwards, never
    pooled), read-only and guarded by the database (``dialects._filter_guards``): the filter
    reads only the rows' columns, and all of its statements together stop after ``timeout_ms``.

    Raises:
        DeadLetterFilterError: The database refused the expression, it tried a change, it
            reached beyond the rows' columns, or it ran longer than ``timeout_ms``.
        StoreError: On PostgreSQL, the connecting user cannot run a filter as
            ``FILTER_ROLE`` (the message names the grant).
    """
    dialect = dialect_of(url)
    guard = dialect.filter_guard(FUNCTIONS, timeout_ms)
    engine = sa.create_engine(url, poolclass=NullPool)
    chosen: set[str] = set()
    try:
        with engine.connect() as conn:
            guard.prepare(conn)
            dialect.read_only(conn)
            guard.enter(conn)
            try:
                for batch in _batches(rows):
                    guard.before(conn, batch)
                    found = conn.execute(_statement(expression, batch)).scalars()
                    chosen |= {str(i) for i in found if i is not None}
            finally:
                guard.leave(conn)
    except exc.SQLAlchemyError as error:
        raise _refused(error, dialect, guard, expression) from None
    finally:
        engine.dispose()
    return chosen


def _refused(
    error: exc.SQLAlchemyError, dialect: SqlDialect, guard: FilterGuard, expression: str
) -> DeadLetterFilterError:
    detail = error.orig if isinstance(error, exc.DBAPIError) else error
    stopped = guard.refusal(detail)
    if stopped is not None:
        return stopped
    if dialect.refused_change(detail):
        return DeadLetterFilterError("where tried to change data: a filter only reads")
    if dialect.refused_several(detail):
        return DeadLetterFilterError("where must be one expression, not statements")
    return DeadLetterFilterError(
        f"the database refused where {expression!r}: {describe_error(error)} (the columns: "
        f"{', '.join(COLUMN_NAMES)})"
    )
