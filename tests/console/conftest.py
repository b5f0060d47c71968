"""The console's fixtures: an estate to look at (a stream archived and then trimmed in Kafka,
records past the archive, a group with lag, dead letters) and consoles over it."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from bolide.console.app import create_app
from bolide.console.settings import ConsoleSettings
from bolide.facade import Cluster, Publisher, PublisherConfig, Record, StreamConfig
from bolide.facade.deadletter import Reason, letter
from bolide.facade.kafka import CONSUMER_DEFAULTS
from bolide.stores import Archiver, SqlStore
from tests.conftest import DATABASES, make_db_url

pytestmark = [pytest.mark.kafka]

#: The payload whose escaping the pages are checked for.
SCRIPT = b"<script>window.__pwned = 1</script>"
TOKEN = "a-console-token-of-thirty-chars"


@dataclass(frozen=True)
class Estate:
    """What the console is pointed at."""

    cluster: Cluster
    db: str
    stream: str  # 30 records, 0-19 archived and gone from Kafka, 20-29 archived; 30-34 not
    dlq: str  # 2 dead letters of ``stream``
    group: str  # committed at 10 on ``stream``: lag 25


@pytest.fixture(params=DATABASES)
def estate(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    cluster: Cluster,
    stream_factory: Callable[..., StreamConfig],
    cluster_with_starts: Callable[..., Cluster],
) -> Estate:
    db = make_db_url(request.param, tmp_path, request)
    stream = stream_factory(name_prefix="console")
    dlq = stream_factory(name_prefix="console-dlq")
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(30):
            value = SCRIPT if i == 7 else b"order %d" % i
            headers = [("trace", b"t-%d" % i)]
            pub.publish_async(Record(value, key=b"k%d" % (i % 10), headers=headers))
        assert pub.flush(60) == 0
    with SqlStore(db) as store:
        store.upgrade()
        Archiver(
            cluster, store, [stream], group=f"arch-{uuid.uuid4().hex[:8]}",
            consumer_config={"session.timeout.ms": 6000},
        ).run(until_caught_up=True)  # fmt: skip
    cluster_with_starts({stream.name: {0: 20}})
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(30, 35):
            pub.publish_async(Record(b"order %d" % i, key=b"k%d" % (i % 10)))
        assert pub.flush(60) == 0
    with Publisher(cluster, PublisherConfig(stream=dlq)) as pub:
        for offset in (3, 4):
            failed = Record(b"order %d" % offset, key=b"k%d" % offset)
            pub.publish_async(letter(failed, Reason.FAILED, "boom", f"{stream.name}/0/{offset}"))
        assert pub.flush(60) == 0
    group = f"console-g-{uuid.uuid4().hex[:8]}"
    owner = Consumer(cluster.client_config(CONSUMER_DEFAULTS, {"group.id": group}))
    try:
        owner.commit(offsets=[TopicPartition(stream.name, 0, 10)], asynchronous=False)
    finally:
        owner.close()
    return Estate(cluster, db, stream.name, dlq.name, group)


@pytest.fixture
def console_of(estate: Estate) -> Iterator[Callable[..., object]]:
    """``console_of(sample=False, **settings)``: a started console (a Starlette test client)
    over the estate, sampling group lags when ``sample``."""
    from starlette.testclient import TestClient

    clients: list[TestClient] = []

    def make(*, sample: bool = False, **settings: object) -> TestClient:
        options = {"db": estate.db, **settings}
        app = create_app(ConsoleSettings(estate.cluster, **options), sample=sample)  # type: ignore[arg-type]
        client = TestClient(app, base_url="http://127.0.0.1:8080")
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)
