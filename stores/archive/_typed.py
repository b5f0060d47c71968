"""Typed archive: the decoded fields of a stream as columns, queryable in plain SQL.

For a stream with an ``AvroSerde`` (or a ``ProtobufSerde``, a ``JsonSchemaSerde``: their
``value_schema`` describes their plain values in Avro's terms), each archived record also
becomes one row of a per-stream table, ``bolide_avro_<stream>`` (the prefix kept from when Avro
was the only format), keyed by ``(kafka_partition, kafka_offset)`` like the raw
archive, so that ``SELECT customer, sum(amount) FROM bolide_avro_orders WHERE country = 'FR'
GROUP BY customer`` works on SQLite and PostgreSQL.

Columns come from the schema each record was decoded with (its writer's schema, or the serde's
reader schema when it has one):

* fields of a primitive, enum, fixed or logical type, and unions of ``null`` with one of those,
  get a column of the matching SQL type;
* a field holding a record is flattened one level: ``address.city`` becomes
  ``address__city``; deeper records, arrays, maps and unions of several types are stored as
  JSON text (bytes as base64, dates and times in ISO 8601);
* a schema that is not a record gets one column, ``value``.

The table is data-driven (one per stream, its columns following the schemas met at run time),
so unlike bolide's own tables it is created and evolved here, with runtime DDL, and not by the
Alembic migrations: a new field adds a nullable column; nothing is ever dropped or altered. A
field whose SQL type changes (``int`` promoted to ``double``) gets a second column named
``<field>__<kind>`` so both the old and the new values stay. Writes are idempotent on the key.

Column names are compared as the database compares them: SQLite ignores ASCII case, and
PostgreSQL keeps 63 bytes of a name (longer names get a hash). A field whose name the database
would confuse with another field's column gets ``<field>__<kind>`` (then ``..._2``...).

A row the database refuses (PostgreSQL text cannot hold U+0000, which an Avro string can) is
left out of the typed table, reported, and kept in the raw archive; so are the rows of a batch
whose table cannot be created or widened (too many columns).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import exc
from sqlalchemy.engine import Connection

from bolide.facade.errors import SerializationError, StoreError
from bolide.facade.ports import FramedSerde, TypedSerde, decode_with
from bolide.facade.record import Record
from bolide.stores.archive._avro_columns import (
    SQL_TYPES,
    Field,
    fields_of,
    pick,
    storage_kind,
    storage_of,
    to_column,
)
from bolide.stores.dialects import describe_error, dialect_of, retriable
from bolide.stores.schema import MAX_IDENT, typed_table_name

__all__ = ["RejectHandler", "write_typed"]

log = logging.getLogger("bolide.stores.typed_archive")

_KEYS = ("kafka_partition", "kafka_offset")
_RESERVED = frozenset({*_KEYS, "timestamp_ms", "schema_id"})

#: ``fn(records, error)``: the database refused the typed rows of ``records`` (the raw archive
#: keeps them); ``error`` is a non-retriable ``StoreError`` that says why.
RejectHandler = Callable[[list[Record], StoreError], None]


def _ident(name: str) -> str:
    """``name``, or when longer than PostgreSQL keeps, a prefix of it and a hash of it."""
    raw = name.encode()
    if len(raw) <= MAX_IDENT:
        return name
    head = raw[: MAX_IDENT - 9].decode(errors="ignore")
    return f"{head}_{hashlib.sha1(raw).hexdigest()[:8]}"


# -- writing ----------------------------------------------------------------------------------


_KEY_COLUMNS: dict[str, str] = {
    "kafka_partition": "integer",
    "kafka_offset": "integer",
    "timestamp_ms": "integer",
    "schema_id": "integer",
}


def _key_table(table: str, *extra: sa.Column[Any]) -> sa.Table:
    return sa.Table(
        table,
        sa.MetaData(),
        sa.Column("kafka_partition", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("kafka_offset", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("timestamp_ms", sa.BigInteger, nullable=True),
        sa.Column("schema_id", sa.Integer, nullable=True),
        *extra,
    )


def _ensure_table(
    conn: Connection, table: str, wanted: set[tuple[str, str]]
) -> dict[tuple[str, str], str]:
    """Create or widen ``table`` so it stores every wanted ``(field name, kind)``.

    Returns:
        The column of each wanted pair: the field's own, or ``<name>__<storage>`` when the
        field's column already holds another SQL type.
    """
    columns, added, create = _plan_columns(conn, table, wanted)
    if not (added or create):
        return columns
    if dialect_of(conn).lock_for_ddl(conn, table):
        # Another archiver may have widened the table meanwhile: plan again.
        columns, added, create = _plan_columns(conn, table, wanted)
    if create:
        _key_table(table).create(conn)
    if added:
        operations = Operations(MigrationContext.configure(conn))
        for new_column in added:
            operations.add_column(table, new_column)
    return columns


def _plan_columns(
    conn: Connection, table: str, wanted: set[tuple[str, str]]
) -> tuple[dict[tuple[str, str], str], list[sa.Column[Any]], bool]:
    """The column of each wanted pair, the columns to add, and whether to create the table."""
    fold = dialect_of(conn).fold
    inspector = sa.inspect(conn)
    create = not inspector.has_table(table)
    if create:
        found = dict(_KEY_COLUMNS)
    else:
        found = {c["name"]: storage_of(c["type"]) for c in inspector.get_columns(table)}
    # As the database sees them: folded name -> (exact name, storage).
    existing = {fold(name): (name, storage) for name, storage in found.items()}
    owners: dict[str, str] = {}  # folded column -> the field of this batch that took it
    columns: dict[tuple[str, str], str] = {}
    added: list[sa.Column[Any]] = []
    # Sorted: the first kind of a name takes the plain column, in every process alike.
    for name, kind in sorted(wanted):
        storage = storage_kind(kind)
        for column in _candidates(name if name not in _RESERVED else f"{name}__value", storage):
            key = fold(column)
            if owners.get(key, name) != name:
                continue  # another field of this batch took it
            held = existing.get(key)
            if held is None:
                existing[key] = (column, storage)
                added.append(sa.Column(column, SQL_TYPES[kind], nullable=True))
                break
            if held == (column, storage):  # exactly this name, and values of this kind
                break
        owners[key] = name
        columns[(name, kind)] = column
    return columns, added, create


def _candidates(base: str, storage: str) -> Iterator[str]:
    """Column names for a field, in order of preference."""
    yield _ident(base)
    yield _ident(f"{base}__{storage}")
    for n in itertools.count(2):
        yield _ident(f"{base}__{storage}_{n}")


def write_typed(
    connection: Connection,
    stream: str,
    records: Sequence[Record],
    serde: TypedSerde,
    *,
    on_reject: RejectHandler | None = None,
    stored_as: str | None = None,
) -> int:
    """Write the decoded fields of ``records`` into the stream's typed table, inside the
    caller's transaction (the archiver's), beside the raw archive. Records that do not decode,
    and rows the database refuses (each in a savepoint, so the caller's transaction survives),
    are skipped with a warning: the raw archive keeps them.

    Args:
        connection: A connection in a transaction; DDL and rows commit or roll back with it.
        stream: The stream the records belong to.
        records: Records with ``partition`` and ``offset`` set.
        serde: The stream's serde (an ``AvroSerde``).
        on_reject: Told of the records whose rows the database refused (default: a warning).
        stored_as: The topic incarnation's key (``bolide.stores.incarnations``: a recreated
            topic's table is its own); by default the stream's name.

    Returns:
        How many rows were inserted (rows already present are skipped).

    Raises:
        StoreError: Retriable: the schema registry is away (nothing is skipped).
        sqlalchemy.exc.SQLAlchemyError: The database is away, busy or locked: retry the
            whole transaction.
    """
    rows = _decoded_rows(stream, records, serde)
    if not rows:
        return 0

    reject = on_reject if on_reject is not None else _warn
    table_name = typed_table_name(stored_as or stream)
    pairs = {(f.name, f.kind) for _, _, fields in rows.values() for f in fields}
    dialect_of(connection).begin(connection)  # savepoints nest inside it
    try:
        with connection.begin_nested():
            columns = _ensure_table(connection, table_name, pairs)
    except exc.SQLAlchemyError as error:
        if retriable(error, dialect_of(connection)):
            raise
        recs = [rec for rec, _, _ in rows.values()]
        reject(recs, _table_refused(stream, table_name, len(recs), error))
        return 0
    table, items = _table_rows(table_name, columns, rows)
    insert = (
        dialect_of(connection)
        .insert_ignoring(table, [table.c.kafka_partition, table.c.kafka_offset])
        .returning(table.c.kafka_offset)
    )

    def refused(rec: Record, error: exc.SQLAlchemyError) -> None:
        reject([rec], _row_refused(stream, rec, error))

    return _insert_isolating(connection, insert, items, refused)


def _warn(_records: list[Record], error: StoreError) -> None:
    log.warning("%s", error)


def _table_refused(stream: str, table: str, count: int, error: exc.SQLAlchemyError) -> StoreError:
    return StoreError(
        f"typed archive of {stream!r}: the database cannot create or widen {table}, {count} "
        f"records left out of it (the raw archive keeps them): {describe_error(error)}",
        stream=stream,
        retriable=False,
    )


def _row_refused(stream: str, rec: Record, error: exc.SQLAlchemyError) -> StoreError:
    return StoreError(
        f"typed archive of {stream!r}: the database refused the row at partition "
        f"{rec.partition}, offset {rec.offset} (the raw archive keeps the record): "
        f"{describe_error(error)}",
        stream=stream,
        partition=rec.partition,
        offset=rec.offset,
        retriable=False,
    )


_Decoded = dict[tuple[int, int], tuple[Record, dict[str, Any], list[Field]]]


def _decoded_rows(stream: str, records: Sequence[Record], serde: TypedSerde) -> _Decoded:
    """Each record's key columns and decoded value, by (partition, offset); records that do
    not decode are skipped with a warning (the raw archive keeps them).

    Raises:
        StoreError: Retriable: the schema registry is away (nothing is skipped).
    """
    rows: _Decoded = {}
    framed = serde if isinstance(serde, FramedSerde) else None
    decode = decode_with(serde)
    by_schema: dict[int, list[Field]] = {}
    skipped = 0
    for rec in records:
        if rec.partition is None or rec.offset is None:
            raise ValueError(f"records: {rec!r} has no partition/offset")
        if rec.data is None:
            continue  # a tombstone has no typed row: the raw archive keeps it
        try:
            if framed is not None:  # the schema id may be in a header
                schema_id = framed.payload_schema_id(rec.data, rec.headers, stream)
            else:
                schema_id = serde.payload_schema_id(rec.data)
            decoded = decode(rec, stream)
            value = serde.plain(decoded)
            fields = by_schema.get(schema_id)
            if fields is None:
                fields = by_schema[schema_id] = fields_of(serde.value_schema(schema_id))
        except SerializationError as failure:
            if failure.retriable:  # the schema registry is away: retry the batch, skip nothing
                raise StoreError(
                    f"typed archive of {stream!r}: {failure}", stream=stream, retriable=True
                ) from failure
            skipped += 1
            log.debug("typed archive of %r skips a record: %s", stream, failure)
            continue
        key_row = {
            "kafka_partition": rec.partition,
            "kafka_offset": rec.offset,
            "timestamp_ms": rec.timestamp_ms,
            "schema_id": schema_id,
            "value": value,
        }
        rows.setdefault((rec.partition, rec.offset), (rec, key_row, fields))
    if skipped:
        log.warning("typed archive of %r skipped %d records that do not decode", stream, skipped)
    return rows


def _table_rows(
    table_name: str, columns: dict[tuple[str, str], str], rows: _Decoded
) -> tuple[sa.Table, list[tuple[Record, dict[str, Any]]]]:
    """The typed table as it stands, and each record's row for it (absent fields NULL)."""
    types = {column: SQL_TYPES[kind] for (_, kind), column in columns.items()}
    items: list[tuple[Record, dict[str, Any]]] = []
    for rec, row, fields in rows.values():
        value = row.pop("value")
        out = dict.fromkeys(types) | row
        for f in fields:
            out[columns[(f.name, f.kind)]] = to_column(pick(value, f.path), f.kind)
        items.append((rec, out))
    table = _key_table(table_name, *(sa.Column(c, t) for c, t in sorted(types.items())))
    return table, items


def _insert_isolating(
    conn: Connection,
    insert: Any,
    items: list[tuple[Record, dict[str, Any]]],
    refused: Callable[[Record, exc.SQLAlchemyError], None],
) -> int:
    """Insert the rows in a savepoint; when the database refuses them, halve the batch until
    the refused rows stand alone, and leave them out. Return how many rows are new."""
    try:
        with conn.begin_nested():
            return len(conn.execute(insert, [row for _, row in items]).all())
    except exc.SQLAlchemyError as error:
        if retriable(error, dialect_of(conn)):
            raise
        if len(items) == 1:
            refused(items[0][0], error)
            return 0
    half = len(items) // 2
    return _insert_isolating(conn, insert, items[:half], refused) + _insert_isolating(
        conn, insert, items[half:], refused
    )
