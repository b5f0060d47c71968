"""Clients no one here wrote, against what bolide writes and reads: kafka-python, aiokafka (a
consumer that joins a group) and Debian's kcat. All run on Apache Kafka; on the embedded Tansu
engine all but kcat, which cannot connect to it."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest

from bolide.facade import (
    Cluster,
    InitialOffsetScheme,
    Publisher,
    PublisherConfig,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.kafka import ensure_topic
from tests.conftest import eventually

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.tansu,
    # kafka-python loads its protocol schemas with a deprecated importlib.resources call.
    pytest.mark.filterwarnings("ignore:(open|read)_text is deprecated:DeprecationWarning"),
]

#: Written to a stream of PARTITIONS partitions; the keys put them on more than one.
RECORDS = [
    Record(b"v0", key=b"k0", headers=[("h", b"a")]),
    Record(b"v1", key=b"k1", headers=[("h", b"b"), ("h", b"c")]),
    Record(b"v2", key=b"k0"),
    Record(b"v3", key=b"k1", headers=[("other", b"")]),
]
PARTITIONS = 3
LEASE_MS = 6_000

#: One record as every client sees it: (partition, offset, key, value, headers without bolide's).
Row = tuple[int, int, bytes | None, bytes, list[tuple[str, bytes]]]


@pytest.fixture
def kcat(bolide_backend: tuple[str, Cluster]) -> str:
    """The kcat binary; skips on Tansu, which kcat cannot connect to, or where it is missing."""
    if bolide_backend[0] == "tansu":
        pytest.skip("kcat cannot connect to the embedded Tansu engine; tested on Apache Kafka")
    path = shutil.which("kcat")
    if path is None:
        pytest.skip("kcat is not installed (Debian: apt-get install kcat)")
    return path


@pytest.fixture
def make_stream(stream_factory: Callable[..., StreamConfig]) -> Callable[[], StreamConfig]:
    return lambda: stream_factory(partitions=PARTITIONS, global_order=False)


def user_headers(headers: Any) -> list[tuple[str, bytes]]:
    return [(k, bytes(v)) for k, v in headers or () if not k.startswith("bolide.")]


def row(r: Record) -> Row:
    assert r.partition is not None and r.offset is not None
    return (r.partition, r.offset, r.key, r.data, user_headers(r.headers))


def in_log_order(rows: list[Row]) -> list[Row]:
    """Across partitions, readers interleave as they like: compare by (partition, offset)."""
    return sorted(rows, key=lambda x: (x[0], x[1]))


def publish(cluster: Cluster, stream: StreamConfig) -> list[Row]:
    records = [Record(r.data, key=r.key, headers=list(r.headers)) for r in RECORDS]
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for record in records:
            pub.publish(record)
    rows = [row(r) for r in records]
    assert len({partition for partition, *_ in rows}) > 1
    return in_log_order(rows)


def read(cluster: Cluster, stream: StreamConfig, count: int, group: str | None = None) -> list[Row]:
    config = SubscriberConfig(
        stream=stream,
        group=group,
        initial_offset_scheme=InitialOffsetScheme.EARLIEST,
        lease_timeout_ms=LEASE_MS,
    )
    got: list[Record] = []
    with Subscriber(cluster, config) as sub:
        eventually(lambda: got.extend(sub.poll(200)) or len(got) >= count, 60)
    assert len(got) == count
    return in_log_order([row(r) for r in got])


def expected_commits(rows: list[Row]) -> dict[int, int | None]:
    """A group that read ``rows`` commits the next offset per partition; None where empty."""
    commits: dict[int, int | None] = dict.fromkeys(range(PARTITIONS))
    for partition, offset, *_ in rows:
        commits[partition] = max(commits[partition] or 0, offset + 1)
    return commits


def test_kafka_python_reads_what_bolide_writes_and_writes_what_it_reads(
    cluster: Cluster, make_stream: Callable[[], StreamConfig]
) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    stream = make_stream()
    written = publish(cluster, stream)
    consumer = KafkaConsumer(
        stream.name,
        bootstrap_servers=cluster.bootstrap_servers,
        auto_offset_reset="earliest",
        consumer_timeout_ms=30_000,  # a deadline: iteration ends by then even if records miss
    )
    try:
        got: list[Row] = []
        for m in consumer:
            got.append((m.partition, m.offset, m.key, m.value, user_headers(m.headers)))
            if len(got) == len(written):
                break
    finally:
        consumer.close()
    assert in_log_order(got) == written

    back = make_stream()
    ensure_topic(cluster, back)  # bolide's partitions, not the broker's auto-created default
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap_servers)
    try:
        futures = [
            (r, producer.send(back.name, value=r.data, key=r.key, headers=list(r.headers)))
            for r in RECORDS
        ]
        sent = [(f.get(timeout=30), r) for r, f in futures]
    finally:
        producer.close()
    assert read(cluster, back, len(RECORDS)) == in_log_order(
        [(md.partition, md.offset, r.key, r.data, list(r.headers)) for md, r in sent]
    )


def test_aiokafka_group_member_reads_what_bolide_writes_and_bolide_reads_its_writes(
    cluster: Cluster, make_stream: Callable[[], StreamConfig]
) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    stream = make_stream()
    written = publish(cluster, stream)
    group = f"aio-{stream.name}"

    async def consume() -> list[Row]:
        consumer = AIOKafkaConsumer(
            stream.name,  # subscribes: joins the group and gets its partitions from it
            bootstrap_servers=cluster.bootstrap_servers,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            got: list[Row] = []
            deadline = time.monotonic() + 60
            while len(got) < len(written) and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=500)
                for messages in batches.values():
                    got += [
                        (m.partition, m.offset, m.key, m.value, user_headers(m.headers))
                        for m in messages
                    ]
            await consumer.commit()
            return got
        finally:
            await consumer.stop()

    assert in_log_order(asyncio.run(consume())) == written
    # The group's commit is where a bolide subscriber of that group goes on from. aiokafka
    # commits its position on every partition it holds, 0 on the one it read nothing from.
    config = SubscriberConfig(stream=stream, group=group, lease_timeout_ms=LEASE_MS)
    with Subscriber(cluster, config) as sub:
        assert sub.committed() == {p: c or 0 for p, c in expected_commits(written).items()}
        with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
            pub.publish(late := Record(b"late", key=RECORDS[0].key))
        after: list[Record] = []
        eventually(lambda: after.extend(sub.poll(200)) or any(r.data == b"late" for r in after), 60)
        assert [row(r) for r in after] == [row(late)]

    back = make_stream()
    ensure_topic(cluster, back)

    async def produce() -> list[Row]:
        producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap_servers)
        await producer.start()
        try:
            rows: list[Row] = []
            for r in RECORDS:
                md = await producer.send_and_wait(
                    back.name, value=r.data, key=r.key, headers=list(r.headers)
                )
                rows.append((md.partition, md.offset, r.key, r.data, list(r.headers)))
            return rows
        finally:
            await producer.stop()

    sent = in_log_order(asyncio.run(produce()))
    assert read(cluster, back, len(RECORDS), group=f"g-{back.name}") == sent


def test_a_bolide_group_and_a_kafka_python_member_see_each_others_commits(
    cluster: Cluster, make_stream: Callable[[], StreamConfig]
) -> None:
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    stream = make_stream()
    written = publish(cluster, stream)
    group = f"shared-{stream.name}"
    config = SubscriberConfig(
        stream=stream,
        group=group,
        initial_offset_scheme=InitialOffsetScheme.EARLIEST,
        lease_timeout_ms=LEASE_MS,
    )
    with Subscriber(cluster, config) as sub:
        got: list[Record] = []
        eventually(lambda: got.extend(sub.poll(200)) or len(got) >= len(written), 60)
        sub.confirm()
        eventually(lambda: sub.committed() == expected_commits(written), 60)

    parts = [TopicPartition(stream.name, p) for p in range(PARTITIONS)]
    member = KafkaConsumer(
        bootstrap_servers=cluster.bootstrap_servers, group_id=group, enable_auto_commit=False
    )
    try:
        # bolide's confirms, as kafka-python sees the group's offsets.
        assert {tp.partition: member.committed(tp) for tp in parts} == expected_commits(written)
        # kafka-python moves one partition back by its last record and commits an empty one.
        moved, last, *_ = max(written, key=lambda x: x[1])  # the last record of a partition
        empty = next(p for p, c in expected_commits(written).items() if c is None)
        member.assign(parts)
        member.commit(
            {
                TopicPartition(stream.name, moved): OffsetAndMetadata(last, "", -1),
                TopicPartition(stream.name, empty): OffsetAndMetadata(0, "", -1),
            }
        )
    finally:
        member.close(autocommit=False)

    after = {**expected_commits(written), moved: last, empty: 0}
    with Subscriber(cluster, config) as sub:
        assert sub.committed() == after
        again: list[Record] = []
        eventually(lambda: again.extend(sub.poll(200)) or again, 60)
        assert [row(r) for r in again] == [x for x in written if x[:2] == (moved, last)]


def test_kcat_reads_what_bolide_writes_and_writes_what_it_reads(
    cluster: Cluster, make_stream: Callable[[], StreamConfig], kcat: str
) -> None:
    stream = make_stream()
    written = publish(cluster, stream)
    consume = [kcat, "-b", cluster.bootstrap_servers, "-C", "-t", stream.name, "-e"]

    as_json = subprocess.run(
        [*consume, "-J"], capture_output=True, text=True, timeout=60, check=True
    )
    got: list[Row] = []
    for line in as_json.stdout.splitlines():
        m = json.loads(line)
        pairs = m.get("headers") or []
        headers = [(k, v.encode()) for k, v in zip(pairs[::2], pairs[1::2], strict=True)]
        key = m["key"].encode() if m["key"] is not None else None
        got.append((m["partition"], m["offset"], key, m["payload"].encode(), headers))
    assert in_log_order([(p, o, k, v, user_headers(h)) for p, o, k, v, h in got]) == written

    formatted = subprocess.run(
        [*consume, "-f", "%p %o %k %s %h\n"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    fields = sorted(
        (line.split(" ", 4) for line in formatted.stdout.splitlines()),
        key=lambda f: (int(f[0]), int(f[1])),
    )
    # kcat prints headers as name=value,name=value (nothing when there are none).
    assert [
        (
            int(p),
            int(o),
            k.encode(),
            v.encode(),
            [h for h in hs.split(",") if h and not h.startswith("bolide.")],
        )
        for p, o, k, v, hs in fields
    ] == [(p, o, k, v, [f"{n}={b.decode()}" for n, b in hs]) for p, o, k, v, hs in written]

    back = make_stream()
    ensure_topic(cluster, back)
    subprocess.run(
        [kcat, "-b", cluster.bootstrap_servers, "-P", "-t", back.name, "-K:", "-H", "via=kcat"],
        input="k0:one\nk1:two\nk0:three\n",
        text=True,
        timeout=60,
        check=True,
    )
    read_back = read(cluster, back, 3)
    by_key = {
        key: [(value, headers) for _, _, k, value, headers in read_back if k == key]
        for key in (b"k0", b"k1")
    }
    # Each key's records keep kcat's order (one key, one partition).
    assert by_key == {
        b"k0": [(b"one", [("via", b"kcat")]), (b"three", [("via", b"kcat")])],
        b"k1": [(b"two", [("via", b"kcat")])],
    }
