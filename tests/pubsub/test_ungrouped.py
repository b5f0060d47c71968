"""Meteor's ungrouped-subscriber scenarios (1-10), on a real broker."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest

from bolide.facade import (
    BrokerError,
    Cluster,
    IllegalSubscriberStateError,
    InitialOffsetScheme,
    InvalidInitialOffsetSchemeError,
    OffsetOutOfRangeError,
    Publisher,
    PublisherConfig,
    ReceiverAlreadyAttachedError,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.broker import free_port
from tests.aio.adapter import SYNC, Api
from tests.conftest import eventually

pytestmark = [pytest.mark.kafka, pytest.mark.tansu]


class Errors:
    """An error handler that records what it is told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, BaseException | None]] = []

    def __call__(self, summary: str, error: BaseException | None) -> None:
        self.calls.append((summary, error))


@pytest.fixture
def stream(stream_factory) -> StreamConfig:
    return stream_factory()


@pytest.fixture
def publisher(cluster, stream, request) -> Iterator[Publisher]:
    """The stream's publisher, of the API under test when the test takes ``api``."""
    api = request.getfixturevalue("api") if "api" in request.fixturenames else SYNC
    with api.Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        yield pub


def subscriber(cluster, stream, errors=None, api: Api = SYNC, **kwargs) -> Subscriber:
    config = SubscriberConfig(stream=stream, error_handler=errors, **kwargs)
    return api.Subscriber(cluster, config)


def test_group_only_operations_are_illegal(cluster, stream, api):
    with subscriber(cluster, stream, api=api) as sub:
        for op in (sub.deactivate, sub.reactivate, sub.confirm):
            with pytest.raises(IllegalSubscriberStateError):
                op()


def test_empty_stream_default_scheme(cluster, stream, api):
    errors = Errors()
    with subscriber(cluster, stream, errors, api=api) as sub:
        assert sub.is_assigned()
        assert len(sub.poll(1)) == 0
        assert len(sub.poll(1)) == 0
    assert errors.calls == []


def test_reads_one_record_published_after_creation(cluster, stream, publisher, api):
    errors = Errors()
    with subscriber(cluster, stream, errors, api=api) as sub:
        publisher.publish(Record(b"hello"))
        batch = sub.poll(10_000)  # returns with the first record: the timeout is slack
        assert [r.data for r in batch] == [b"hello"]
        assert batch.first() is batch.last()
        assert len(sub.poll(10)) == 0
    assert errors.calls == []


def test_reads_two_records_in_order(cluster, stream, publisher, api):
    with subscriber(cluster, stream, api=api) as sub:
        publisher.publish_async(Record(b"h0"))
        publisher.publish_async(Record(b"h1"))
        publisher.flush()
        got: list[bytes] = []
        eventually(lambda: got.extend(r.data for r in sub.poll(100)) or len(got) >= 2)
        assert got == [b"h0", b"h1"]
        assert len(sub.poll(50)) == 0


def test_seek_reads_from_the_offset(cluster, stream, publisher, api):
    with subscriber(cluster, stream, api=api) as sub:
        publisher.publish(Record(b"h0"))
        h1 = publisher.publish(Record(b"h1"))
        sub.seek(h1)
        assert [r.data for r in sub.poll(10_000)] == [b"h1"]


def test_seek_negative_raises_at_once(cluster, stream, api):
    with subscriber(cluster, stream, api=api) as sub, pytest.raises(ValueError, match="offset"):
        sub.seek(-5)


def test_seek_past_end_reports_out_of_range_once(cluster, stream, api):
    errors = Errors()
    with subscriber(cluster, stream, errors, api=api) as sub:
        sub.seek(100)
        assert len(sub.poll(100)) == 0
        assert len(sub.poll(100)) == 0
    assert len(errors.calls) == 1
    assert isinstance(errors.calls[0][1], OffsetOutOfRangeError)


def test_initial_offset_schemes(cluster, stream, publisher, api):
    publisher.publish(Record(b"h0"))
    publisher.publish(Record(b"h1"))
    with subscriber(
        cluster, stream, api=api, initial_offset_scheme=InitialOffsetScheme.EARLIEST
    ) as sub:
        got: list[bytes] = []
        eventually(lambda: got.extend(r.data for r in sub.poll(100)) or len(got) >= 2)
        assert got == [b"h0", b"h1"]
    with subscriber(
        cluster, stream, api=api, initial_offset_scheme=InitialOffsetScheme.LATEST
    ) as sub:
        assert len(sub.poll(200)) == 0
    with pytest.raises(InvalidInitialOffsetSchemeError):
        subscriber(cluster, stream, api=api, initial_offset_scheme=InitialOffsetScheme.NONE)


def test_latest_is_after_the_real_end_despite_a_stale_watermark(cluster, stream, publisher, api):
    # One batch of many records: some brokers report a high watermark inside that batch.
    for i in range(50):
        publisher.publish_async(Record(b"old-%d" % i))
    publisher.flush()
    with subscriber(
        cluster, stream, api=api, initial_offset_scheme=InitialOffsetScheme.LATEST
    ) as sub:
        assert len(sub.poll(300)) == 0
        publisher.publish(Record(b"new"))
        assert [r.data for r in sub.poll(10_000)] == [b"new"]


def test_receiver_gets_each_record_and_stops_on_close(cluster, stream, publisher):
    received: list[bytes] = []
    sub = subscriber(cluster, stream)
    receiver = sub.attach_receiver(lambda r: received.append(r.data), 1000)
    with pytest.raises(ReceiverAlreadyAttachedError):
        sub.attach_receiver(lambda r: None, 1000)
    publisher.publish(Record(b"h0"))
    publisher.publish(Record(b"h1"))
    eventually(lambda: len(received) == 2)
    sub.close()
    assert not receiver.running
    assert received == [b"h0", b"h1"]


def test_receiver_survives_a_failing_handler(cluster, stream, publisher):
    errors = Errors()
    seen: list[bytes] = []

    def handler(record: Record) -> None:
        seen.append(record.data)
        if record.data == b"poison":
            raise RuntimeError("cannot handle")

    with subscriber(cluster, stream, errors) as sub:
        sub.attach_receiver(handler, 50)
        for data in (b"a", b"poison", b"b"):
            publisher.publish(Record(data))
        eventually(lambda: len(seen) == 3)
    assert seen == [b"a", b"poison", b"b"]
    assert any(isinstance(e, RuntimeError) for _, e in errors.calls)


def test_stale_position_skips_to_first_available_and_warns(
    cluster_with_starts, stream, publisher, api
):
    for i in range(10):
        publisher.publish(Record(b"r%d" % i))
    errors = Errors()
    with subscriber(cluster_with_starts({stream.name: {0: 6}}), stream, errors, api=api) as sub:
        sub.seek(2)
        got: list[bytes] = []
        eventually(lambda: got.extend(r.data for r in sub.poll(100)) or len(got) >= 4)
        assert got == [b"r6", b"r7", b"r8", b"r9"]
    assert len(errors.calls) == 1
    assert "stale" in errors.calls[0][0]


def test_the_old_log_start_environment_variable_has_no_effect(
    cluster, stream, publisher, tmp_path, monkeypatch
):
    """Log starts come from the Cluster only: an environment variable cannot move them."""
    for i in range(10):
        publisher.publish(Record(b"r%d" % i))
    starts = tmp_path / "log-starts.json"
    starts.write_text(json.dumps({stream.name: {"0": 6}}))
    monkeypatch.setenv("BOLIDE_LOG_START_OVERRIDES", str(starts))
    errors = Errors()
    with subscriber(cluster, stream, errors) as sub:
        sub.seek(2)
        got: list[bytes] = []
        eventually(lambda: got.extend(r.data for r in sub.poll(100)) or len(got) >= 8)
        assert got == [b"r%d" % i for i in range(2, 10)]
    assert errors.calls == []


def test_many_publishers_one_total_order(cluster, stream, api):
    """Every subscriber of a global-order stream sees the same total order."""
    subs = [subscriber(cluster, stream, api=api) for _ in range(3)]
    pubs = [api.Publisher(cluster, PublisherConfig(stream=stream)) for _ in range(4)]

    def run(pub: Publisher, n: int) -> None:
        for i in range(200):
            pub.publish_async(Record(b"p%d-%d" % (n, i)))
        pub.flush()

    threads = [threading.Thread(target=run, args=(p, n)) for n, p in enumerate(pubs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    orders: list[list[bytes]] = []
    for sub in subs:
        got: list[bytes] = []
        eventually(lambda s=sub, g=got: g.extend(r.data for r in s.poll(100)) or len(g) >= 800)
        orders.append(got)
        sub.close()
    for pub in pubs:
        pub.close()
    assert orders[0] == orders[1] == orders[2]
    for n in range(4):
        mine = [d for d in orders[0] if d.startswith(b"p%d-" % n)]
        assert mine == [b"p%d-%d" % (n, i) for i in range(200)]


def test_an_unreachable_broker_is_a_broker_error(stream_factory, api):
    """A cluster that cannot be reached: a typed, retriable error when the subscriber starts."""
    stream = stream_factory()
    unreachable = Cluster(f"127.0.0.1:{free_port()}", **{"socket.timeout.ms": 2000})
    with pytest.raises(BrokerError) as info:
        api.Subscriber(unreachable, SubscriberConfig(stream=stream))
    assert info.value.retriable and info.value.stream == stream.name


def test_a_waiting_poll_does_not_block_other_calls(cluster, stream, api):
    """confirm/seek/close from another thread wait a slice of a long poll, not all of it."""
    sub = subscriber(cluster, stream, api=api)
    result: list[int] = []
    waiter = threading.Thread(target=lambda: result.append(len(sub.poll(30_000))))
    waiter.start()
    time.sleep(0.3)
    started = time.monotonic()
    sub.seek(0)
    assert sub.is_assigned()
    sub.close()
    waiter.join(20)
    # Well inside the 30 s poll: the calls did not wait for it to time out.
    assert time.monotonic() - started < 20
    assert not waiter.is_alive() and result == [0]
