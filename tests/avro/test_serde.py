"""AvroSerde: wire format, round trips, evolution and bad payloads (in-process registry)."""

from __future__ import annotations

import struct
from io import BytesIO
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st

from bolide.facade.errors import SchemaIncompatibleError, SchemaNotFoundError, SerializationError
from bolide.facade.schemas.avro import AvroSerde, default_registry
from bolide.facade.schemas.registry import ConfluentSchemaRegistry, MemorySchemaRegistry
from tests.avro.conftest import ORDER_V1, ORDER_V2, ORDER_V3, order


@pytest.fixture
def registry() -> MemorySchemaRegistry:
    return MemorySchemaRegistry()


def test_wire_format_is_magic_byte_id_and_fastavro_body(registry: MemorySchemaRegistry) -> None:
    serde = AvroSerde(ORDER_V1, registry=registry)
    data = serde.encode(order(7), stream="orders")
    schema_id = registry.latest("orders-value").schema_id  # type: ignore[union-attr]
    body = BytesIO()
    schemaless_writer(body, parse_schema(ORDER_V1), order(7))
    assert data == b"\x00" + struct.pack(">I", schema_id) + body.getvalue()
    assert serde.decode(data, stream="orders", partition=0, offset=3) == order(7)
    assert serde.schema_id("orders") == schema_id


def test_subject_follows_the_stream_unless_given(registry: MemorySchemaRegistry) -> None:
    serde = AvroSerde(ORDER_V1, registry=registry)
    serde.encode(order(1), stream="a")
    serde.encode(order(1), stream="b")
    assert registry.latest("a-value") is not None
    assert registry.latest("b-value") is not None
    fixed = AvroSerde(ORDER_V1, registry=registry, subject="shop.Order")
    assert fixed.subject_for("a") == "shop.Order"
    fixed.encode(order(1), stream="a")
    # One schema, one global id, whatever the subject.
    assert registry.latest("shop.Order").schema_id == registry.latest("a-value").schema_id  # type: ignore[union-attr]


def test_default_registry_is_shared_within_the_process() -> None:
    writer = AvroSerde(ORDER_V1)
    reader = AvroSerde(ORDER_V1)
    assert writer.registry is reader.registry is default_registry()
    data = writer.encode(order(2), stream="default-registry-stream")
    assert reader.decode(data, stream="default-registry-stream") == order(2)


def _registry_extra() -> bool:
    try:
        import confluent_kafka.schema_registry  # noqa: F401 - only checks the extra is installed
    except ImportError:
        return False
    return True


def test_registry_from_url_and_bad_registry() -> None:
    if _registry_extra():
        registry = AvroSerde("string", registry="mock://t").registry
        assert isinstance(registry, ConfluentSchemaRegistry)
    else:  # the floor run installs no registry extra: the error names it
        with pytest.raises(ImportError, match=r"bolide\[registry\]"):
            AvroSerde("string", registry="mock://t")
    with pytest.raises(TypeError, match="registry must be"):
        AvroSerde("string", registry=42)
    with pytest.raises(SerializationError, match="invalid Avro schema"):
        AvroSerde({"type": "record", "name": "R", "fields": [{"name": "a", "type": "nope"}]})
    with pytest.raises(ValueError, match="subject"):
        AvroSerde("string", subject="")


def test_primitive_schema_round_trip(registry: MemorySchemaRegistry) -> None:
    serde = AvroSerde('"string"', registry=registry)
    assert serde.decode(serde.encode("héllo", stream="s"), stream="s") == "héllo"


def test_value_that_does_not_fit_raises_naming_the_stream(registry: MemorySchemaRegistry) -> None:
    serde = AvroSerde(ORDER_V1, registry=registry)
    with pytest.raises(SerializationError, match="stream 'orders'") as info:
        serde.encode({**order(1), "amount": "a lot"}, stream="orders")
    assert info.value.stream == "orders"
    with pytest.raises(SerializationError):
        serde.encode(None, stream="orders")


# -- evolution ----------------------------------------------------------------------------------


def test_reader_schema_reads_older_and_newer_writers(registry: MemorySchemaRegistry) -> None:
    v1 = AvroSerde(ORDER_V1, registry=registry)
    v2 = AvroSerde(ORDER_V2, registry=registry)
    old = v1.encode(order(1), stream="o")
    new = v2.encode(order(2, country="DE"), stream="o")
    as_v2 = AvroSerde(ORDER_V2, registry=registry, reader_schema=ORDER_V2)
    assert as_v2.decode(old, stream="o") == order(1, country="FR")  # the default fills in
    assert as_v2.decode(new, stream="o") == order(2, country="DE")
    as_v1 = AvroSerde(ORDER_V1, registry=registry, reader_schema=ORDER_V1)
    assert as_v1.decode(new, stream="o") == order(2)  # the newer field is skipped
    # Without a reader schema each record keeps its writer's shape, as Confluent's does.
    assert v2.decode(old, stream="o") == order(1)


def test_removed_field_and_unreadable_writer(registry: MemorySchemaRegistry) -> None:
    AvroSerde(ORDER_V2, registry=registry).encode(order(1, country="FR"), stream="o")
    v3 = AvroSerde(ORDER_V3, registry=registry)
    data = v3.encode({k: v for k, v in order(3, country="IT").items() if k != "tags"}, stream="o")
    as_v2 = AvroSerde(ORDER_V2, registry=registry, reader_schema=ORDER_V2)
    with pytest.raises(SerializationError, match="reader field 'tags' has no default") as info:
        as_v2.decode(data, stream="o", partition=1, offset=9)
    assert (info.value.stream, info.value.partition, info.value.offset) == ("o", 1, 9)


def test_incompatible_schema_is_refused_with_the_reason(registry: MemorySchemaRegistry) -> None:
    AvroSerde(ORDER_V1, registry=registry).encode(order(1), stream="o")
    changed = {
        **ORDER_V1,
        "fields": [
            {"name": "amount", "type": "string"} if f["name"] == "amount" else f
            for f in ORDER_V1["fields"]
        ],
    }
    with pytest.raises(SchemaIncompatibleError) as info:
        AvroSerde(changed, registry=registry).encode({**order(1), "amount": "1"}, stream="o")
    assert info.value.subject == "o-value"
    assert info.value.stream == "o"
    assert info.value.reasons == [
        "new schema cannot read old data: /amount: double cannot be read as string"
    ]
    assert isinstance(info.value, SerializationError)


# -- bad payloads -------------------------------------------------------------------------------


def _serde_and_payload() -> tuple[AvroSerde, bytes]:
    serde = AvroSerde(ORDER_V1, registry=MemorySchemaRegistry())
    return serde, serde.encode(order(5), stream="s")


@pytest.mark.parametrize(
    ("mangle", "reason"),
    [
        (lambda d: b"", "too short"),
        (lambda d: d[:3], "too short"),
        (lambda d: d[:-1], "EOFError"),
        (lambda d: b"\x01" + d[1:], "magic byte 1"),
        (lambda d: d[:1] + struct.pack(">I", 999) + d[5:], "schema id 999 is not registered"),
        (lambda d: d + b"\x00", "trailing bytes"),
    ],
    ids=["empty", "short header", "truncated body", "magic byte", "unknown id", "trailing"],
)
def test_bad_payload_names_stream_partition_offset(mangle: Any, reason: str) -> None:
    serde, data = _serde_and_payload()
    with pytest.raises(SerializationError, match=reason) as info:
        serde.decode(mangle(data), stream="s", partition=2, offset=41)
    err = info.value
    assert (err.stream, err.partition, err.offset) == ("s", 2, 41)
    assert "stream 's' at partition 2, offset 41" in str(err)


def test_unknown_id_is_a_schema_not_found_error() -> None:
    serde, data = _serde_and_payload()
    with pytest.raises(SchemaNotFoundError):
        serde.decode(b"\x00\x00\x00\x10\x00" + data[5:], stream="s")
    assert serde.decode(data, stream="s") == order(5)  # still fine afterwards


def test_non_bytes_payload_is_a_serialization_error() -> None:
    serde, _ = _serde_and_payload()
    for bad in (None, "text", 12):
        with pytest.raises(SerializationError):
            serde.decode(bad, stream="s")  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_never_escape_as_another_error(data: bytes) -> None:
    serde, _ = _serde_and_payload()
    try:
        serde.decode(data, stream="s", partition=0, offset=1)
    except SerializationError as err:
        assert err.offset == 1


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=48))
def test_random_bodies_after_a_valid_header_never_escape(body: bytes) -> None:
    serde, data = _serde_and_payload()
    try:
        serde.decode(data[:5] + body, stream="s", partition=0, offset=1)
    except SerializationError as err:
        assert err.stream == "s"


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 10_000), st.data())
def test_every_truncation_and_magic_byte_fails(n: int, data: st.DataObject) -> None:
    serde = AvroSerde(ORDER_V2, registry=MemorySchemaRegistry())
    payload = serde.encode(order(n, country="X" * (n % 7)), stream="s")
    cut = data.draw(st.integers(0, len(payload) - 1))
    with pytest.raises(SerializationError):
        serde.decode(payload[:cut], stream="s")
    magic = data.draw(st.integers(1, 255))
    with pytest.raises(SerializationError, match="magic byte"):
        serde.decode(bytes([magic]) + payload[1:], stream="s")


def test_fastavro_fast_path_is_in_use_and_agrees_with_its_public_fallback(
    registry: MemorySchemaRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fast path calls fastavro's private encoder and decoder; the fallback its public
    # schemaless_writer/reader. A fastavro release that changes the private ones fails here
    # (the probe at import would then have chosen the fallback, which must give equal bytes).
    from bolide.facade.schemas import avro as serde
    from bolide.facade.schemas import avro_codec as codec

    assert codec.FAST, "fastavro's private encoder no longer agrees with its public one"
    fast = AvroSerde(ORDER_V1, registry=registry)
    encoded = [fast.encode(order(n), stream="orders") for n in range(3)]
    newer = AvroSerde(ORDER_V2, registry=registry, reader_schema=ORDER_V2)
    read_fast = [newer.decode(data, stream="orders") for data in encoded]
    monkeypatch.setattr(serde, "write_data", codec._public_write)
    monkeypatch.setattr(serde, "read_data", codec._public_read)
    assert [fast.encode(order(n), stream="orders") for n in range(3)] == encoded
    assert [newer.decode(data, stream="orders") for data in encoded] == read_fast
    assert read_fast[0] != order(0)  # the reader's schema resolved (a v2 default filled in)
