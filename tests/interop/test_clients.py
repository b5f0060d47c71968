"""Clients no one here wrote, against what bolide writes and reads: kafka-python, aiokafka (a
consumer that joins a group) and Debian's kcat. Apache Kafka only (kcat cannot connect to
Tansu; the others are tested where the reference broker runs)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import Callable

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
from tests.conftest import eventually

pytestmark = [
    pytest.mark.kafka,
    # kafka-python loads its protocol schemas with a deprecated importlib.resources call.
    pytest.mark.filterwarnings("ignore:(open|read)_text is deprecated:DeprecationWarning"),
]

RECORDS = [
    Record(b"v0", key=b"k0", headers=[("h", b"a")]),
    Record(b"v1", key=b"k1", headers=[("h", b"b"), ("h", b"c")]),
    Record(b"v2", key=b"k0"),
]


@pytest.fixture(autouse=True)
def _reference_broker(bolide_backend: tuple[str, Cluster]) -> None:
    if bolide_backend[0] == "tansu":
        pytest.skip("interoperability is tested on Apache Kafka (kcat cannot reach Tansu)")


def publish(cluster: Cluster, stream: StreamConfig) -> list[Record]:
    records = [Record(r.data, key=r.key, headers=list(r.headers)) for r in RECORDS]
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for record in records:
            pub.publish(record)
    return records


def read(cluster: Cluster, stream: StreamConfig, count: int) -> list[Record]:
    config = SubscriberConfig(stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST)
    got: list[Record] = []
    with Subscriber(cluster, config) as sub:
        eventually(lambda: got.extend(sub.poll(200)) or len(got) >= count, 30)
    return got


def _user_headers(headers: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    return [(k, bytes(v)) for k, v in headers if not k.startswith("bolide.")]


def test_kafka_python_reads_what_bolide_writes_and_writes_what_it_reads(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    stream = stream_factory()
    written = publish(cluster, stream)
    consumer = KafkaConsumer(
        stream.name,
        bootstrap_servers=cluster.bootstrap_servers,
        auto_offset_reset="earliest",
        consumer_timeout_ms=15_000,
    )
    try:
        got = []
        for message in consumer:
            got.append(message)
            if len(got) == len(written):
                break
    finally:
        consumer.close()
    assert [(m.partition, m.offset) for m in got] == [(r.partition, r.offset) for r in written]
    assert [(m.key, m.value) for m in got] == [(r.key, r.data) for r in written]
    assert [_user_headers(m.headers) for m in got] == [list(r.headers) for r in written]

    back = stream_factory()
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap_servers)
    for r in RECORDS:
        producer.send(back.name, value=r.data, key=r.key, headers=list(r.headers))
    producer.flush(30)
    producer.close()
    read_back = read(cluster, back, len(RECORDS))
    assert [(r.key, r.data, r.headers) for r in read_back] == [
        (r.key, r.data, r.headers) for r in RECORDS
    ]


def test_aiokafka_group_member_reads_what_bolide_writes_and_bolide_reads_its_writes(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    stream = stream_factory()
    written = publish(cluster, stream)
    group = f"aio-{stream.name}"

    async def consume() -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]:
        consumer = AIOKafkaConsumer(
            stream.name,
            bootstrap_servers=cluster.bootstrap_servers,
            group_id=group,  # joins a consumer group, as services do
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            got = []
            deadline = time.monotonic() + 60
            while len(got) < len(written) and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=500)
                for messages in batches.values():
                    got += [(m.key, m.value, _user_headers(list(m.headers))) for m in messages]
            await consumer.commit()
            return got
        finally:
            await consumer.stop()

    got = asyncio.run(consume())
    assert got == [(r.key, r.data, list(r.headers)) for r in written]
    # The group's commit is where a bolide subscriber of that group goes on from.
    config = SubscriberConfig(stream=stream, group=group, lease_timeout_ms=6_000)
    with Subscriber(cluster, config) as sub:
        assert sub.committed() == {0: len(written)}

    back = stream_factory()

    async def produce() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap_servers)
        await producer.start()
        try:
            for r in RECORDS:
                await producer.send_and_wait(
                    back.name, value=r.data, key=r.key, headers=list(r.headers)
                )
        finally:
            await producer.stop()

    asyncio.run(produce())
    config = SubscriberConfig(
        stream=back,
        group=f"g-{back.name}",
        initial_offset_scheme=InitialOffsetScheme.EARLIEST,
        lease_timeout_ms=6_000,
    )
    with Subscriber(cluster, config) as sub:
        read_back: list[Record] = []
        eventually(lambda: read_back.extend(sub.poll(200)) or len(read_back) >= 3, 30)
    assert [(r.key, r.data, r.headers) for r in read_back] == [
        (r.key, r.data, r.headers) for r in RECORDS
    ]


def test_kcat_reads_what_bolide_writes_and_writes_what_it_reads(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.skip("kcat is not installed (Debian: apt-get install kcat)")
    stream = stream_factory()
    written = publish(cluster, stream)
    done = subprocess.run(
        [
            kcat,
            "-C",
            "-e",
            "-J",
            "-o",
            "beginning",
            "-b",
            cluster.bootstrap_servers,
            "-t",
            stream.name,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    got = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert [(m["partition"], m["offset"]) for m in got] == [
        (r.partition, r.offset) for r in written
    ]
    assert [(m["key"], m["payload"]) for m in got] == [
        (r.key.decode() if r.key else None, r.data.decode()) for r in written
    ]
    for message, record in zip(got, written, strict=True):
        pairs = message.get("headers") or []
        kcat_headers = list(zip(pairs[::2], pairs[1::2], strict=True))
        user = [(k, v.encode()) for k, v in kcat_headers if not k.startswith("bolide.")]
        assert user == list(record.headers)

    back = stream_factory()
    lines = "k0:one\nk1:two\nk0:three\n"
    subprocess.run(
        [kcat, "-b", cluster.bootstrap_servers, "-P", "-t", back.name, "-K:"],
        input=lines,
        text=True,
        timeout=60,
        check=True,
    )
    read_back = read(cluster, back, 3)
    assert [(r.key, r.data) for r in read_back] == [
        (b"k0", b"one"),
        (b"k1", b"two"),
        (b"k0", b"three"),
    ]
