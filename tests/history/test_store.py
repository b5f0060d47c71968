"""SqlStore's RingbufferStore contract on real SQLite and PostgreSQL."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

from bolide.facade import HistoryStore, Record, StoreError
from bolide.stores import SqlStore
from bolide.stores.dialects import dialect_of


def rec(offset: int, partition: int = 0, **kwargs: object) -> Record:
    """A record as if published: payload derived from its position."""
    record = Record(f"p{partition}-{offset}".encode(), **kwargs)  # type: ignore[arg-type]
    record.partition = partition
    record.offset = offset
    record.timestamp_ms = 1_700_000_000_000 + offset
    return record


def test_implements_history_store(store: SqlStore) -> None:
    assert isinstance(store, HistoryStore)


def test_round_trip_keeps_payload_key_headers_timestamp(store: SqlStore) -> None:
    original = rec(5, key=b"k\x00\xff", headers=[("a", b"1"), ("b", b"\x00\xfe"), ("a", b"2")])
    original.data = bytes(range(256))
    assert store.store_all("orders", [original]) == 1
    loaded = store.load("orders", 0, 5)
    assert loaded is not None
    assert loaded.data == bytes(range(256))
    assert loaded.key == b"k\x00\xff"
    assert loaded.headers == [("a", b"1"), ("b", b"\x00\xfe"), ("a", b"2")]
    assert (loaded.stream, loaded.partition, loaded.offset) == ("orders", 0, 5)
    assert loaded.timestamp_ms == 1_700_000_000_005
    assert store.load("orders", 0, 6) is None
    assert store.load("orders", 1, 5) is None
    assert store.load("other", 0, 5) is None


def test_null_key_and_no_headers(store: SqlStore) -> None:
    store.store_all("s", [rec(0)])
    loaded = store.load("s", 0, 0)
    assert loaded is not None and loaded.key is None and loaded.headers == []


def test_store_all_is_idempotent_and_counts_new_rows(store: SqlStore) -> None:
    first = [rec(o, headers={"h": "x"}) for o in range(10)]
    assert store.store_all("s", first) == 10
    assert store.store_all("s", first) == 0
    overlapping = [rec(o, headers={"h": "x"}) for o in range(5, 15)]
    assert store.store_all("s", overlapping) == 5
    # A batch repeating an offset stores it once.
    assert store.store_all("s", [rec(20), rec(20)]) == 1
    with store.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT count(*) FROM bolide_records")).scalar()
        headers = conn.execute(sa.text("SELECT count(*) FROM bolide_record_headers")).scalar()
    assert rows == 16
    assert headers == 15


def test_store_batches_over_stored_rows_stays_in_one_transaction(store: SqlStore) -> None:
    """A batch holding stored rows (a re-read) skips them and their headers, counts the new
    ones, and leaves the transaction usable for the caller's own writes."""
    assert store.store_batches({"a": [rec(0, headers={"h": "old"})]}) == 1
    seen: list[object] = []

    def also(conn: sa.Connection) -> None:
        seen.append(conn.execute(sa.text("SELECT count(*) FROM bolide_records")).scalar())

    mixed = {
        "a": [rec(0, headers={"h": "new"}), rec(1, headers={"h": "new"})],
        "b": [rec(0, headers={"h": "b"})],
    }
    assert store.store_batches(mixed, also=also) == 2
    assert seen == [3]
    assert store.store_batches(mixed, also=also) == 0
    assert seen == [3, 3]
    for stream, offset, value in (("a", 0, b"old"), ("a", 1, b"new"), ("b", 0, b"b")):
        loaded = store.load(stream, 0, offset)
        assert loaded is not None and loaded.headers == [("h", value)]


def test_read_pages_by_keyset_in_offset_order(store: SqlStore) -> None:
    offsets = [0, 1, 2, 5, 8, 9, 13, 21, 34]  # Kafka offsets may be sparse
    store.store_all("s", [rec(o) for o in reversed(offsets)])
    store.store_all("s", [rec(o, partition=1) for o in range(100, 103)])
    seen: list[int] = []
    position = 0
    while True:
        page = store.read("s", 0, position, 4)
        if not page:
            break
        assert len(page) <= 4
        seen.extend(r.offset for r in page if r.offset is not None)
        position = (page[-1].offset or 0) + 1
    assert seen == offsets
    assert [r.offset for r in store.read("s", 0, 6, 2)] == [8, 9]
    assert [r.data for r in store.read("s", 1, 0, 10)] == [b"p1-100", b"p1-101", b"p1-102"]
    assert store.read("s", 0, 35, 10) == []
    assert store.read("s", 0, 0, 0) == []


def test_smallest_and_largest_offset_per_partition(store: SqlStore) -> None:
    assert store.largest_offset("s", 0) is None
    assert store.smallest_offset("s", 0) is None
    store.store_all("s", [rec(o) for o in (7, 3, 11)] + [rec(50, partition=2)])
    assert (store.smallest_offset("s", 0), store.largest_offset("s", 0)) == (3, 11)
    assert (store.smallest_offset("s", 2), store.largest_offset("s", 2)) == (50, 50)
    assert store.largest_offset("s", 1) is None
    assert store.partitions("s") == [0, 2]


def test_store_batches_writes_several_streams_in_one_transaction(store: SqlStore) -> None:
    assert store.store_batches({"a": [rec(0), rec(1)], "b": [rec(0)]}) == 3
    # A failing batch leaves nothing behind: "c" must not be half written.
    bad = rec(0)
    bad.headers = [("h", None)]  # type: ignore[list-item]  # NOT NULL, inside the transaction
    with pytest.raises(StoreError):
        store.store_batches({"c": [rec(5)], "d": [bad]})
    assert store.largest_offset("c", 0) is None
    assert store.largest_offset("a", 0) == 1


def test_hostile_stream_names_and_header_values_are_data(store: SqlStore) -> None:
    hostile = "x'; DROP TABLE bolide_records; --"
    value = b"'); DELETE FROM bolide_record_headers; --"
    assert store.store_all(hostile, [rec(0, headers=[("n'\"", value)])]) == 1
    loaded = store.load(hostile, 0, 0)
    assert loaded is not None and loaded.headers == [("n'\"", value)]
    assert store.largest_offset(hostile, 0) == 0
    assert store.read(hostile, 0, 0, 10)[0].stream == hostile


def test_header_names_with_nul_are_kept_exactly(store: SqlStore) -> None:
    """Kafka header names may hold U+0000, which PostgreSQL text refuses: nothing is lost."""
    names = ["a\x00b", "\x00", "plain", "\u2400%00", "\u2400x", "50%", "\u2400a\x00%25"]
    headers = [(name, str(i).encode()) for i, name in enumerate(names)]
    assert store.store_all("s", [rec(0, headers=headers), rec(1)]) == 2
    loaded = store.load("s", 0, 0)
    assert loaded is not None and loaded.headers == headers
    assert [r.offset for r in store.read("s", 0, 0, 10)] == [0, 1]
    with store.engine.connect() as conn:
        plain = conn.execute(
            sa.text("SELECT value FROM bolide_record_headers WHERE name IN ('plain', '50%')")
        ).scalars()
        assert sorted(bytes(v) for v in plain) == [b"2", b"5"]  # ordinary names stay as they are


@pytest.mark.parametrize(
    ("records", "error"),
    [
        ([Record(b"unpublished")], ValueError),
        (["not a record"], TypeError),
        (Record(b"x"), TypeError),
    ],
)
def test_store_all_rejects_bad_records(store: SqlStore, records: object, error: type) -> None:
    with pytest.raises(error):
        store.store_all("s", records)  # type: ignore[arg-type]


def test_store_all_rejects_records_of_another_stream(store: SqlStore) -> None:
    r = rec(0)
    r.stream = "other"
    with pytest.raises(ValueError, match="other"):
        store.store_all("s", [r])


def test_bad_arguments_name_the_argument(store: SqlStore) -> None:
    with pytest.raises(ValueError, match="from_offset"):
        store.read("s", 0, -1, 10)
    with pytest.raises(TypeError, match="limit"):
        store.read("s", 0, 0, "10")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="stream"):
        store.largest_offset("", 0)
    with pytest.raises(ValueError, match="stream"):
        store.store_all("x" * 256, [rec(0)])


def test_concurrent_writers_and_readers(store: SqlStore) -> None:
    errors: list[BaseException] = []

    def write(partition: int) -> None:
        try:
            for start in range(0, 200, 20):
                store.store_all("c", [rec(o, partition) for o in range(start, start + 20)])
        except BaseException as exc:
            errors.append(exc)

    def read() -> None:
        try:
            for _ in range(20):
                page = store.read("c", 0, 0, 1_000)
                offsets = [r.offset for r in page]
                assert offsets == sorted(offsets)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(p,)) for p in range(3)]
    threads.append(threading.Thread(target=read))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [store.largest_offset("c", p) for p in range(3)] == [199, 199, 199]


def test_unsupported_urls_are_rejected() -> None:
    with pytest.raises(ValueError, match="not supported"):
        SqlStore("oracle://scott:tiger@host/db")
    with pytest.raises(ValueError, match="url"):
        SqlStore("not a url")
    with pytest.raises(TypeError, match="url"):
        SqlStore(42)  # type: ignore[arg-type]


def test_in_memory_sqlite_store_is_shared_across_threads() -> None:
    with SqlStore("sqlite://") as mem:
        mem.upgrade()
        thread = threading.Thread(target=mem.store_all, args=("m", [rec(0)]))
        thread.start()
        thread.join()
        assert mem.largest_offset("m", 0) == 0


def test_sqlite_uses_wal(tmp_path: object) -> None:
    with SqlStore(f"sqlite:///{tmp_path}/w.db") as s, s.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert int(conn.exec_driver_sql("PRAGMA busy_timeout").scalar() or 0) == 5_000


def test_unsupported_database_is_refused_with_a_typed_error() -> None:
    with pytest.raises(StoreError, match="'mysql' is not supported"):
        dialect_of("mysql+pymysql://u@h/db")
    with pytest.raises(ValueError, match="'mysql' is not supported"):
        SqlStore("mysql+pymysql://u@h/db")  # a bad argument, before any connection
    assert dialect_of("sqlite:///x.db").name == "sqlite"
    assert dialect_of("postgresql+psycopg://u@h/db").jdbc_options(
        sa.make_url("postgresql+psycopg://u@h:5433/db")
    ) == {"url": "jdbc:postgresql://h:5433/db", "driver": "org.postgresql.Driver", "user": "u"}
