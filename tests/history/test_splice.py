"""The splice: subscribers read below Kafka's log start from the SQL history, with no gap and
no duplicate at the seam. The embedded broker never trims its log, so the readers get a
cluster whose ``log_start_overrides`` raise the log start once the records are archived."""

from __future__ import annotations

import pytest

from bolide.facade import (
    Cluster,
    EmbeddedBroker,
    InitialOffsetScheme,
    Publisher,
    PublisherConfig,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.stores import Archiver, SqlStore
from tests.conftest import eventually

pytestmark = [pytest.mark.kafka, pytest.mark.tansu]

COUNT, START = 30, 20


@pytest.fixture
def archived(cluster, stream_factory, store: SqlStore) -> StreamConfig:
    """A stream of COUNT records, all archived (``trimmed`` starts its log at START)."""
    stream = stream_factory(store=store)
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(COUNT):
            pub.publish_async(Record(b"r%d" % i, group=f"k{i % 3}", headers={"n": str(i)}))
        pub.flush()
    with Archiver(cluster, store, [stream], group=f"arch-{stream.name}") as archiver:
        archiver.run(until_caught_up=True)
    assert store.largest_offset(stream.name, 0) == COUNT - 1
    return stream


@pytest.fixture
def trimmed(archived: StreamConfig, cluster_with_starts) -> Cluster:
    """The cluster, with Kafka holding ``archived`` from START on."""
    return cluster_with_starts({archived.name: {0: START}})


def drain(sub: Subscriber, count: int) -> list[Record]:
    got: list[Record] = []
    eventually(lambda: got.extend(sub.poll(100)) or len(got) >= count, timeout_s=20)
    assert len(sub.poll(100)) == 0
    return got


def check_log(records: list[Record], first: int) -> None:
    assert [r.offset for r in records] == list(range(first, COUNT))
    assert [r.data for r in records] == [b"r%d" % i for i in range(first, COUNT)]
    assert [r.key for r in records] == [b"k%d" % (i % 3) for i in range(first, COUNT)]
    assert [r.group for r in records] == [f"k{i % 3}" for i in range(first, COUNT)]
    assert [r.header("n") for r in records] == [str(i).encode() for i in range(first, COUNT)]


def test_earliest_reads_history_then_kafka_in_straddling_batches(trimmed, archived, api):
    config = SubscriberConfig(
        stream=archived, initial_offset_scheme=InitialOffsetScheme.EARLIEST, max_batch=7
    )
    with api.Subscriber(trimmed, config) as sub:
        records = drain(sub, COUNT)
    check_log(records, 0)


def test_seek_below_the_log_start_reads_history(trimmed, archived, api):
    with api.Subscriber(trimmed, SubscriberConfig(stream=archived)) as sub:
        sub.seek(5)
        records = drain(sub, COUNT - 5)
    check_log(records, 5)


def test_grouped_old_confirmed_offset_resumes_from_history(cluster, trimmed, archived, api):
    group = f"g-{archived.name}"

    def grouped(on: Cluster) -> Subscriber:
        return api.Subscriber(
            on, SubscriberConfig(stream=archived, group=group, lease_timeout_ms=4000)
        )

    with grouped(cluster) as first:
        # Confirmed while Kafka still held everything: no splice yet.
        got: list[Record] = []
        eventually(lambda: got.extend(first.poll(100)) or len(got) >= 4, timeout_s=20)
        first.confirm(3)
        eventually(lambda: first.committed() == {0: 4})
    with grouped(trimmed) as second:
        records = drain(second, COUNT - 4)
    check_log(records, 4)


def test_without_history_a_stale_position_skips_ahead(trimmed, archived, store, api):
    plain = StreamConfig(name=archived.name)  # same topic, no store
    errors: list[str] = []
    config = SubscriberConfig(
        stream=plain,
        initial_offset_scheme=InitialOffsetScheme.EARLIEST,
        error_handler=lambda summary, _: errors.append(summary),
    )
    with api.Subscriber(trimmed, config) as sub:
        records = drain(sub, COUNT - START)
    check_log(records, START)
    assert errors == []  # EARLIEST means the first available record: nothing stale


def test_a_gap_between_history_and_kafka_is_reported(
    cluster, stream_factory, store, cluster_with_starts, api
):
    """An archive that fell behind retention: what neither holds is skipped, and said so."""
    stream = stream_factory(store=store)
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        offsets = [pub.publish(Record(b"r%d" % i)) for i in range(COUNT)]
    archived = []
    for i in range(10):
        rec = Record(b"r%d" % i)
        rec.partition, rec.offset = 0, offsets[i]
        archived.append(rec)
    store.store_all(stream.name, archived)
    trimmed = cluster_with_starts({stream.name: {0: START}})
    errors: list[tuple[str, BaseException | None]] = []
    config = SubscriberConfig(
        stream=stream,
        initial_offset_scheme=InitialOffsetScheme.EARLIEST,
        error_handler=lambda summary, error: errors.append((summary, error)),
    )
    with api.Subscriber(trimmed, config) as sub:
        records = drain(sub, 10 + COUNT - START)
    assert [r.offset for r in records] == [*range(10), *range(START, COUNT)]
    assert len(errors) == 1 and "10 to 19" in errors[0][0]


def test_history_keeps_header_names_with_nul(cluster, stream_factory, store, cluster_with_starts):
    """The splice returns archived header names exactly, U+0000 included."""
    stream = stream_factory(store=store)
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        offsets = [pub.publish(Record(b"r%d" % i)) for i in range(COUNT)]
    archived = []
    for i in range(START):
        rec = Record(b"r%d" % i, headers=[("trace\x00id", b"%d" % i), ("n", b"x")])
        rec.partition, rec.offset = 0, offsets[i]
        archived.append(rec)
    store.store_all(stream.name, archived)
    trimmed = cluster_with_starts({stream.name: {0: START}})
    config = SubscriberConfig(stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST)
    with Subscriber(trimmed, config) as sub:
        records = drain(sub, COUNT)
    assert [r.offset for r in records] == list(range(COUNT))
    assert [r.headers for r in records[:START]] == [
        [("trace\x00id", b"%d" % i), ("n", b"x")] for i in range(START)
    ]


def test_embedded_broker_cluster_emulates_retention(stream_factory, tmp_path):
    """``broker.cluster(log_start_overrides=...)``: its clients take Kafka to hold START on."""
    with EmbeddedBroker() as broker, SqlStore(f"sqlite:///{tmp_path / 'h.db'}") as store:
        store.upgrade()
        stream = stream_factory(store=store)
        plain = broker.cluster()
        with Publisher(plain, PublisherConfig(stream=stream)) as pub:
            published = [Record(b"r%d" % i, group=f"k{i % 3}") for i in range(COUNT)]
            for rec in published:
                pub.publish(rec)
        copies = []  # marked, so each record shows which side it came from
        for rec in published[:START]:
            copy = Record(b"sql:" + rec.data, key=rec.key)
            copy.partition, copy.offset = rec.partition, rec.offset
            copies.append(copy)
        store.store_all(stream.name, copies)
        trimmed = broker.cluster(log_start_overrides={stream.name: {0: START}})
        assert trimmed.fetch_gap_settle_ms == plain.fetch_gap_settle_ms

        errors: list[str] = []
        stale = SubscriberConfig(
            stream=StreamConfig(name=stream.name),  # no store: below START is a stale read
            error_handler=lambda summary, _: errors.append(summary),
        )
        with Subscriber(trimmed, stale) as sub:
            sub.seek(5)
            records = drain(sub, COUNT - START)
        assert [r.offset for r in records] == list(range(START, COUNT))
        assert len(errors) == 1 and "stale" in errors[0]

        spliced = SubscriberConfig(
            stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST
        )
        with Subscriber(trimmed, spliced) as sub:
            records = drain(sub, COUNT)
        assert [r.offset for r in records] == list(range(COUNT))
        assert [r.data for r in records] == [
            (b"sql:" if i < START else b"") + b"r%d" % i for i in range(COUNT)
        ]
        with Subscriber(plain, spliced) as sub:  # the broker itself still holds everything
            assert [r.data for r in drain(sub, COUNT)] == [b"r%d" % i for i in range(COUNT)]


def test_a_partition_paused_while_its_history_is_read_stays_paused_when_the_history_ends(
    trimmed, archived
):
    # Two reasons hold the partition at first: its history splice and the application. The
    # splice ending must not let Kafka deliver it; resuming delivers everything, once.
    config = SubscriberConfig(stream=archived, initial_offset_scheme=InitialOffsetScheme.EARLIEST)
    with Subscriber(trimmed, config) as sub:
        sub.pause([0])
        for _ in range(5):
            assert len(sub.poll(200)) == 0
        assert sub.paused == frozenset({(archived.name, 0)})
        sub.resume()
        records = drain(sub, COUNT)
    check_log(records, 0)


def test_a_splice_paused_when_the_shared_fetch_stops_reads_each_record_once(trimmed, archived):
    # The partition leaves the shared ring while its history is queued and the application
    # holds it: its own consumer must take over where the history ends, not at the delivery
    # position (which is still in the history).
    config = SubscriberConfig(stream=archived)
    sub, other = Subscriber(trimmed, config), Subscriber(trimmed, config)
    try:
        for s in (sub, other, sub):
            assert len(s.poll(100)) == 0
        assert sub._fetcher._ringed == {0}  # on the shared fetch, at the end
        sub.seek(5)
        sub.pause()
        other.close()
        assert len(sub.poll(500)) == 0
        sub.resume()
        records = drain(sub, COUNT - 5)
    finally:
        sub.close()
        other.close()
    check_log(records, 5)
