"""Dead letters of share groups (rejected by the application, given up by a share receiver)
carry the same headers: DeadLetters lists and replays them like any other. Apache Kafka only:
the embedded Tansu engine has no share groups (docs/compatibility.md)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from bolide.facade import (
    Cluster,
    Publisher,
    PublisherConfig,
    PublishError,
    Reason,
    Record,
    Retry,
    ShareSubscriber,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.deadletter import REASON_HEADER, REPLAYED_FROM_HEADER
from bolide.facade.kafka import admin_client
from bolide.stores import DeadLetters, SqlStore
from tests.conftest import ack_polled, eventually
from tests.deadletters.conftest import end_of, read_all

pytestmark = [pytest.mark.kafka]


def _share(
    cluster: Cluster, stream: StreamConfig, group: str, dead_letter: StreamConfig | None = None
) -> ShareSubscriber:
    settings = {"share.record.lock.duration.ms": 2_000}
    config = SubscriberConfig(
        stream=stream, share_group=group, share_group_config=settings, dead_letter=dead_letter
    )
    sub = Subscriber(cluster, config)
    assert isinstance(sub, ShareSubscriber)
    return sub


def _poison(record: Record) -> None:
    if record.data == b"r2":
        raise RuntimeError("poison r2")


def test_share_group_dead_letters_are_listed_and_replayed(
    bolide_backend: tuple[str, Cluster],
    stream_factory: Callable[..., StreamConfig],
    db_url: str,
) -> None:
    engine, cluster = bolide_backend
    if engine == "tansu":
        pytest.skip("the embedded Tansu engine has no share groups (docs/compatibility.md)")
    source, dead = stream_factory("jobs"), stream_factory("jobs-dlq")
    with Publisher(cluster, PublisherConfig(stream=source)) as pub:
        offsets = {f"r{i}".encode(): pub.publish(Record(f"r{i}".encode())) for i in range(6)}
    # The application rejects r1 and r4 ...
    settled: list[Record] = []
    with _share(cluster, source, f"apps-{source.name}", dead_letter=dead) as sub:

        def settle() -> bool:
            for record in sub.poll(100):
                settled.append(record)
                if record.data in (b"r1", b"r4"):
                    sub.reject(record, "bad payload")
                else:
                    sub.ack(record)
            return len(settled) == 6

        eventually(settle, timeout_s=30)
    # ... and a share receiver of another group gives r2 up after its retries.
    with (
        _share(cluster, source, f"workers-{source.name}") as sub,
        Publisher(cluster, PublisherConfig(stream=dead)) as letters,
    ):
        retry = Retry(attempts=2, backoff_s=0)
        receiver = sub.attach_receiver(_poison, concurrency=2, retry=retry, dead_letter=letters)
        eventually(lambda: receiver.metrics().finished == 6, timeout_s=30)
        receiver.close()
    eventually(lambda: end_of(cluster, dead.name) == 3, timeout_s=30)

    with SqlStore(db_url) as store:
        workbench = DeadLetters(store, cluster)
        found = workbench.list(stream=dead.name)
        by_data = {d.value: d for d in found}
        assert set(by_data) == {b"r1", b"r2", b"r4"}
        for data in (b"r1", b"r4"):
            assert by_data[data].reason is Reason.REJECTED
            assert by_data[data].detail == "bad payload"
            assert by_data[data].source == f"{source.name}/0/{offsets[data]}"
        assert by_data[b"r2"].reason is Reason.FAILED
        assert "poison r2" in (by_data[b"r2"].detail or "")
        assert by_data[b"r2"].source == f"{source.name}/0/{offsets[b'r2']}"
        rejected = workbench.list(dead.name, reason="rejected")
        assert sorted(d.value or b"" for d in rejected) == [b"r1", b"r4"]
        assert workbench.replay(stream=dead.name, where="reason = 'rejected'") == 2
        assert workbench.replay(stream=dead.name, where="reason = 'rejected'") == 0
    again = [r for r in read_all(cluster, source) if (r.offset or 0) >= 6]
    assert sorted(r.data or b"" for r in again) == [b"r1", b"r4"]
    assert {r.header(REPLAYED_FROM_HEADER) for r in again} == {
        by_data[b"r1"].id.encode(),
        by_data[b"r4"].id.encode(),
    }


class _NoBad:
    """Cannot decode payloads that start with ``bad``."""

    def decode(self, data: bytes, **where: object) -> bytes:
        if data.startswith(b"bad"):
            raise ValueError("not decodable")
        return data


def _set_topic(cluster: Cluster, topic: str, name: str, value: str) -> None:
    entry = ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
    admin = admin_client(cluster)  # kept alive until the answer comes
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def test_a_dead_letter_not_published_keeps_the_record_and_the_poll(
    bolide_backend: tuple[str, Cluster], stream_factory: Callable[..., StreamConfig]
) -> None:
    engine, cluster = bolide_backend
    if engine == "tansu":
        pytest.skip("the embedded Tansu engine has no share groups (docs/compatibility.md)")
    source = stream_factory("jobs")
    # The dead letter stream refuses the letter (too large) until its limit is raised.
    dead = stream_factory("jobs-dlq", topic_config={"max.message.bytes": "2000"})
    bad = b"bad" + os.urandom(4_000)  # random: no compression brings it under the limit
    with Publisher(cluster, PublisherConfig(stream=source)) as pub:
        values = [b"r0", b"r1", bad, b"r3", b"r4"]
        pub.publish_many(Record(v) for v in values).result(30)  # one batch: one fetch
    config = SubscriberConfig(
        stream=source, share_group=f"g-{source.name}", serde=_NoBad(), dead_letter=dead,
        share_group_config={"share.record.lock.duration.ms": 60_000},
    )  # fmt: skip
    got: list[Record] = []
    with Subscriber(cluster, config) as sub:
        assert isinstance(sub, ShareSubscriber)
        eventually(lambda: ack_polled(sub, got, PublishError), timeout_s=30)
        with pytest.raises(PublishError):
            sub.poll(100)  # the same record again: nothing behind it jumps ahead
        _set_topic(cluster, dead.name, "max.message.bytes", "1048588")
        # Until the broker applies the new limit, polls fail as before.
        eventually(lambda: ack_polled(sub, got, PublishError) is None and len(got) >= 4, 30)
        sub.confirm()
        assert len(sub.poll(500)) == 0
    assert [r.data for r in got] == [b"r0", b"r1", b"r3", b"r4"]
    assert {r.delivery_count for r in got} == {1}
    [letter] = read_all(cluster, dead)
    assert letter.data == bad and letter.header(REASON_HEADER) == b"undecodable"
