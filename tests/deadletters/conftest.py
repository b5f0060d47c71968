"""Dead letters made the way applications make them: a receiver whose handler keeps failing
(``Retry``, then ``dead_letter=Publisher``) and a serde that cannot decode some payloads
(``SubscriberConfig(dead_letter=...)``), on a real broker; the history store on a real SQLite
file and a real PostgreSQL schema.

The dead-letter stream of ``letters`` ends up in three parts: offsets 0-1 only in the archive
(Kafka's log starts at 2: trimmed for real on Apache Kafka, emulated on Tansu), 2-3 archived
and still in Kafka, 4-7 only in Kafka.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bolide.facade import (
    Cluster,
    InitialOffsetScheme,
    Publisher,
    PublisherConfig,
    Record,
    Retry,
    SerializationError,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.kafka import admin_client, log_ends, log_starts, partition_count, probe_consumer
from bolide.stores import Archiver, DeadLetters, SqlStore
from tests.conftest import DATABASES, eventually, upgraded_db_url

__all__ = ["ARCHIVE_ONLY", "JsonSerde", "Letters", "end_of", "log_start", "read_all"]

#: Offsets of the dead-letter stream below Kafka's log start: only the archive holds them.
ARCHIVE_ONLY = 2


class JsonSerde:
    """A JSON serde: payloads that are not JSON are dead-lettered as undecodable."""

    def encode(self, obj: Any, *, stream: str) -> bytes:
        return json.dumps(obj).encode()

    def decode(self, data: bytes, *, stream: str, partition: int | None, offset: int | None) -> Any:
        try:
            return json.loads(data)
        except ValueError as exc:
            raise SerializationError(
                f"not JSON: {exc}", stream=stream, partition=partition, offset=offset
            ) from None


def end_of(cluster: Cluster, stream: str) -> int:
    """The end of partition 0 of ``stream``."""
    return log_ends(cluster, stream, [0])[0]


def log_start(cluster: Cluster, stream: str) -> int:
    """The log start of partition 0 of ``stream``."""
    consumer = probe_consumer(cluster)
    try:
        return log_starts(consumer, stream, [0], cluster=cluster)[0]
    finally:
        consumer.close()


def read_all(cluster: Cluster, stream: StreamConfig) -> list[Record]:
    """Every record of partition 0 of ``stream`` (up to its end now); none when the stream
    does not exist (nothing created it)."""
    if partition_count(admin_client(cluster), stream.name) is None:
        return []
    end = end_of(cluster, stream.name)
    config = SubscriberConfig(stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST)
    got: list[Record] = []
    if end == 0:
        return got
    with Subscriber(cluster, config) as sub:

        def reached() -> bool:
            got.extend(sub.poll(100))
            return bool(got) and (got[-1].offset or 0) >= end - 1

        eventually(reached, 30)
    return got


@dataclass
class Letters:
    """A dead-letter stream made by a failing receiver and a serde, half archived."""

    source: StreamConfig
    dead: StreamConfig
    cluster: Cluster  # Kafka holds ``dead`` from ARCHIVE_ONLY on
    store: SqlStore
    db_url: str
    workbench: DeadLetters
    #: Source offsets of the records that failed (handler) and of those not JSON.
    failed: set[int]
    undecodable: set[int]
    #: Epoch ms between the two rounds: dead letters 4-7 are later.
    second_round_ms: int


def _round(pub: Publisher, first: int) -> tuple[set[int], set[int]]:
    """Publish 8 records: i % 4 == 1 is not JSON, i % 4 == 3 makes the handler fail."""
    failed, undecodable = set(), set()
    for i in range(first, first + 8):
        if i % 4 == 1:
            offset = pub.publish(Record(b"{not json %d" % i, key=b"k%d" % (i % 3)))
            undecodable.add(offset)
        else:
            body = json.dumps({"n": i, "fail": i % 4 == 3}).encode()
            offset = pub.publish(Record(body, key=b"k%d" % (i % 3), headers={"trace": f"t{i}"}))
            if i % 4 == 3:
                failed.add(offset)
    return failed, undecodable


def _handler(record: Record) -> None:
    if record.value["fail"]:
        raise RuntimeError(f"cannot bill order {record.value['n']}")


@pytest.fixture(params=DATABASES)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An upgraded database: a SQLite file, or a fresh PostgreSQL schema."""
    return upgraded_db_url(request.param, tmp_path, request)


@pytest.fixture
def letters(
    cluster: Cluster,
    stream_factory: Callable[..., StreamConfig],
    cluster_with_starts: Callable[[Any], Cluster],
    db_url: str,
) -> Iterator[Letters]:
    """Eight dead letters (four failed, four undecodable); 0-3 archived, 0-1 only there."""
    source, dead = stream_factory("orders"), stream_factory("orders-dlq")
    earliest = InitialOffsetScheme.EARLIEST
    config = SubscriberConfig(
        stream=source, serde=JsonSerde(), dead_letter=dead, initial_offset_scheme=earliest
    )
    retry = Retry(attempts=2, backoff_s=0.01, max_backoff_s=0.05)
    store = SqlStore(db_url)
    with (
        Publisher(cluster, PublisherConfig(stream=source)) as pub,
        Publisher(cluster, PublisherConfig(stream=dead)) as letters_out,
        Subscriber(cluster, config) as sub,
    ):
        sub.attach_receiver(_handler, concurrency=2, retry=retry, dead_letter=letters_out)
        failed, undecodable = _round(pub, 0)
        eventually(lambda: end_of(cluster, dead.name) >= 4, 60)
        with Archiver(cluster, store, [dead], group=f"arch-{dead.name}") as archiver:
            archiver.run(until_caught_up=True)
        second_round_ms = int(time.time() * 1000)
        more_failed, more_undecodable = _round(pub, 8)
        eventually(lambda: end_of(cluster, dead.name) >= 8, 60)
    trimmed = cluster_with_starts({dead.name: {0: ARCHIVE_ONLY}})
    yield Letters(
        source=source,
        dead=dead,
        cluster=trimmed,
        store=store,
        db_url=db_url,
        workbench=DeadLetters(store, trimmed),
        failed=failed | more_failed,
        undecodable=undecodable | more_undecodable,
        second_round_ms=second_round_ms,
    )
    store.close()
