"""Bad input on a live broker: oversized records, poisoned records, refused configurations."""

from __future__ import annotations

import threading
import time

import pytest

from bolide.facade import (
    AvroSerde,
    Cluster,
    InitialOffsetScheme,
    MemorySchemaRegistry,
    Publisher,
    PublisherConfig,
    PublishError,
    Record,
    SerializationError,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from tests.conftest import eventually

pytestmark = [pytest.mark.kafka, pytest.mark.reliability]

EARLIEST = InitialOffsetScheme.EARLIEST
#: Nothing listens here: a client that tried to connect would wait, then fail.
NOWHERE = Cluster("127.0.0.1:9")


def test_oversized_record_fails_its_future_with_the_reason(cluster, stream_factory):
    stream = stream_factory()
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        big = Record(b"x" * 2_000_000)
        future = pub.publish_async(big)
        with pytest.raises(PublishError, match=r"(?i)message size too large") as caught:
            future.result(10)
        assert caught.value.record is big
        assert caught.value.retriable is False
        assert pub.publish(Record(b"small")) >= 0, "the publisher still works"


def test_a_poisoned_record_does_not_stop_a_receiver(cluster, stream_factory):
    stream = stream_factory()
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(20):
            pub.publish_async(Record(b"poison" if i == 7 else b"%d" % i))
        pub.flush(10)
    handled: list[bytes] = []
    reports: list[tuple[str, BaseException | None]] = []

    def handle(record: Record) -> None:
        if record.data == b"poison":
            raise RuntimeError("cannot handle this one")
        handled.append(record.data)

    config = SubscriberConfig(
        stream=stream, initial_offset_scheme=EARLIEST,
        error_handler=lambda summary, error: reports.append((summary, error)),
    )  # fmt: skip
    with Subscriber(cluster, config) as sub:
        receiver = sub.attach_receiver(handle, poll_timeout_ms=50)
        eventually(lambda: len(handled) == 19, 15)
        assert receiver.running
    assert handled == [b"%d" % i for i in range(20) if i != 7]
    [(summary, error)] = reports
    assert isinstance(error, RuntimeError) and "offset=7" in summary


def test_an_undecodable_record_costs_a_receiver_only_itself(cluster, stream_factory):
    stream = stream_factory()
    serde = AvroSerde({"type": "string"}, registry=MemorySchemaRegistry())
    with Publisher(cluster, PublisherConfig(stream=stream, serde=serde)) as pub:
        for i in range(20):
            pub.publish_async(Record(b"junk") if i == 7 else f"v{i}")
        pub.flush(10)
    values: list[str] = []
    reports: list[BaseException | None] = []
    config = SubscriberConfig(
        stream=stream, serde=serde, initial_offset_scheme=EARLIEST,
        error_handler=lambda summary, error: reports.append(error),
    )  # fmt: skip
    with Subscriber(cluster, config) as sub:
        sub.attach_receiver(lambda record: values.append(record.value), poll_timeout_ms=50)
        time.sleep(0.5)  # the whole stream is in one poll
        eventually(lambda: len(values) >= 12, 15)
        time.sleep(0.5)
    assert [type(e) for e in reports] == [SerializationError]
    assert values == [f"v{i}" for i in range(20) if i != 7]


def _refused(make: object) -> BaseException:
    """Run ``make()``; it must raise TypeError or ValueError.

    The clusters here have no broker: anything that connected before checking its arguments
    would fail with a ``BrokerError`` (or a timeout) instead, whatever the machine's speed.
    """
    with pytest.raises((TypeError, ValueError)) as caught:
        make()  # type: ignore[operator]
    return caught.value


def test_bad_configs_are_refused_before_anything_connects():
    stream = StreamConfig(name="s")
    bad = [
        lambda: Publisher(NOWHERE, "not a config"),  # type: ignore[arg-type]
        lambda: Subscriber(NOWHERE, {"stream": stream}),  # type: ignore[arg-type]
        lambda: Publisher("127.0.0.1:9", PublisherConfig(stream=stream)),  # type: ignore[arg-type]
        lambda: PublisherConfig(stream=stream, linger_ms=5),  # type: ignore[call-arg]
        lambda: SubscriberConfig(stream=stream, lease_timeout_ms="10s"),  # type: ignore[arg-type]
        lambda: SubscriberConfig(stream=stream, consumer_config={"fetch.min.bytes": [1]}),
        lambda: Cluster("127.0.0.1:9", **{"sasl.password": object()}),
        lambda: StreamConfig(name="bad name"),
    ]
    for make in bad:
        _refused(make)


def test_an_unknown_librdkafka_setting_is_refused_before_connecting(stream_factory):
    config = PublisherConfig(stream=stream_factory(), producer_config={"no.such.key": 1})
    error = _refused(lambda: Publisher(NOWHERE, config))
    assert "no.such.key" in str(error)


def test_receiver_threads_end_with_their_subscriber(cluster, stream_factory):
    before = threading.active_count()
    with Subscriber(cluster, SubscriberConfig(stream=stream_factory())) as sub:
        sub.attach_receiver(lambda record: None, poll_timeout_ms=20)
    eventually(lambda: threading.active_count() <= before, 5)
