"""Error paths of the subscriber: a failure never costs a record or moves a position past one.

Each test drives one failure the way an application meets it (its serde raises, the dead
letter is unusable, it leaves ``with`` by an exception, a hook waits for a worker) against the
real broker, and checks what was delivered and what was committed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from bolide.facade import (
    InitialOffsetScheme,
    Publisher,
    PublisherConfig,
    Record,
    SerializationError,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.stores import Archiver, SqlStore
from tests.conftest import eventually
from tests.durable.conftest import LEASE_MS

pytestmark = [pytest.mark.kafka, pytest.mark.reliability]


class PickySerde:
    """Decodes UTF-8; raises ``ValueError`` (not a ``SerializationError``) on ``bad`` payloads,
    as a user's own serde would."""

    def __init__(self, bad: Callable[[bytes], bool] = lambda data: data.startswith(b"bad")):
        self.bad = bad

    def encode(self, obj: Any, *, stream: str) -> bytes:
        return str(obj).encode()

    def decode(self, data: bytes, *, stream: str, partition: int | None, offset: int | None) -> str:
        if self.bad(data):
            raise ValueError(f"cannot read {data!r}")
        return data.decode()


def publish(cluster, stream: StreamConfig, payloads: list[bytes]) -> list[int]:
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        futures = [pub.publish_async(Record(p)) for p in payloads]
        pub.flush(30)
        return [f.result(30) for f in futures]


def poll_all(sub: Subscriber, until: Callable[[list[Any]], bool], timeout_s: float = 30) -> list:
    """Poll until ``until(events)``; events are records and the errors polls raised."""
    events: list[Any] = []

    def step() -> bool:
        try:
            events.extend(sub.poll(200))
        except Exception as exc:
            events.append(exc)
        return until(events)

    eventually(step, timeout_s)
    return events


def datas(events: list[Any]) -> list[bytes | str]:
    return [e.data if isinstance(e, Record) else "error" for e in events]


def test_user_serde_error_mid_batch_returns_what_was_gathered(cluster, stream_factory):
    stream = stream_factory()
    publish(cluster, stream, [b"good0", b"bad1", b"good2"])
    config = SubscriberConfig(
        stream=stream,
        group=f"g-{stream.name}",
        serde=PickySerde(),
        lease_timeout_ms=LEASE_MS,
    )
    with Subscriber(cluster, config) as sub:
        first = poll_all(sub, lambda ev: len(ev) >= 1)
        assert datas(first) == [b"good0"]  # gathered before the bad record: returned
        sub.confirm()
        eventually(lambda: sub.committed() == {0: 1})  # nothing past good0
        rest = poll_all(sub, lambda ev: len(ev) >= 2)
    assert datas(rest) == ["error", b"good2"]
    error = rest[0]
    assert isinstance(error, SerializationError)
    assert (error.stream, error.partition, error.offset) == (stream.name, 0, 1)
    assert isinstance(error.__cause__, ValueError)


def test_failing_dead_letter_keeps_the_record_and_returns_what_was_gathered(
    cluster, stream_factory
):
    stream = stream_factory()
    # The dead-letter topic exists with one partition; the config asks for two: unusable.
    dead = stream_factory()
    publish(cluster, dead, [b"x"])
    broken = StreamConfig(name=dead.name, partitions=2, global_order=False)
    publish(cluster, stream, [b"good0", b"bad1", b"good2"])
    config = SubscriberConfig(
        stream=stream,
        group=f"g-{stream.name}",
        serde=PickySerde(),
        dead_letter=broken,
        lease_timeout_ms=LEASE_MS,
    )
    raised: list[BaseException] = []
    with Subscriber(cluster, config) as sub:
        got: list[Record] = []

        def step() -> bool:
            try:
                got.extend(sub.poll(200))
            except Exception as exc:
                raised.append(exc)
            return len(raised) >= 2

        eventually(step, 30)
        assert [r.data for r in got] == [b"good0"]
        sub.confirm()
        eventually(lambda: sub.committed() == {0: 1})  # the bad record is still ahead


def test_a_seek_drops_the_failure_deferred_for_that_partition(cluster, stream_factory):
    stream = stream_factory()
    publish(cluster, stream, [b"good0", b"bad1"])
    config = SubscriberConfig(
        stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST, serde=PickySerde()
    )
    with Subscriber(cluster, config) as sub:
        first = poll_all(sub, lambda ev: len(ev) >= 1)
        assert datas(first)[0] == b"good0"
        sub.seek(2)  # past the bad record: its failure no longer concerns what comes next
        publish(cluster, stream, [b"good2"])
        after = poll_all(sub, lambda ev: len(ev) >= 1)
    assert datas(after) == [b"good2"]


def test_max_batch_over_librdkafkas_bound_is_refused(stream_factory):
    stream = StreamConfig(name="bounded")
    with pytest.raises(ValueError, match="max_batch"):
        SubscriberConfig(stream=stream, max_batch=1_000_001)
    assert SubscriberConfig(stream=stream, max_batch=1_000_000).max_batch == 1_000_000


@pytest.mark.parametrize("db", ["sqlite"])
def test_spliced_history_stays_in_order_after_a_bad_record(
    cluster, stream_factory, tmp_path, cluster_with_starts, db
):
    count = 10
    with SqlStore(f"sqlite:///{tmp_path / 'h.db'}") as store:
        store.upgrade()
        stream = stream_factory(store=store)
        publish(cluster, stream, [b"r%d" % i for i in range(count)])
        with Archiver(cluster, store, [stream], group=f"arch-{stream.name}") as archiver:
            archiver.run(until_caught_up=True)
        trimmed = cluster_with_starts({stream.name: {0: count}})  # all from the history
        config = SubscriberConfig(
            stream=stream,
            group=f"g-{stream.name}",
            initial_offset_scheme=InitialOffsetScheme.EARLIEST,
            max_batch=4,
            serde=PickySerde(lambda data: data == b"r2"),
            lease_timeout_ms=LEASE_MS,
        )
        with Subscriber(trimmed, config) as sub:
            events = poll_all(sub, lambda ev: len(ev) >= count)
    offsets = [e.offset for e in events]
    assert offsets == list(range(count))  # the error in its place, then 3 before 4
    assert isinstance(events[2], SerializationError)


def durable_config(stream, registry, **kwargs) -> SubscriberConfig:
    return SubscriberConfig(
        stream=stream,
        durable_id=f"d-{stream.name}",
        durable_registry=registry,
        lease_timeout_ms=LEASE_MS,
        **kwargs,
    )


def test_durable_client_leaving_by_an_exception_commits_nothing_new(
    cluster, stream_factory, tmp_path
):
    stream = stream_factory()
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    with SqlStore(url) as store:
        store.upgrade()
    publish(cluster, stream, [b"a%d" % i for i in range(5)])
    with (
        pytest.raises(RuntimeError, match="processing failed"),
        Subscriber(cluster, durable_config(stream, url)) as sub,
    ):
        got = poll_all(sub, lambda ev: len(ev) >= 5)
        assert len(got) == 5
        raise RuntimeError("processing failed")
    with Subscriber(cluster, durable_config(stream, url)) as sub:
        again = poll_all(sub, lambda ev: len(ev) >= 5)
    assert datas(again) == [b"a%d" % i for i in range(5)]
    assert all(r.replayed for r in again)


def test_durable_client_close_commits_what_was_finished(cluster, stream_factory, tmp_path):
    stream = stream_factory()
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    with SqlStore(url) as store:
        store.upgrade()
    publish(cluster, stream, [b"a%d" % i for i in range(8)])
    config = durable_config(stream, url, max_batch=2)

    def batches(sub: Subscriber, count: int) -> list[list[Record]]:
        out: list[list[Record]] = []

        def step() -> bool:
            batch = sub.poll(200)
            if batch:
                out.append(list(batch))
            return len(out) >= count

        eventually(step)
        return out

    with Subscriber(cluster, config) as sub:
        last = batches(sub, 2)[-1]
    # Closed without confirming: the last batch was not finished, so it comes again.
    with Subscriber(cluster, config) as sub:
        again = batches(sub, 1)[0]
        assert again[0].offset == last[0].offset
        sub.confirm(again[-1].offset)  # finished: the next connection starts after it
    with Subscriber(cluster, config) as sub:
        rest = batches(sub, 1)[0]
    assert rest[0].offset == again[-1].offset + 1


def test_durable_client_never_commits_an_undelivered_record(cluster, stream_factory, tmp_path):
    stream = stream_factory()
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    with SqlStore(url) as store:
        store.upgrade()
    publish(cluster, stream, [b"good0", b"bad1", b"good2", b"good3"])
    config = durable_config(stream, url, serde=PickySerde())
    seen: list[Any] = []
    with Subscriber(cluster, config) as sub:
        seen += poll_all(sub, lambda ev: sum(isinstance(e, Record) for e in ev) >= 3)
    with Subscriber(cluster, config) as sub:
        seen += sub.poll(500)
    delivered = [e.data for e in seen if isinstance(e, Record)]
    assert delivered[:3] == [b"good0", b"good2", b"good3"]


def test_confirm_in_on_revoke_commits_while_the_partitions_are_owned(cluster, stream_factory):
    stream = stream_factory()
    publish(cluster, stream, [b"r%d" % i for i in range(5)])
    errors: list[tuple[str, BaseException | None]] = []
    holder: dict[str, Subscriber] = {}
    config = SubscriberConfig(
        stream=stream,
        group=f"g-{stream.name}",
        lease_timeout_ms=LEASE_MS,
        on_revoke=lambda parts: holder["sub"].confirm(),
        error_handler=lambda summary, exc: errors.append((summary, exc)),
    )
    with Subscriber(cluster, config) as sub:
        holder["sub"] = sub
        poll_all(sub, lambda ev: len(ev) >= 5)
        sub.deactivate()  # revokes: the hook confirms what was read
        assert sub.committed() == {0: 5}  # synchronous: already there
    assert errors == []


def test_hook_waiting_for_a_worker_that_confirms_does_not_deadlock(cluster, stream_factory):
    stream = stream_factory()
    publish(cluster, stream, [b"r%d" % i for i in range(3)])
    holder: dict[str, Subscriber] = {}
    workers: list[threading.Thread] = []

    def on_revoke(parts: list[int]) -> None:
        # The usual shape: hand the commit to the worker that owns the records, wait for it.
        worker = threading.Thread(target=holder["sub"].confirm)
        workers.append(worker)
        worker.start()
        worker.join(30)

    config = SubscriberConfig(
        stream=stream, group=f"g-{stream.name}", lease_timeout_ms=LEASE_MS, on_revoke=on_revoke
    )
    with Subscriber(cluster, config) as sub:
        holder["sub"] = sub
        poll_all(sub, lambda ev: len(ev) >= 3)
        sub.deactivate()
        assert workers and not workers[0].is_alive()
        assert sub.committed() == {0: 3}


def test_error_handler_runs_outside_the_subscribers_lock(
    cluster, stream_factory, cluster_with_starts
):
    stream = stream_factory()
    publish(cluster, stream, [b"r%d" % i for i in range(5)])
    trimmed = cluster_with_starts({stream.name: {0: 3}})
    holder: dict[str, Subscriber] = {}
    reports: list[tuple[str, bool]] = []

    def handler(summary: str, exc: BaseException | None) -> None:
        # The handler waits for another thread that uses the subscriber.
        worker = threading.Thread(target=lambda: holder["sub"].poll(0))
        worker.start()
        worker.join(30)
        reports.append((summary, worker.is_alive()))

    config = SubscriberConfig(
        stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST, error_handler=handler
    )
    with Subscriber(trimmed, config) as sub:
        holder["sub"] = sub
        sub.seek(0)  # below the log start, no history: reported as a stale read
    assert len(reports) == 1
    assert "stale read" in reports[0][0]
    assert reports[0][1] is False  # the worker was not blocked by the subscriber's lock
