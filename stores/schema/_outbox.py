"""The outbox tables as SQLAlchemy Core objects (revision ``0007``), and how a row keeps a
record: its lane (the ordering key) and its headers.

They live on the schema's one ``metadata`` so that ``alembic check`` compares them too.
"""

from __future__ import annotations

import hashlib
import struct

import sqlalchemy as sa

from bolide.facade.record import Headers
from bolide.stores.schema._metadata import metadata

__all__ = ["OUTBOX", "OUTBOX_RELAYS", "lane_of", "pack_headers", "unpack_headers"]

#: One row per record added: pending while ``sent_ms`` is NULL. ``lane`` (a hash of the stream
#: and the key) is the unit of order: a lane's rows are published in id order, which is their
#: commit order. ``relay``/``batch``: a transactional relay's claim, until the row is sent.
OUTBOX = sa.Table(
    "bolide_outbox",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True),
    sa.Column("stream", sa.String(255), nullable=False),
    sa.Column("lane", sa.BigInteger, nullable=False),
    # Asked for by the record (Record(partition=...)); once sent, where it went.
    sa.Column("kafka_partition", sa.Integer, nullable=True),
    sa.Column("key", sa.LargeBinary, nullable=True),
    sa.Column("payload", sa.LargeBinary, nullable=True),  # NULL: a tombstone
    sa.Column("headers", sa.LargeBinary, nullable=True),  # pack_headers; NULL: none
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("sent_ms", sa.BigInteger, nullable=True),
    sa.Column("kafka_offset", sa.BigInteger, nullable=True),
    sa.Column("relay", sa.String(255), nullable=True),
    sa.Column("batch", sa.BigInteger, nullable=True),
    sa.PrimaryKeyConstraint("id", name="pk_bolide_outbox"),
    # Partial: they hold the pending rows only, however long the sent ones are kept.
    sa.Index(
        "ix_bolide_outbox_pending",
        "id",
        postgresql_where=sa.text("sent_ms IS NULL"),
        sqlite_where=sa.text("sent_ms IS NULL"),
    ),
    sa.Index(
        "ix_bolide_outbox_lane",
        "lane",
        "id",
        postgresql_where=sa.text("sent_ms IS NULL"),
        sqlite_where=sa.text("sent_ms IS NULL"),
    ),
)

#: One row per transactional relay id: its epoch (bumped by every start, which fences the
#: previous holder of the id) and the last batch number it claimed.
OUTBOX_RELAYS = sa.Table(
    "bolide_outbox_relays",
    metadata,
    sa.Column("relay", sa.String(255), nullable=False),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("batch", sa.BigInteger, nullable=False),
    sa.Column("updated_ms", sa.BigInteger, nullable=False),
    sa.PrimaryKeyConstraint("relay", name="pk_bolide_outbox_relays"),
)

_LENGTH = struct.Struct(">I")


def lane_of(stream: str, key: bytes | None) -> int:
    """The lane of a record: a signed 64-bit hash of its stream and Kafka key (a keyless
    record's lane is its stream's). Two keys hashing alike only share their order."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(stream.encode())
    digest.update(b"\x00-" if key is None else b"\x00k" + key)
    return int.from_bytes(digest.digest(), "big", signed=True)


def pack_headers(headers: Headers) -> bytes | None:
    """Headers as one value: per pair, the name's and the value's lengths and bytes (order
    and repeated names kept); ``None`` for no headers."""
    if not headers:
        return None
    parts: list[bytes] = []
    for name, value in headers:
        encoded = name.encode()
        parts += [_LENGTH.pack(len(encoded)), encoded, _LENGTH.pack(len(value)), value]
    return b"".join(parts)


def unpack_headers(blob: bytes | None) -> Headers:
    """The headers ``pack_headers`` stored."""
    if not blob:
        return []
    data = bytes(blob)
    out: Headers = []
    at = 0
    while at < len(data):
        (size,) = _LENGTH.unpack_from(data, at)
        name = data[at + 4 : at + 4 + size].decode()
        at += 4 + size
        (size,) = _LENGTH.unpack_from(data, at)
        out.append((name, data[at + 4 : at + 4 + size]))
        at += 4 + size
    return out
