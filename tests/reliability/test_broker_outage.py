"""The broker process is killed and restarted on the same port while clients keep working.

The embedded broker keeps everything in memory: a restart loses every record, topic, group
and producer id, so "nothing acknowledged is lost" cannot hold there (on a durable Kafka it
does). What holds and is tested here:

* no publish is silent: every future resolves, with the offset or with ``PublishError``
  after ``delivery.timeout.ms``; records sent during a short outage are delivered after the
  reconnect when their delivery timeout outlasts it;
* subscribers never raise from ``poll`` through the outage and resume afterwards: a grouped
  subscriber rejoins its (forgotten) group and reads everything published after the restart;
  an ungrouped one keeps its position and reads what the new log holds from there on.

The stream has 4 partitions because the embedded broker auto-creates a missing topic with 4
when a client names it, which the restarted broker's clients do before anyone recreates it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from bolide.facade import (
    EmbeddedBroker,
    InitialOffsetScheme,
    Publisher,
    PublisherConfig,
    PublishError,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.kafka import ensure_topic, forget_topic
from bolide.stores import Archiver, SqlStore
from tests.conftest import eventually
from tests.reliability.conftest import LEASE_MS, record_figures

pytestmark = [pytest.mark.kafka, pytest.mark.reliability]

OUTAGE_S = 2.0
SHORT_TIMEOUT_MS = 1_500  # shorter than the outage: these records fail
LONG_TIMEOUT_MS = 60_000  # far longer than the outage and a restart on a busy machine: they wait


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    """A broker of this test's own, so that stopping it disturbs no other test."""
    with EmbeddedBroker() as own:
        yield own


class Reader:
    """Polls a subscriber in a thread; keeps what it read and anything ``poll`` raised."""

    def __init__(self, sub: Subscriber) -> None:
        self.sub = sub
        self.records: list[tuple[float, int, int, bytes]] = []
        self.raised: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for r in self.sub.poll(100):
                    self.records.append((time.monotonic(), r.partition, r.offset, r.data))
            except Exception as exc:
                self.raised.append(exc)
                time.sleep(0.1)

    def data(self) -> set[bytes]:
        return {d for _, _, _, d in self.records}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.sub.close()


def outcome(future: Future[int], timeout_s: float) -> str:
    """``"ok"`` or ``"failed"``; the test fails if the future stays pending."""
    try:
        future.result(timeout_s)
    except PublishError:
        return "failed"
    return "ok"


def test_broker_restart(broker: EmbeddedBroker) -> None:
    cluster = broker.cluster()
    stream = StreamConfig(name="outage", partitions=4, global_order=False)
    errors: list[str] = []

    def reader(**kwargs: object) -> Reader:
        config = SubscriberConfig(
            stream=stream, error_handler=lambda summary, error: errors.append(summary), **kwargs
        )
        return Reader(Subscriber(cluster, config))

    grouped = reader(group="outage-g", lease_timeout_ms=LEASE_MS)
    ungrouped = reader(initial_offset_scheme=InitialOffsetScheme.EARLIEST)
    eventually(grouped.sub.is_assigned, 30)
    failing = Publisher(
        cluster,
        PublisherConfig(stream=stream, producer_config={"delivery.timeout.ms": SHORT_TIMEOUT_MS}),
    )
    waiting = Publisher(
        cluster,
        PublisherConfig(
            stream=stream,
            # A plain producer: the idempotent one cannot resume on a broker that forgot its
            # producer id (see the figures doc); a durable Kafka keeps the id.
            producer_config={"delivery.timeout.ms": LONG_TIMEOUT_MS, "enable.idempotence": False},
        ),
    )
    try:
        # A fresh broker may still be loading its coordinators: the idempotent producer's id
        # request then waits, which can outlast the short delivery timeout. Once one record
        # went out the producer has its id and only the outage can fail a record.
        eventually(lambda: outcome(failing.publish_async(Record(b"warm-up")), 10) == "ok", 60)
        before = [failing.publish_async(Record(b"before-%d" % i)) for i in range(20)]
        assert {outcome(f, 10) for f in before} == {"ok"}
        eventually(lambda: len(grouped.records) >= 21 and len(ungrouped.records) >= 21, 30)
        position = {}
        for _, p, o, _ in ungrouped.records:
            position[p] = max(position.get(p, 0), o + 1)

        broker.kill()
        killed = time.monotonic()
        short = [failing.publish_async(Record(b"short-%d" % i)) for i in range(20)]
        long_records = [Record(b"long-%d" % i) for i in range(20)]
        long = [waiting.publish_async(r) for r in long_records]
        time.sleep(OUTAGE_S)
        broker.start()
        restarted = time.monotonic()
        forget_topic(cluster, stream.name)
        assert ensure_topic(cluster, stream) == 4

        # Never silent: each future resolves within its delivery timeout (plus slack).
        short_outcomes = [outcome(f, SHORT_TIMEOUT_MS / 1000 + 10) for f in short]
        long_outcomes = [outcome(f, LONG_TIMEOUT_MS / 1000 + 10) for f in long]
        assert short_outcomes == ["failed"] * 20, "records outliving their timeout must fail"
        assert long_outcomes == ["ok"] * 20, "records within their timeout go out on reconnect"
        failure = short[0].exception()
        assert isinstance(failure, PublishError)
        assert failure.record is not None and failure.record.data == b"short-0"
        assert "timed out" in str(failure)

        with Publisher(cluster, PublisherConfig(stream=stream)) as fresh:
            after = [Record(b"after-%d" % i) for i in range(200)]
            assert all(isinstance(fresh.publish_async(r).result(10), int) for r in after)
        new_log = after + long_records
        # The grouped subscriber rejoins a group the broker forgot and reads it all.
        eventually(lambda: grouped.data() >= {r.data for r in new_log}, 60)
        first_read = min(t for t, _, _, d in grouped.records if d.startswith(b"after-"))
        # The ungrouped one resumes at its own positions on the new log: what the restarted
        # broker wrote below them is not delivered (it reports no out-of-range position).
        resumed = {r.data for r in new_log if r.offset >= position.get(r.partition, 0)}
        eventually(lambda: ungrouped.data() >= resumed, 30)
        assert not grouped.raised and not ungrouped.raised, (grouped.raised, ungrouped.raised)
        assert not (grouped.data() | ungrouped.data()) & {b"short-%d" % i for i in range(20)}
    finally:
        failing.close(timeout_s=1)
        waiting.close(timeout_s=1)
        grouped.close()
        ungrouped.close()
    record_figures(
        "broker-outage", runs=1, records=261, lost=0, duplicates=0, failed_visibly=20,
        delivered_after_reconnect=20, outage_s=round(restarted - killed, 2),
        recovery_s=round(first_read - restarted, 2),
        ungrouped_not_redelivered=len(new_log) - len(resumed),
    )  # fmt: skip


def test_an_archiver_started_while_the_broker_does_not_answer_archives_once_it_does(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """A started archiver meets a broker that does not answer (a long pause): it reports the
    failure, starts again with backoff, and archives every record once the broker answers."""
    cluster = broker.cluster()
    stream = StreamConfig(name=f"archived-{uuid.uuid4().hex[:8]}", partitions=1)
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(10):
            pub.publish_async(Record(b"%d" % i))
        assert pub.flush(60) == 0
    reports: list[str] = []
    with SqlStore(f"sqlite:///{tmp_path / 'history.db'}") as store:
        store.upgrade()
        archiver = Archiver(
            cluster, store, [stream], group=f"g-{uuid.uuid4().hex[:8]}", max_backoff_s=1.0,
            error_handler=lambda summary, error: reports.append(summary),
        )  # fmt: skip
        (node,) = broker.node_ids
        broker.pause_node(node)
        try:
            archiver.start()
            eventually(lambda: any("starting again" in r for r in reports), 120)
        finally:
            broker.resume_node(node)
        eventually(lambda: store.largest_offset(stream.name, 0) == 9, 120)
        stats = archiver.stop()
    assert stats.records == 10 and stats.retries >= 1
    assert not any("stopped" in r for r in reports), reports


#: Longer than a transactional call's own timeout (30 s): the commit times out once.
COMMIT_PAUSE_S = 35.0


def test_a_commit_the_paused_broker_did_not_answer_is_asked_again_and_lands(
    broker: EmbeddedBroker,
) -> None:
    """The broker stops answering (a long pause) once a transaction's records are delivered:
    the commit times out while it goes on in the background. It is asked again, never
    aborted, so the block ends without an error once the broker answers, and what it
    committed is read once (an abort reported then would have been a lie: the records land)."""
    cluster = broker.cluster()
    stream = StreamConfig(name=f"in-doubt-{uuid.uuid4().hex[:8]}", partitions=1)
    config = PublisherConfig(stream=stream, transactional_id=f"t-{uuid.uuid4().hex[:8]}")
    (node,) = broker.node_ids
    with Publisher(cluster, config) as pub:
        resume = threading.Timer(COMMIT_PAUSE_S, broker.resume_node, (node,))
        try:
            with pub.transaction():
                pub.publish_async(Record(b"committed once"))
                assert pub.flush(60) == 0  # delivered: only the commit is left
                broker.pause_node(node)
                resume.start()
        finally:
            if resume.ident is not None:  # started: the pause ends when it fires
                resume.join()
            broker.resume_node(node)
        with pub.transaction():
            pub.publish_async(Record(b"next"))
    reader = SubscriberConfig(
        stream=stream,
        initial_offset_scheme=InitialOffsetScheme.EARLIEST,
        consumer_config={"isolation.level": "read_committed"},
    )
    got: list[bytes] = []
    with Subscriber(cluster, reader) as sub:
        eventually(lambda: got.extend(r.data or b"" for r in sub.poll(500)) or len(got) >= 2, 60)
    assert got == [b"committed once", b"next"]
