"""Outbox fixtures: an upgraded SQLite file or PostgreSQL schema, the outbox on it, streams
whose topics exist, relays closed at teardown, and a reader of what reached Kafka."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from bolide.facade import (
    Cluster,
    InitialOffsetScheme,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.kafka import ensure_topic
from bolide.stores import Outbox, OutboxRelay, RelayConfig, SqlStore
from tests.conftest import DATABASES, eventually, upgraded_db_url

__all__ = ["read_stream", "sent_rows"]


@pytest.fixture(params=DATABASES)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An upgraded database: a SQLite file, or a fresh PostgreSQL schema."""
    return upgraded_db_url(request.param, tmp_path, request)


@pytest.fixture
def store(db_url: str) -> Iterator[SqlStore]:
    """The application's store (its engine runs the application's transactions too)."""
    with SqlStore(db_url) as s:
        yield s


@pytest.fixture
def outbox(store: SqlStore) -> Outbox:
    """The outbox on the application's database."""
    return Outbox(store)


@pytest.fixture
def topic(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> Callable[..., StreamConfig]:
    """``make(partitions=1)`` -> a stream whose topic exists (the relay never creates one)."""

    def make(partitions: int = 1) -> StreamConfig:
        stream = stream_factory(partitions=partitions, global_order=partitions == 1)
        ensure_topic(cluster, stream)
        return stream

    return make


@pytest.fixture
def relays(cluster: Cluster) -> Iterator[Callable[..., OutboxRelay]]:
    """``start(outbox, **RelayConfig kwargs)`` -> a running relay, closed at teardown (a
    failure it stopped on is the test's to check, not the teardown's)."""
    started: list[OutboxRelay] = []

    def start(outbox: Outbox, **kwargs: object) -> OutboxRelay:
        kwargs.setdefault("progress_interval_s", 1.0)
        relay = outbox.relay(cluster, RelayConfig(**kwargs))  # type: ignore[arg-type]
        started.append(relay)
        return relay

    yield start
    for relay in started:
        with contextlib.suppress(Exception):  # the test has checked what stopped it
            relay.close()


def read_stream(cluster: Cluster, stream: StreamConfig, count: int) -> list[Record]:
    """Every record of ``stream`` (``read_committed``), once at least ``count`` came and a
    poll found nothing more."""
    config = SubscriberConfig(
        stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST, max_batch=5_000
    )
    got: list[Record] = []
    with Subscriber(cluster, config) as sub:
        eventually(lambda: got.extend(sub.poll(500)) or len(got) >= count, 60)
        while batch := sub.poll(1_000):
            got.extend(batch)
    return got


def sent_rows(store: SqlStore) -> list[sa.Row[tuple[int, str, int | None, int | None, int | None]]]:
    """``(id, stream, kafka_partition, kafka_offset, sent_ms)`` of every outbox row, by id."""
    with store.engine.connect() as conn:
        return list(
            conn.execute(
                sa.text(
                    "SELECT id, stream, kafka_partition, kafka_offset, sent_ms "
                    "FROM bolide_outbox ORDER BY id"
                )
            )
        )
