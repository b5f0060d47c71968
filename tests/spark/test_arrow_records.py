"""Records from the Kafka-schema Arrow batches the Spark archive job's executors receive:
every column converted at once must give what a value-by-value conversion gave (nulls,
sliced and chunked arrays, headers without a value or without a list)."""

from __future__ import annotations

import pyarrow as pa

from bolide.spark._archive import records_by_stream

_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def _table() -> pa.Table:
    return pa.table(
        {
            "key": pa.array([b"k", None, b"a", b"b", None], pa.binary()),
            "value": pa.array([b"v", b"w", None, b"z", b"q"], pa.binary()),
            "topic": ["s1", "s1", "s2", "s1", "s2"],
            "partition": pa.array([0, 1, 0, 2, 1], pa.int32()),
            "offset": pa.array([5, 6, 7, 8, 9], pa.int64()),
            "timestamp": pa.array(
                [1_700_000_000_123_456 + i for i in range(5)], pa.timestamp("us")
            ),
            "headers": pa.array(
                [
                    [{"key": "h", "value": b"1"}],
                    None,
                    [],
                    [{"key": "a", "value": None}, {"key": "b", "value": b"2"}],
                    None,
                ],
                _HEADERS,
            ),
        }
    )


def _fields(table: pa.Table) -> dict[str, list[tuple[object, ...]]]:
    return {
        stream: [(r.data, r.key, r.headers, r.partition, r.offset, r.timestamp_ms) for r in records]
        for stream, records in records_by_stream(table).items()
    }


def test_each_column_becomes_the_records_values_with_nulls_kept() -> None:
    fields = _fields(_table())
    assert fields == {
        "s1": [
            (b"v", b"k", [("h", b"1")], 0, 5, 1_700_000_000_123),
            (b"w", None, [], 1, 6, 1_700_000_000_123),
            (b"z", b"b", [("a", b""), ("b", b"2")], 2, 8, 1_700_000_000_123),
        ],
        "s2": [
            (None, b"a", [], 0, 7, 1_700_000_000_123),
            (b"q", None, [], 1, 9, 1_700_000_000_123),
        ],
    }
    for row in fields["s1"] + fields["s2"]:
        assert all(type(n) is int for n in row[3:]), row  # Python ints, not NumPy's


def test_a_sliced_or_chunked_batch_gives_the_same_records() -> None:
    table = _table()
    whole = _fields(table)
    chunked = pa.concat_tables([table.slice(0, 2), table.slice(2, 0), table.slice(2)])
    assert _fields(chunked) == whole
    assert _fields(table.slice(3)) == {"s1": whole["s1"][2:], "s2": whole["s2"][1:]}


def test_numbers_with_nulls_stay_ints_and_nones() -> None:
    table = _table().set_column(
        5, "timestamp", pa.array([None, 1_000, None, 2_000, 3_000], pa.timestamp("us"))
    )
    stamps = [r.timestamp_ms for r in records_by_stream(table)["s1"]]
    assert stamps == [None, 1, 2]
    assert type(stamps[2]) is int
