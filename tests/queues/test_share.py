"""Share groups (KIP-932) behind the queue subscriber, on Apache Kafka: many members on one
partition, per-record ack, release and reject, a member's death, the receiver."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bolide.facade import (
    BrokerError,
    Cluster,
    IllegalSubscriberStateError,
    InitialOffsetScheme,
    InvalidInitialOffsetSchemeError,
    Publisher,
    PublisherConfig,
    Record,
    SerializationError,
    ShareSubscriber,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
    new_subscriber,
)
from bolide.facade.deadletter import DETAIL_HEADER, REASON_HEADER, SOURCE_HEADER
from bolide.facade.errors import NotForThisKindError
from bolide.facade.features import broker_features
from tests.conftest import ack_polled, eventually

pytestmark = [pytest.mark.kafka]

#: The record lock of the test groups: a member's records go to others this long after it died.
LOCK_MS = 2_000


@pytest.fixture
def share_cluster(bolide_backend: tuple[str, Cluster]) -> Cluster:
    if bolide_backend[0] == "tansu":
        pytest.skip("the embedded Tansu engine has no share groups (tested on Apache Kafka)")
    return bolide_backend[1]


@pytest.fixture
def stream(stream_factory: Callable[..., StreamConfig]) -> StreamConfig:
    return stream_factory()


def _publish(cluster: Cluster, stream: StreamConfig, count: int, prefix: str = "r") -> None:
    """One record per producer batch: a share fetch acquires whole batches."""
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(count):
            pub.publish(Record(f"{prefix}{i}".encode()))


def _config(
    stream: StreamConfig, group: str, lock_ms: int = LOCK_MS, **kwargs: object
) -> SubscriberConfig:
    settings = {"share.record.lock.duration.ms": lock_ms}
    return SubscriberConfig(
        stream=stream,
        share_group=group,
        share_group_config=settings,
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture
def members(share_cluster: Cluster, stream: StreamConfig) -> Iterator[list[ShareSubscriber]]:
    made: list[ShareSubscriber] = []
    yield made
    for sub in made:
        sub.close()


def _member(
    cluster: Cluster, config: SubscriberConfig, made: list[ShareSubscriber]
) -> ShareSubscriber:
    sub = Subscriber(cluster, config)
    assert isinstance(sub, ShareSubscriber)
    made.append(sub)
    return sub


def test_three_members_on_one_partition_share_the_work_each_record_once(
    share_cluster: Cluster, stream: StreamConfig, members: list[ShareSubscriber]
) -> None:
    total = 90
    _publish(share_cluster, stream, total)
    config = _config(stream, f"g-{stream.name}", max_batch=3)
    subs = [_member(share_cluster, config, members) for _ in range(3)]
    got: dict[int, list[tuple[int, int | None]]] = {i: [] for i in range(3)}
    done = threading.Event()

    def work(i: int) -> None:
        while not done.is_set():
            for record in subs[i].poll(100):
                got[i].append((int(record.offset or 0), record.delivery_count))
                time.sleep(0.02)  # some work: the other members acquire the next records
                subs[i].ack(record)
            if sum(len(v) for v in got.values()) >= total:
                done.set()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    done.wait(60)
    done.set()
    for thread in threads:
        thread.join(10)
    offsets = Counter(o for records in got.values() for o, _ in records)
    assert sorted(offsets) == list(range(total))
    assert set(offsets.values()) == {1}  # each record once, all acked
    assert all(got[i] for i in range(3)), {i: len(v) for i, v in got.items()}
    assert {count for records in got.values() for _, count in records} == {1}


def _poll_until(sub: Subscriber, count: int) -> list[Record]:
    """Poll until ``count`` records came (settling none: a share subscriber's come in one
    poll here, as few are waiting)."""
    seen: list[Record] = []

    def more() -> bool:
        seen.extend(sub.poll(100))
        return len(seen) >= count

    eventually(more, timeout_s=30)
    return seen


def test_release_redelivers_at_once_with_a_higher_delivery_count(
    share_cluster: Cluster, stream: StreamConfig, members: list[ShareSubscriber]
) -> None:
    _publish(share_cluster, stream, 1)
    sub = _member(share_cluster, _config(stream, f"g-{stream.name}"), members)
    [first] = _poll_until(sub, 1)
    assert first.delivery_count == 1 and first.data == b"r0"
    sub.release(first)
    [again] = _poll_until(sub, 1)
    assert (again.offset, again.data, again.delivery_count) == (first.offset, b"r0", 2)
    sub.ack(again)
    sub.confirm()
    assert len(sub.poll(500)) == 0


def test_reject_never_redelivers_and_goes_to_the_dead_letter_stream(
    share_cluster: Cluster,
    stream: StreamConfig,
    stream_factory: Callable[..., StreamConfig],
    members: list[ShareSubscriber],
) -> None:
    dead = stream_factory("dead")
    _publish(share_cluster, stream, 2)
    sub = _member(share_cluster, _config(stream, f"g-{stream.name}", dead_letter=dead), members)
    records: list[Record] = []

    def settle_both() -> bool:
        for record in sub.poll(100):
            records.append(record)
            if record.data == b"r0":
                sub.reject(record, "bad payload")
            else:
                sub.ack(record)
        return len(records) == 2

    eventually(settle_both, timeout_s=30)
    assert len(sub.poll(1_000)) == 0  # nothing comes back
    reader = Subscriber(
        share_cluster,
        SubscriberConfig(stream=dead, initial_offset_scheme=InitialOffsetScheme.EARLIEST),
    )
    with reader:
        [letter] = _poll_until(reader, 1)
    rejected = next(r for r in records if r.data == b"r0")
    assert letter.data == b"r0"
    assert letter.header(REASON_HEADER) == b"rejected"
    assert letter.header(SOURCE_HEADER) == f"{stream.name}/0/{rejected.offset}".encode()


def _reader(cluster: Cluster, stream: StreamConfig) -> Subscriber:
    earliest = InitialOffsetScheme.EARLIEST
    return Subscriber(cluster, SubscriberConfig(stream=stream, initial_offset_scheme=earliest))


def test_settling_rules(
    share_cluster: Cluster, stream: StreamConfig, members: list[ShareSubscriber]
) -> None:
    _publish(share_cluster, stream, 3)
    sub = _member(share_cluster, _config(stream, f"g-{stream.name}"), members)
    records = _poll_until(sub, 1)
    with pytest.raises(IllegalSubscriberStateError, match="not settled"):
        sub.poll(10)
    stranger = Record(b"x")
    with pytest.raises(IllegalSubscriberStateError, match="not held"):
        sub.ack(stranger)
    sub.confirm()  # acks every record polled
    with pytest.raises(IllegalSubscriberStateError, match="not held"):
        sub.ack(records[0])
    with pytest.raises(IllegalSubscriberStateError, match="share group"):
        sub.seek(0)
    with pytest.raises(IllegalSubscriberStateError, match="records, not offsets"):
        sub.confirm(0)


def test_every_way_of_building_a_share_member_gives_one_without_positions(
    share_cluster: Cluster, stream: StreamConfig, members: list[ShareSubscriber]
) -> None:
    config = _config(stream, f"g-{stream.name}")
    built = [ShareSubscriber(share_cluster, config), new_subscriber(share_cluster, config)]
    members.extend(built)
    _member(share_cluster, config, members)  # Subscriber(...), as it always has
    assert all(type(member) is ShareSubscriber for member in members)
    sub = members[0]
    assert not hasattr(sub, "seek")
    with pytest.raises(NotForThisKindError, match="seek does not apply to a share group") as seek:
        sub.seek(0)  # type: ignore[attr-defined]
    assert isinstance(seek.value, AttributeError)
    assert seek.value.stream == stream.name
    with pytest.raises(NotForThisKindError, match=r"Publisher.confirm\(subscriber\)"):
        sub.transaction_sources()  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="no attribute 'seekk'"):
        sub.seekk  # type: ignore[attr-defined]  # noqa: B018


_MEMBER = """
import json, sys, time
from bolide.facade import Cluster, StreamConfig, Subscriber, SubscriberConfig
bootstrap, stream, group, lock_ms = sys.argv[1:]
sub = Subscriber(Cluster(bootstrap), SubscriberConfig(
    stream=StreamConfig(name=stream), share_group=group, max_batch=5,
    share_group_config={"share.record.lock.duration.ms": int(lock_ms)}))
got = []
while not got:
    got = [r.offset for r in sub.poll(200)]
print(json.dumps(got), flush=True)
time.sleep(600)
"""


def test_a_killed_member_s_records_go_to_the_others_once_their_lock_expires(
    share_cluster: Cluster, stream: StreamConfig, members: list[ShareSubscriber]
) -> None:
    _publish(share_cluster, stream, 5)
    group = f"g-{stream.name}"
    child = subprocess.Popen(
        [sys.executable, "-c", _MEMBER, share_cluster.bootstrap_servers, stream.name, group,
         str(LOCK_MS)],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        held = json.loads(child.stdout.readline())
        assert held  # the dead member acquired records
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        if child.stdout is not None:
            child.stdout.close()
    survivor = _member(share_cluster, _config(stream, group), members)
    received: dict[int, int | None] = {}

    def all_five() -> bool:
        for record in survivor.poll(100):
            received[int(record.offset or 0)] = record.delivery_count
            survivor.ack(record)
        return len(received) == 5

    eventually(all_five, timeout_s=60)
    assert sorted(received) == [0, 1, 2, 3, 4]  # nothing lost
    assert all((received[o] or 0) >= 2 for o in held)  # delivered again, after the lock


def test_a_slow_record_does_not_hold_the_others_up(
    share_cluster: Cluster, stream: StreamConfig, members: list[ShareSubscriber]
) -> None:
    total = 30
    with Publisher(share_cluster, PublisherConfig(stream=stream)) as pub:
        pub.publish(Record(b"slow"))
        for i in range(total - 1):
            pub.publish(Record(f"fast{i}".encode()))
    # A lock outlasting the test: a member slow to fetch its share on a busy machine must not
    # see the slow record's lock run out and get it delivered again.
    config = _config(stream, f"g-{stream.name}", lock_ms=30_000, max_batch=5)
    fast_done: set[bytes] = set()
    others_finished = threading.Event()
    outcome: list[bool] = []
    lock = threading.Lock()

    def handle(record: Record) -> None:
        if record.data == b"slow":
            outcome.append(others_finished.wait(30))  # returns once every other record is done
            return
        with lock:
            fast_done.add(bytes(record.data or b""))
            if len(fast_done) == total - 1:
                others_finished.set()

    receivers = [
        _member(share_cluster, config, members).attach_receiver(handle, concurrency=4)
        for _ in range(2)
    ]
    eventually(lambda: outcome != [], timeout_s=60)
    assert outcome == [True]  # the slow record was still running while the others finished
    eventually(lambda: sum(r.metrics().finished for r in receivers) == total)
    assert sum(r.metrics().failed for r in receivers) == 0


def test_the_receiver_retries_then_dead_letters_and_rejects(
    share_cluster: Cluster,
    stream: StreamConfig,
    stream_factory: Callable[..., StreamConfig],
    members: list[ShareSubscriber],
) -> None:
    from bolide.facade import Retry

    dead = stream_factory("dead")
    _publish(share_cluster, stream, 3)
    calls: Counter[bytes] = Counter()

    def handle(record: Record) -> None:
        calls[bytes(record.data or b"")] += 1
        if record.data == b"r1":
            raise RuntimeError("poison")

    sub = _member(share_cluster, _config(stream, f"g-{stream.name}"), members)
    with Publisher(share_cluster, PublisherConfig(stream=dead)) as letters:
        receiver = sub.attach_receiver(
            handle, concurrency=2, retry=Retry(attempts=2, backoff_s=0), dead_letter=letters
        )
        eventually(lambda: receiver.metrics().finished == 3, timeout_s=30)
        receiver.close()
    assert calls == {b"r0": 1, b"r1": 2, b"r2": 1}
    metrics = receiver.metrics()
    assert (metrics.dead_lettered, metrics.retried, metrics.failed) == (1, 1, 0)
    with Subscriber(
        share_cluster,
        SubscriberConfig(stream=dead, initial_offset_scheme=InitialOffsetScheme.EARLIEST),
    ) as reader:
        [letter] = _poll_until(reader, 1)
    assert letter.data == b"r1" and letter.header(REASON_HEADER) == b"failed"


def test_receiver_options_that_do_not_apply_are_refused(
    share_cluster: Cluster, stream: StreamConfig, members: list[ShareSubscriber]
) -> None:
    sub = _member(share_cluster, _config(stream, f"g-{stream.name}"), members)
    with pytest.raises(ValueError, match="ordering"):
        sub.attach_receiver(lambda r: None, ordering="key")
    with pytest.raises(ValueError, match="acks each record"):
        sub.attach_receiver(lambda r: None, auto_confirm=False)


def test_the_broker_advertises_share_groups(share_cluster: Cluster) -> None:
    features = broker_features(share_cluster)
    assert features is not None
    assert features.finalized.get("share.version", 0) >= 1
    assert features.share_groups() is None


@pytest.mark.tansu
def test_on_a_broker_without_share_groups_the_error_names_the_requirement(
    bolide_backend: tuple[str, Cluster], stream: StreamConfig
) -> None:
    if bolide_backend[0] != "tansu":
        pytest.skip("needs a broker without share groups: the embedded Tansu engine")
    config = SubscriberConfig(stream=stream, share_group="g")
    with pytest.raises(BrokerError, match=r"Apache Kafka 4\.1 or later.*Tansu"):
        Subscriber(bolide_backend[1], config)


def test_share_group_settings_are_checked_before_any_connection() -> None:
    s = StreamConfig(name="orders")
    with pytest.raises(ValueError, match="share_group and group contradict"):
        SubscriberConfig(stream=s, share_group="q", group="g")
    with pytest.raises(ValueError, match="one stream"):
        SubscriberConfig(streams=[s], share_group="q")
    with pytest.raises(InvalidInitialOffsetSchemeError, match="share group"):
        SubscriberConfig(stream=s, share_group="q", initial_offset_scheme=InitialOffsetScheme.NONE)
    with pytest.raises(ValueError, match="not a share group setting"):
        SubscriberConfig(stream=s, share_group="q", share_group_config={"session.timeout.ms": 1})
    with pytest.raises(ValueError, match="needs share_group"):
        SubscriberConfig(stream=s, share_group_config={"share.record.lock.duration.ms": 1000})


def test_the_last_delivery_given_up_goes_to_the_subscriber_s_dead_letter(
    share_cluster: Cluster,
    stream: StreamConfig,
    stream_factory: Callable[..., StreamConfig],
    members: list[ShareSubscriber],
) -> None:
    dead = stream_factory("dead")
    _publish(share_cluster, stream, 1)
    settings = {"share.record.lock.duration.ms": LOCK_MS, "share.delivery.count.limit": 2}
    config = SubscriberConfig(
        stream=stream, share_group=f"g-{stream.name}", share_group_config=settings,
        dead_letter=dead,
    )  # fmt: skip
    sub = _member(share_cluster, config, members)
    assert sub.group_settings.delivery_limit == 2
    deliveries: list[int | None] = []

    def fail(record: Record) -> None:
        deliveries.append(record.delivery_count)
        raise RuntimeError("always")

    receiver = sub.attach_receiver(fail)
    eventually(lambda: receiver.metrics().dead_lettered == 1, timeout_s=30)
    assert deliveries == [1, 2]  # released once, then the last delivery is dead-lettered
    with _reader(share_cluster, dead) as reader:
        [letter] = _poll_until(reader, 1)
    assert letter.header(REASON_HEADER) == b"rejected"
    assert b"delivery 2 of 2 failed" in (letter.header(DETAIL_HEADER) or b"")


def test_the_asyncio_subscriber_refuses_a_share_group() -> None:
    from bolide.facade.aio import AsyncSubscriber

    config = SubscriberConfig(stream=StreamConfig(name="orders"), share_group="q")
    with pytest.raises(ValueError, match="share groups"):
        AsyncSubscriber(Cluster("127.0.0.1:9"), config)


class _Upper:
    """A serde that upper-cases values and cannot decode ``b"bad"``."""

    def decode(self, data: bytes, **where: object) -> bytes:
        if data == b"bad":
            raise ValueError("not decodable")
        return data.upper()


def test_undecodable_records_are_dead_lettered_and_rejected(
    share_cluster: Cluster,
    stream: StreamConfig,
    stream_factory: Callable[..., StreamConfig],
    members: list[ShareSubscriber],
) -> None:
    dead = stream_factory("dead")
    with Publisher(share_cluster, PublisherConfig(stream=stream)) as pub:
        for value in (b"ok1", b"bad", b"ok2"):
            pub.publish(Record(value))
    config = _config(stream, f"g-{stream.name}", serde=_Upper(), dead_letter=dead)
    sub = _member(share_cluster, config, members)
    values: list[object] = []

    def two() -> bool:
        for record in sub.poll(100):
            values.append(record.value)
            sub.ack(record)
        return len(values) == 2

    eventually(two, timeout_s=30)
    assert sorted(values) == [b"OK1", b"OK2"]  # type: ignore[type-var]
    with _reader(share_cluster, dead) as reader:
        [letter] = _poll_until(reader, 1)
    assert letter.data == b"bad" and letter.header(REASON_HEADER) == b"undecodable"


def test_lag_and_top_show_a_share_group_s_backlog(
    share_cluster: Cluster, stream: StreamConfig, members: list[ShareSubscriber]
) -> None:
    from bolide.cli.ops import render_lag
    from bolide.facade.ops.lag import lag_report
    from bolide.facade.ops.shares import list_share_groups

    _publish(share_cluster, stream, 5)
    group = f"g-{stream.name}"
    sub = _member(share_cluster, _config(stream, group, max_batch=1), members)
    acked: list[Record] = []

    def two() -> bool:
        for record in sub.poll(100):
            if len(acked) < 2:
                acked.append(record)
                sub.ack(record)
            else:
                sub.release(record)
        return len(acked) == 2

    eventually(two, timeout_s=30)
    sub.confirm()
    assert group in list_share_groups(share_cluster)

    def reported() -> Any:
        share = lag_report(share_cluster, streams=[stream.name]).share
        rows = [q for q in share if q.group == group]
        return rows if rows and rows[0].start >= 1 else None

    [row] = eventually(reported, timeout_s=30)
    # The broker reports the start offset it persisted: it may trail the last acknowledgements
    # until the group's next fetch, never pass them.
    assert (row.stream, row.partition, row.log_end) == (stream.name, 0, 5)
    assert 1 <= row.start <= 2 and row.backlog == 5 - row.start
    report = lag_report(share_cluster, streams=[stream.name])
    assert "SHARE-GROUP" in render_lag(report)
    assert any(q["group"] == group for q in report.to_dict()["share"])


class _Registry:
    """A serde whose registry is away while ``down``: ``b"r2"`` then fails retriably."""

    def __init__(self) -> None:
        self.down = True

    def decode(self, data: bytes, *, stream: str, **where: object) -> bytes:
        if data == b"r2" and self.down:
            raise SerializationError("registry unreachable", stream=stream, retriable=True)
        return data.upper()


def _publish_one_batch(cluster: Cluster, stream: StreamConfig, count: int) -> None:
    """``count`` records in one producer batch: one share fetch acquires them all."""
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        pub.publish_many(Record(f"r{i}".encode()) for i in range(count)).result(30)


def test_a_retriable_decode_failure_loses_nothing_and_comes_back_with_the_next_poll(
    share_cluster: Cluster, stream: StreamConfig, members: list[ShareSubscriber]
) -> None:
    _publish_one_batch(share_cluster, stream, 5)
    registry = _Registry()
    # A lock outlasting the test: the member keeps its records while it waits.
    config = _config(stream, f"g-{stream.name}", lock_ms=60_000, serde=registry)
    sub = _member(share_cluster, config, members)
    got: list[Record] = []
    failure = eventually(lambda: ack_polled(sub, got, SerializationError), timeout_s=30)
    assert failure.retriable
    with pytest.raises(SerializationError, match="registry unreachable"):
        sub.poll(100)  # still away: the same record fails again, nothing behind it jumps ahead
    registry.down = False

    eventually(lambda: ack_polled(sub, got, SerializationError) is None and len(got) >= 5, 30)
    assert [r.value for r in got] == [b"R0", b"R1", b"R2", b"R3", b"R4"]
    assert {r.delivery_count for r in got} == {1}  # kept by the member, not delivered again
    sub.confirm()
    assert len(sub.poll(500)) == 0


def test_a_share_receiver_outlives_a_retriable_decode_failure(
    share_cluster: Cluster, stream: StreamConfig, members: list[ShareSubscriber]
) -> None:
    _publish_one_batch(share_cluster, stream, 5)
    registry = _Registry()
    reported: list[BaseException | None] = []
    config = _config(
        stream, f"g-{stream.name}", lock_ms=60_000, serde=registry,
        error_handler=lambda summary, error: reported.append(error),
    )  # fmt: skip
    handled: list[bytes] = []
    receiver = _member(share_cluster, config, members).attach_receiver(
        lambda record: handled.append(record.value)
    )
    eventually(lambda: any(isinstance(e, SerializationError) for e in reported), timeout_s=30)
    registry.down = False
    eventually(lambda: receiver.metrics().finished == 5, timeout_s=30)
    receiver.close()
    assert sorted(handled) == [b"R0", b"R1", b"R2", b"R3", b"R4"]
    assert receiver.metrics().failed == 0
