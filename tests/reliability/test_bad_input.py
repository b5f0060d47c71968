"""Bad input: every decoder and parser bolide owns, fuzzed with hypothesis.

Each one must either accept its input or refuse it with the documented typed error, never
crash with anything else. ``max_examples`` stays modest so the suite fits its CI budget.
"""

from __future__ import annotations

import contextlib
import io
import math
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bolide.cli.main import build_parser
from bolide.facade import (
    AvroSerde,
    Cluster,
    InitialOffsetScheme,
    MemorySchemaRegistry,
    PublisherConfig,
    Record,
    Resequencer,
    ResequencerFullError,
    SerializationError,
    StreamConfig,
    SubscriberConfig,
)
from bolide.facade.record import normalize_headers
from bolide.facade.resequencer.sequence import (
    NUMBER_HEADER,
    SEQUENCE_GROUP_HEADER,
    SIZE_HEADER,
    Invalid,
    Sequence,
    parse_sequence,
    scan_sequence,
)

pytestmark = pytest.mark.reliability

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

anything = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)  # fmt: skip


# -- headers ---------------------------------------------------------------------------------


@FUZZ
@given(headers=anything | st.lists(st.tuples(anything, anything), max_size=4))
def test_normalize_headers_accepts_or_raises_type_error(headers: object) -> None:
    try:
        out = normalize_headers(headers)  # type: ignore[arg-type]
    except TypeError:
        return
    assert isinstance(out, list)
    assert all(isinstance(n, str) and isinstance(v, bytes) for n, v in out)


@FUZZ
@given(
    data=anything,
    key=anything,
    headers=st.none() | st.dictionaries(st.text(max_size=5), st.binary(max_size=5)),
    group=anything,
)
def test_record_refuses_bad_fields_with_typed_errors(data, key, headers, group) -> None:
    try:
        record = Record(data, key=key, headers=headers, group=group)
    except (TypeError, ValueError):
        return
    assert record.data is None or isinstance(record.data, bytes)  # None: a tombstone
    assert record.key is None or isinstance(record.key, bytes)


# -- resequencing headers ----------------------------------------------------------------------

seq_value = (
    st.binary(max_size=24)
    | st.integers(-(10**30), 10**30).map(lambda n: str(n).encode())
    | st.sampled_from([b"", b"-", b"-0", b"0", b"1", b"\xff", "٣".encode(), b" 1", b"1e3"])
)
seq_headers = st.lists(
    st.tuples(
        st.sampled_from([SEQUENCE_GROUP_HEADER, SIZE_HEADER, NUMBER_HEADER, "other"]),
        seq_value,
    ),
    max_size=6,
)


def _record(headers: list[tuple[str, bytes]], offset: int) -> Record:
    record = Record(b"x", headers=headers)
    record.partition = 0
    record.offset = offset
    return record


@FUZZ
@given(headers=seq_headers)
def test_sequence_headers_parse_without_raising(headers) -> None:
    record = _record(headers, 0)
    parsed = parse_sequence(record)
    assert parsed is None or isinstance(parsed, Sequence | Invalid)
    scanned = scan_sequence(record)
    if isinstance(parsed, Sequence):
        assert scanned == (parsed.group.encode(), parsed.size, parsed.number)
    elif parsed is None:
        assert scanned is None
    elif isinstance(scanned, tuple):
        # The fast path leaves UTF-8 checks of the group to parse_sequence, nothing else.
        assert isinstance(parsed, Invalid) and parsed.group is None


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(seq_headers, min_size=1, max_size=40),
    mode=st.sampled_from(["batch", "stream"]),
)
def test_resequencer_accounts_for_every_record(batches, mode) -> None:
    reseq = Resequencer(mode=mode, timeout_s=30, capacity=16, dead_letter=lambda r, why: None)
    released: list[int] = []
    refused = 0
    for offset, headers in enumerate(batches):
        try:
            released.extend(r.offset for r in reseq.offer(_record(headers, offset)))
        except ResequencerFullError:
            refused += 1
    released.extend(r.offset for r in reseq.expire(now=math.inf))
    assert len(released) == len(set(released)), "a record released twice"
    m = reseq.metrics()
    # Every record offered is accounted for exactly once.
    assert m.released + m.passed_through + m.duplicates + m.rejected + m.buffered + refused == len(
        batches
    ), m
    assert m.buffered == 0 and m.open_groups == 0


# -- Avro framing --------------------------------------------------------------------------------

SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}


@pytest.fixture(scope="module")
def serde() -> tuple[AvroSerde, bytes]:
    serde = AvroSerde(SCHEMA, registry=MemorySchemaRegistry())
    good = serde.encode({"id": 1, "note": "n", "tags": ["a"]}, stream="s")
    return serde, good[:5]


@FUZZ
@given(body=st.binary(max_size=64), framed=st.booleans(), offset=st.integers(0, 2**40))
def test_avro_decode_accepts_or_raises_serialization_error(serde, body, framed, offset) -> None:
    codec, header = serde
    data = header + body if framed else body
    try:
        value = codec.decode(data, stream="orders", partition=3, offset=offset)
    except SerializationError as exc:
        assert (exc.stream, exc.partition, exc.offset) == ("orders", 3, offset)
        return
    assert isinstance(value, dict) and set(value) == {"id", "note", "tags"}


@FUZZ
@given(schema_id=st.integers(0, 2**32 - 1), body=st.binary(max_size=16))
def test_avro_unknown_schema_ids_are_serialization_errors(serde, schema_id, body) -> None:
    codec, header = serde
    data = b"\x00" + struct.pack(">I", schema_id) + body
    if data[:5] == header:
        return
    with pytest.raises(SerializationError):
        codec.decode(data, stream="orders", partition=0, offset=1)


# -- CLI arguments -------------------------------------------------------------------------------

words = st.sampled_from(
    [
        "broker", "db", "upgrade", "downgrade", "current", "archive", "sql", "durable", "list",
        "expire", "publish", "tail", "bench", "--port", "--log", "--db", "--bootstrap",
        "--stream", "--group", "--batch-size", "--capacity", "--follow", "--json", "--param",
        "-X", "-v", "-vv", "x=1", "1", "-1", "", "0x10", "--", "SELECT 1", "=", "--port=abc",
    ]
)  # fmt: skip


@FUZZ
@given(argv=st.lists(words | st.text(max_size=6), max_size=8))
def test_cli_arguments_parse_or_exit_2(argv: list[str]) -> None:
    if any(a in ("-h", "--help") or a.startswith("--h") for a in argv):
        return  # help exits 0 by design
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            args = build_parser().parse_args(argv)
    except SystemExit as exit_:
        assert exit_.code == 2, stderr.getvalue()
        assert "usage:" in stderr.getvalue()
        return
    assert callable(args.func)


# -- configuration values ------------------------------------------------------------------------

config_values = anything | st.sampled_from(
    [0, -1, 1, 2, 10**12, "x", "", "a" * 300, True, 1.5, InitialOffsetScheme.NONE, {}]
)
stream_fields = st.sampled_from(
    ["name", "partitions", "replication_factor", "min_insync_replicas", "global_order",
     "retention_ms", "retention_bytes", "capacity", "topic_config", "no_such_field"]
)  # fmt: skip


@FUZZ
@given(fields=st.dictionaries(stream_fields, config_values, max_size=4))
def test_stream_config_accepts_or_raises_type_or_value_error(fields) -> None:
    fields.setdefault("name", "orders")
    try:
        config = StreamConfig(**fields)
    except (TypeError, ValueError):
        return
    assert (config.partitions or 1) >= 1 and config.topic_settings() is not None


@FUZZ
@given(
    fields=st.dictionaries(
        st.sampled_from(
            ["group", "initial_offset_scheme", "lease_timeout_ms", "max_batch",
             "error_handler", "consumer_config", "durable_id", "durable_timeout_s",
             "dead_letter", "on_live", "unknown_option"]
        ),
        config_values,
        max_size=4,
    )
)  # fmt: skip
def test_subscriber_config_accepts_or_raises_type_or_value_error(fields) -> None:
    try:
        SubscriberConfig(stream=StreamConfig(name="s"), **fields)
    except (TypeError, ValueError):
        return


@FUZZ
@given(
    fields=st.dictionaries(
        st.sampled_from(["group", "auto_group", "producer_config", "serde", "unknown_option"]),
        config_values,
        max_size=3,
    )
)
def test_publisher_config_accepts_or_raises_type_or_value_error(fields) -> None:
    try:
        PublisherConfig(stream=StreamConfig(name="s"), **fields)
    except (TypeError, ValueError):
        return


@FUZZ
@given(servers=anything, overrides=st.dictionaries(st.text(max_size=12), config_values, max_size=3))
def test_cluster_accepts_or_raises_type_or_value_error(servers, overrides) -> None:
    try:
        cluster = Cluster(servers, **overrides)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return
    assert cluster.client_config()["bootstrap.servers"] == cluster.bootstrap_servers


def test_contradictory_options_are_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="global_order"):
        StreamConfig(name="s", partitions=2, global_order=True)
    with pytest.raises(ValueError, match="auto_group"):
        PublisherConfig(stream=StreamConfig(name="s"), group="g", auto_group=True)
    with pytest.raises(ValueError, match="durable_id"):
        SubscriberConfig(stream=StreamConfig(name="s"), group="g", durable_id="d")
    with pytest.raises(ValueError, match="NONE"):
        SubscriberConfig(
            stream=StreamConfig(name="s"), initial_offset_scheme=InitialOffsetScheme.NONE
        )
    with pytest.raises(ValueError, match="capacity"):
        StreamConfig(name="s", capacity=10)
