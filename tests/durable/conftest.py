"""Durable client fixtures: a registry on a real SQLite file or PostgreSQL schema, and clients.

Every client uses a 4 s lease: the embedded broker's group join takes about half of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bolide.facade import (
    Cluster,
    Publisher,
    PublisherConfig,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.stores.durable_registry import SqlDurableRegistry
from tests.aio.adapter import SYNC
from tests.conftest import DATABASES, upgraded_db_url

__all__ = ["LEASE_MS", "LIVE", "Events", "publish"]

LEASE_MS = 4_000
LIVE = "LIVE"


@pytest.fixture(params=DATABASES)
def registry_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An upgraded database (SQLite file or PostgreSQL schema) for the registry."""
    return upgraded_db_url(request.param, tmp_path, request)


@pytest.fixture
def sqlite_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An upgraded SQLite file, for tests whose point is not the database."""
    return upgraded_db_url("sqlite", tmp_path, request)


@pytest.fixture
def registry(registry_url: str) -> Iterator[SqlDurableRegistry]:
    """A registry on SQLite and on PostgreSQL."""
    with SqlDurableRegistry(registry_url) as reg:
        yield reg


@pytest.fixture
def sqlite_registry(sqlite_url: str) -> Iterator[SqlDurableRegistry]:
    """A registry on a SQLite file."""
    with SqlDurableRegistry(sqlite_url) as reg:
        yield reg


class Events:
    """What a durable client saw, in order: records as (partition, offset, replayed, data)
    and ``LIVE`` where ``on_live`` was called."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def on_live(self) -> None:
        self.items.append(LIVE)

    def records(self, *, replayed: bool | None = None) -> list[tuple[int, int, bool, bytes]]:
        return [
            e for e in self.items if isinstance(e, tuple) and (replayed is None or e[2] is replayed)
        ]

    def live_count(self) -> int:
        return self.items.count(LIVE)

    def drain(self, sub: Subscriber, until: Callable[[], bool], timeout_s: float = 30) -> None:
        """Poll ``sub`` until ``until()`` holds (fail after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while not until():
            assert time.monotonic() < deadline, f"not reached in {timeout_s}s: {self.items[-5:]}"
            for r in sub.poll(100):
                assert r.partition is not None and r.offset is not None
                self.items.append((r.partition, r.offset, r.replayed, r.data))


def publish(cluster: Cluster, stream: StreamConfig, n: int, prefix: str) -> list[int]:
    """Publish ``n`` records ``prefix-i``; return their offsets."""
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        futures = [pub.publish_async(Record(f"{prefix}-{i}".encode())) for i in range(n)]
        pub.flush(timeout_s=30)
        return [f.result(timeout=30) for f in futures]


@pytest.fixture
def durable(
    cluster: Cluster, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Subscriber]]:
    """``make(stream, durable_id, registry, cluster=None, **SubscriberConfig kwargs)``, on the
    session's cluster unless another is given, of the API under test when the test takes
    ``api``; closed at teardown."""
    api = request.getfixturevalue("api") if "api" in request.fixturenames else SYNC
    # Registries the test takes are set up first so that they are torn down last: a
    # subscriber's heartbeat and close must never reconnect a registry already closed.
    for name in ("registry", "sqlite_registry"):
        if name in request.fixturenames:
            request.getfixturevalue(name)
    opened: list[Subscriber] = []
    session_cluster = cluster

    def make(
        stream: StreamConfig,
        durable_id: str,
        registry: Any,
        cluster: Cluster | None = None,
        **kwargs: Any,
    ) -> Subscriber:
        kwargs.setdefault("lease_timeout_ms", LEASE_MS)
        sub = api.Subscriber(
            cluster or session_cluster,
            SubscriberConfig(
                stream=stream, durable_id=durable_id, durable_registry=registry, **kwargs
            ),
        )
        opened.append(sub)
        return sub

    yield make
    for sub in opened:
        sub.close()
        if sub.stream.store is not None:
            sub.stream.store.close()  # type: ignore[attr-defined]
