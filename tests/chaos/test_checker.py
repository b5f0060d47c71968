"""The checker on histories written by hand: it finds each kind of anomaly it counts, and
counts none in a clean history."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from bolide.facade import Record
from bolide.stores import Outbox, SqlStore
from tests.chaos.history import Event, History, read_history
from tests.chaos.workloads import (
    WORKLOADS,
    acknowledged,
    check_alo,
    check_archive,
    check_durable,
    check_eos,
    check_outbox,
    check_par,
    check_share,
    check_sql,
    lost_rows,
    outbox_lost,
)
from tests.conftest import upgraded_db_url

ALO, EOS, PAR = WORKLOADS["alo"], WORKLOADS["eos"], WORKLOADS["par"]


def _published(history: History, name: str, places: list[tuple[int, int]]) -> None:
    for n, (p, o) in enumerate(places):
        history.add("publish", status="invoke", value=f"{name}-{n}")
        history.add("publish", status="ok", value=f"{name}-{n}", p=p, o=o)


def _events(tmp_path: Path, write: dict[str, list[tuple[str, dict[str, object]]]]) -> list[Event]:
    for proc, lines in write.items():
        history = History(tmp_path / f"{proc}.jsonl", proc)
        for type_, fields in lines:
            history.add(type_, **fields)
        history.close()
    return read_history(tmp_path.glob("*.jsonl"))


def test_at_least_once_counts_what_its_promise_forbids(tmp_path: Path) -> None:
    producer = History(tmp_path / "producer.jsonl", "producer")
    _published(producer, "alo", [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)])
    producer.close()
    reads = [(0, 0), (0, 2), (0, 1), (0, 0)]  # 0:1 after 0:2; 0:0 twice
    events = _events(
        tmp_path,
        {"alo-1.1": [("read", {"p": p, "o": o, "value": f"alo-{o}"}) for p, o in reads]},
    )
    # 0:3 never written (lost); 1:0 unread below the position (stuck); 1:1 unread, confirmed past.
    topic = {(0, o): (f"alo-{o}", {}) for o in range(3)} | {
        (1, 0): ("alo-4", {}),
        (1, 1): ("alo-5", {}),
    }
    counts = check_alo(ALO, events, topic, {0: 3, 1: 2})
    assert counts == {
        "acknowledged": 6,
        "lost": 1,
        "duplicates": 1,
        "out-of-order": 1,
        "confirmed-past-unfinished": 2,
        "stuck": 0,
    }
    assert check_alo(ALO, events, topic, {1: 0})["stuck"] == 2


def test_exactly_once_counts_duplicates_losses_order_and_aborted_reads(tmp_path: Path) -> None:
    producer = History(tmp_path / "producer.jsonl", "producer")
    _published(producer, "eos", [(0, 0), (0, 1), (0, 2), (0, 3)])
    producer.close()
    events = _events(
        tmp_path,
        {
            "eos-1.1": [
                ("txn", {"status": "begin", "txn": "eos-1.1:1"}),
                ("txn", {"status": "abort", "txn": "eos-1.1:1", "error": "TransactionError"}),
            ]
        },
    )
    topic = {(0, o): (f"eos-{o}", {}) for o in range(4)}

    def out(place: str, txn: str = "eos-1.2:1") -> tuple[str, dict[str, str]]:
        return ("", {"in": place, "txn": txn})

    clean = {(0, i): out(f"0:{i}") for i in range(4)}
    assert check_eos(EOS, events, clean, topic) == {
        "acknowledged": 4,
        "lost": 0,
        "stuck": 0,
        "duplicates": 0,
        "out-of-order": 0,
        "aborted-read": 0,
    }
    # 0:1 twice (once from the aborted transaction), 0:3 not processed, 0:0 after 0:2.
    bad = {
        (0, 0): out("0:1", "eos-1.1:1"),
        (0, 1): out("0:2"),
        (0, 2): out("0:0"),
        (0, 3): out("0:1"),
    }
    assert check_eos(EOS, events, bad, topic) == {
        "acknowledged": 4,
        "lost": 0,
        "stuck": 1,
        "duplicates": 1,
        "out-of-order": 1,
        "aborted-read": 1,
    }


def test_the_parallel_receiver_counts_key_order_by_publishing_order(tmp_path: Path) -> None:
    producer = History(tmp_path / "producer.jsonl", "producer")
    _published(producer, "par", [(0, 0), (0, 1), (0, 2), (1, 0)])
    producer.close()
    # par-0 and par-2 share key k0; par-2 is handled first: out of order. par-1 is given up,
    # par-3 never finished.
    handled = [("par-2", "k0"), ("par-0", "k0"), ("par-0", "k0")]
    events = _events(
        tmp_path,
        {
            "par-1.1": [("read", {"value": v, "key": k}) for v, k in handled]
            + [("dead", {"value": "par-1", "key": "k1", "error": "RuntimeError"})]
        },
    )
    topic = {(0, o): (f"par-{o}", {}) for o in range(3)} | {(1, 0): ("par-3", {})}
    assert check_par(PAR, events, topic) == {
        "acknowledged": 4,
        "lost": 0,
        "stuck": 1,
        "duplicates": 1,
        "out-of-order": 1,
        "dead-lettered": 1,
    }


def test_sql_counts_the_ledger_in_commit_order(tmp_path: Path) -> None:
    producer = History(tmp_path / "producer.jsonl", "producer")
    _published(producer, "sql", [(0, 0), (0, 1), (0, 2)])
    producer.close()
    events = read_history(tmp_path.glob("*.jsonl"))
    topic = {(0, o): (f"sql-{o}", {}) for o in range(3)}
    rows = [(0, 1, "sql-1"), (0, 0, "sql-0"), (0, 1, "sql-1")]  # 0 after 1, 1 twice, 2 missing
    assert check_sql(WORKLOADS["sql"], events, rows, topic) == {
        "acknowledged": 3,
        "lost": 0,
        "stuck": 1,
        "duplicates": 1,
        "out-of-order": 1,
    }
    # One publish in the stream twice (a producer's retry across a leader change): each copy
    # is a record of its own, its effects once each.
    topic[(0, 3)] = ("sql-2", {})
    rows = [(0, o, f"sql-{min(o, 2)}") for o in range(4)]
    assert check_sql(WORKLOADS["sql"], events, rows, topic)["duplicates"] == 0


def test_the_archive_must_equal_the_stream(tmp_path: Path) -> None:
    producer = History(tmp_path / "producer.jsonl", "producer")
    _published(producer, "archive", [(0, 0), (0, 1), (0, 2), (1, 0)])
    producer.close()
    events = _events(tmp_path, {"archive-1.1": [("archived", {"positions": {"0": 2, "1": 0}})]})
    topic = {(0, o): (f"archive-{o}", {}) for o in range(3)} | {(1, 0): ("archive-3", {})}
    archive = WORKLOADS["archive"]
    assert archive.done(events) == {"archive-0", "archive-1"}
    # 0:2 is not archived; 1:0 holds another value; 1:1 is not in the stream at all.
    rows = {(0, 0): "archive-0", (0, 1): "archive-1", (1, 0): "archive-9", (1, 1): "archive-3"}
    assert check_archive(archive, events, rows, topic) == {
        "acknowledged": 4,
        "lost": 0,
        "stuck": 1,
        "mismatched": 2,
    }
    clean = {place: value for place, (value, _) in topic.items()}
    assert check_archive(archive, events, clean, topic)["stuck"] == 0


def test_an_archived_value_acknowledged_without_its_offset_does_not_hold_the_drain(
    tmp_path: Path,
) -> None:
    """A delivery report may carry no offset: the drain cannot place the value, and the
    final check finds it in the stream by value."""
    producer = History(tmp_path / "producer.jsonl", "producer")
    _published(producer, "archive", [(0, 0)])
    producer.add("publish", status="invoke", value="archive-1")
    producer.add("publish", status="ok", value="archive-1", p=0, o=None)
    producer.close()
    events = _events(tmp_path, {"archive-1.1": [("archived", {"positions": {"0": 1}})]})
    assert WORKLOADS["archive"].done(events) == {"archive-0", "archive-1"}


def test_the_outbox_counts_rows_in_the_stream_by_commit_order(tmp_path: Path) -> None:
    outbox = WORKLOADS["outbox"]
    events = _events(
        tmp_path,
        {
            "producer": [("publish", {"status": "ok", "value": f"outbox-{n}"}) for n in range(4)],
            "outbox-1.1": [("pending", {"count": 2})],
        },
    )
    assert outbox.done(events) == set(), "rows were pending after the last commit"
    # outbox-0 and outbox-8 share key k0: 8 before 0 is out of order; outbox-1 twice;
    # outbox-2 still pending; outbox-3 neither sent nor pending.
    output = {
        (0, 0): ("outbox-8", {}),
        (0, 1): ("outbox-0", {}),
        (1, 0): ("outbox-1", {}),
        (1, 1): ("outbox-1", {}),
    }
    assert check_outbox(outbox, events, output, {"outbox-2"}) == {
        "acknowledged": 4,
        "lost": 1,
        "stuck": 1,
        "duplicates": 1,
        "out-of-order": 1,
        "writer-stopped": 0,
    }
    later = tmp_path / "later"
    later.mkdir()
    drained = _events(later, {"outbox-2.1": [("pending", {"count": 0})]})
    assert outbox.done(events + drained) == {f"outbox-{n}" for n in range(4)}


def test_an_outbox_loss_comes_with_its_rows(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    outbox = WORKLOADS["outbox"]
    url = upgraded_db_url("sqlite", tmp_path, request)
    with SqlStore(url) as store, store.engine.begin() as conn:
        for n in range(3):
            Outbox(store).add(conn, outbox.output, Record(f"outbox-{n}".encode(), key=b"k"))
        conn.execute(sa.text("UPDATE bolide_outbox SET sent_ms = 1, relay = 'r', batch = 7"))
    events = _events(
        tmp_path,
        {"producer": [("publish", {"status": "ok", "value": f"outbox-{n}"}) for n in range(3)]},
    )
    output = {(0, 0): ("outbox-0", {}), (0, 1): ("outbox-2", {})}
    lost = outbox_lost(acknowledged(events, outbox), output, set())
    assert lost == ["outbox-1"]
    assert lost_rows(url, outbox, lost) == [
        {"id": 2, "payload": "outbox-1", "relay": "r", "batch": 7, "sent_ms": 1,
         "kafka_partition": None, "kafka_offset": None},
    ]  # fmt: skip


def test_durable_clients_count_gaps_order_and_the_seam(tmp_path: Path) -> None:
    producer = History(tmp_path / "producer.jsonl", "producer")
    _published(producer, "durable", [(0, 0), (0, 1), (0, 2)])
    producer.close()

    def read(o: int, replayed: bool) -> tuple[str, dict[str, object]]:
        return ("read", {"p": 0, "o": o, "value": f"durable-{o}", "replayed": replayed})

    connect = ("connect", {"state": "resumed", "marker": {"0": 2}})
    events = _events(
        tmp_path,
        {
            # Slot 1: 1 replayed, then 0 replayed (out of order), live, 2 live: clean seam.
            "durable-1.1": [connect, read(1, True), read(0, True), ("live", {}), read(2, False)],
            # Slot 2: 0 unflagged before live, 2 flagged though past the marker; 1 never read.
            "durable-2.1": [connect, read(0, False), read(2, True), ("live", {})],
            "durable-2.2": [connect, read(0, True), ("live", {})],
        },
    )
    durable = WORKLOADS["durable"]
    assert durable.done(events) == {"durable-0", "durable-2"}
    topic = {(0, o): (f"durable-{o}", {}) for o in range(3)}
    assert check_durable(durable, events, topic) == {
        "acknowledged": 3,
        "lost": 0,
        "stuck": 1,
        "duplicates": 1,
        "out-of-order": 1,
        "seam": 2,
    }


def test_a_share_group_counts_unacked_records_and_deliveries_not_counted_up(
    tmp_path: Path,
) -> None:
    producer = History(tmp_path / "producer.jsonl", "producer")
    _published(producer, "share", [(0, 0), (0, 1), (0, 2)])
    producer.close()

    def read(o: int, deliveries: int) -> tuple[str, dict[str, object]]:
        return ("read", {"p": 0, "o": o, "value": f"share-{o}", "deliveries": deliveries})

    events = _events(
        tmp_path,
        {
            # 0 read twice, its count rising; 1 delivered twice as its first delivery; 2 unacked.
            "share-1.1": [read(0, 1), read(1, 1), read(2, 1)],
            "share-2.1": [read(0, 2), read(1, 1), ("ack", {"values": ["share-0", "share-1"]})],
        },
    )
    share = WORKLOADS["share"]
    assert share.done(events) == {"share-0", "share-1"}
    topic = {(0, o): (f"share-{o}", {}) for o in range(3)}
    assert check_share(share, events, topic) == {
        "acknowledged": 3,
        "lost": 0,
        "stuck": 1,
        "duplicates": 2,
        "delivery-count-not-rising": 1,
        "ack-unlogged": 0,
    }


def test_a_share_member_killed_while_acking_leaves_no_record_stuck_unless_read_again(
    tmp_path: Path,
) -> None:
    producer = History(tmp_path / "producer.jsonl", "producer")
    _published(producer, "share", [(0, 0), (0, 1), (0, 2)])
    producer.close()

    def read(o: int) -> tuple[str, dict[str, object]]:
        return ("read", {"p": 0, "o": o, "value": f"share-{o}", "deliveries": 1})

    events = _events(
        tmp_path,
        {
            # Killed while acking 0 and 1: 0 is never read again (the broker took the ack),
            # 1 is (the ack never arrived) and is acked then.
            "share-1.1": [read(0), read(1), ("acking", {"values": ["share-0", "share-1"]})],
            # Killed while acking 2, which is read again and never acked: stuck.
            "share-2.1": [read(2), ("acking", {"values": ["share-2"]})],
            "share-2.2": [
                read(1),
                read(2),
                ("acking", {"values": ["share-1"]}),
                ("ack", {"values": ["share-1"]}),
            ],
        },
    )
    share = WORKLOADS["share"]
    assert share.done(events) == {"share-0", "share-1"}
    topic = {(0, o): (f"share-{o}", {}) for o in range(3)}
    counts = check_share(share, events, topic)
    assert counts["stuck"] == 1  # share-2
    assert counts["ack-unlogged"] == 1  # share-0
