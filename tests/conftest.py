"""Shared fixtures: one Kafka for the session (see bolide.testing), fresh streams per test."""

from __future__ import annotations

import concurrent.futures.thread
import contextlib
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from bolide.facade import Cluster, StreamConfig
from tests.aio.adapter import SYNC, Api, LoopThread, aio_api

#: Test folders whose files share a heavy session resource (one SparkSession and one standalone
#: cluster per process): under pytest-xdist they run in one worker, not one copy per worker.
_ONE_WORKER = ("tests/spark/",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``pytest -n N --dist loadgroup`` (``./dev test``) a file's tests stay in one worker,
    so module fixtures start once, and the folders in ``_ONE_WORKER`` share one worker."""
    if getattr(config.option, "dist", "no") != "loadgroup":
        return
    root = config.rootpath
    for item in items:
        path = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
        group = next((folder for folder in _ONE_WORKER if path.startswith(folder)), path)
        item.add_marker(pytest.mark.xdist_group(group or item.nodeid.split("::")[0]))


def pytest_unconfigure(config: pytest.Config) -> None:
    """A thread a failed test left running must not keep the interpreter (and CI) alive: name
    it and exit with a failure instead of waiting on it for ever."""
    # Executor workers end at exit on their own (concurrent.futures joins them).
    pooled = set(getattr(concurrent.futures.thread, "_threads_queues", {}))
    leaked = [
        t
        for t in threading.enumerate()
        if t is not threading.main_thread() and not t.daemon and t not in pooled
    ]
    for thread in leaked:
        thread.join(5)
    leaked = [t for t in leaked if t.is_alive()]
    if leaked:
        names = ", ".join(t.name for t in leaked)
        sys.stderr.write(f"\ntests left non-daemon threads running: {names}\n")
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)


@pytest.fixture(scope="session")
def bolide_backend(bolide_backend: tuple[str, Cluster]) -> tuple[str, Cluster]:
    """The plugin's broker, warmed up: a fresh broker answers metadata before it has loaded
    the group coordinator or handed out a producer id, and the first test that needs either
    must not pay for it inside its own timeouts."""
    from bolide.facade import Publisher, PublisherConfig, Record, Subscriber, SubscriberConfig

    stream = StreamConfig(name=f"warm-up-{uuid.uuid4().hex[:10]}")
    with Publisher(bolide_backend[1], PublisherConfig(stream=stream)) as pub:
        pub.publish(Record(b"warm-up"))
    config = SubscriberConfig(stream=stream, group=stream.name, lease_timeout_ms=10_000)
    with Subscriber(bolide_backend[1], config) as sub:
        eventually(sub.is_assigned, 120)
    return bolide_backend


@pytest.fixture(scope="session")
def cluster(bolide_cluster: Cluster) -> Cluster:
    """The session's Kafka cluster (external, testcontainers or embedded)."""
    return bolide_cluster


#: The PostgreSQL database the tests create their schemas in.
PG_ADMIN_URL = os.environ.get("BOLIDE_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")

#: Parameters for tests that run on both databases.
DATABASES = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
]


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[sa.Engine]:
    """An engine on the test PostgreSQL database, for creating and dropping schemas."""
    engine = sa.create_engine(PG_ADMIN_URL, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def apicurio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a real schema registry (Apicurio's Confluent-compatible API), once per run."""
    from tests.schemas.apicurio import Apicurio

    server = Apicurio(tmp_path_factory.mktemp("apicurio") / "apicurio.log")
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


#: The registries a Confluent client talks to in the interop tests: confluent-kafka's mock, and
#: a real server.
CONFLUENT_REGISTRIES = ["mock", pytest.param("apicurio", marks=pytest.mark.registry_server)]


@pytest.fixture(params=CONFLUENT_REGISTRIES)
def confluent_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh ``mock://`` registry, or the real server emptied after the test."""
    if request.param == "mock":
        yield f"mock://{uuid.uuid4().hex}"
        return
    url: str = request.getfixturevalue("apicurio")
    yield url
    _empty(url)


def _empty(url: str) -> None:
    """Delete every subject of a registry server (soft, then for good)."""
    import json
    import urllib.request

    with urllib.request.urlopen(f"{url}/subjects", timeout=10) as answer:
        subjects = json.loads(answer.read())
    for subject in subjects:
        for query in ("", "?permanent=true"):
            quoted = urllib.parse.quote(subject, safe="")
            request = urllib.request.Request(f"{url}/subjects/{quoted}{query}", method="DELETE")
            with contextlib.suppress(OSError):
                urllib.request.urlopen(request, timeout=10).close()


def make_db_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A URL to an empty database of ``kind``: a SQLite file, or a fresh PostgreSQL schema
    (selected through the URL's ``search_path`` option and dropped at teardown)."""
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'history.db'}"
    admin: sa.Engine = request.getfixturevalue("pg_admin")
    schema = f"t_{uuid.uuid4().hex[:16]}"
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))

    request.addfinalizer(drop)
    return f"{PG_ADMIN_URL}?options=-csearch_path%3D{schema}"


@pytest.fixture(params=DATABASES)
def sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A ``SqlStore`` at the newest schema: a SQLite file, or a fresh PostgreSQL schema."""
    from bolide.stores import SqlStore

    with SqlStore(make_db_url(request.param, tmp_path, request)) as store:
        store.upgrade()
        yield store


def upgraded_db_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """``make_db_url``, with the schema upgraded to the newest revision."""
    from bolide.stores import SqlStore

    url = make_db_url(kind, tmp_path, request)
    with SqlStore(url) as store:
        store.upgrade()
    return url


@pytest.fixture(scope="session")
def embedded_broker(bolide_backend: tuple[str, Cluster]) -> bool:
    """True when the tests run on the embedded Tansu engine, with its deviations
    (docs/compatibility.md); False on Apache Kafka, embedded or not."""
    return bolide_backend[0] == "tansu"


@pytest.fixture
def stream_factory(
    bolide_stream_factory: Callable[..., StreamConfig],
) -> Callable[..., StreamConfig]:
    """``make(**StreamConfig kwargs)`` -> a stream with a fresh topic name."""
    return bolide_stream_factory


@pytest.fixture
def cluster_with_starts(
    cluster: Cluster, bolide_backend: tuple[str, Cluster]
) -> Callable[[Mapping[str, Mapping[int, int]]], Cluster]:
    """``cluster_with_starts({topic: {0: 20}})``: the session's cluster with partition 0 of
    ``topic`` starting at offset 20, the records below gone from Kafka.

    On Apache Kafka the log is trimmed for real (DeleteRecords) and the cluster returned as it
    is; Tansu cannot trim, so there the returned cluster's clients take the log to start there
    (``Cluster.log_start_overrides``).
    """
    if bolide_backend[0] == "tansu":
        return lambda starts: cluster.replace(log_start_overrides=starts)

    def trim(starts: Mapping[str, Mapping[int, int]]) -> Cluster:
        from confluent_kafka import TopicPartition

        from bolide.facade.kafka import admin_client

        wanted = [TopicPartition(t, p, o) for t, parts in starts.items() for p, o in parts.items()]
        admin = admin_client(cluster)  # held: its futures never resolve once it is collected
        for future in admin.delete_records(wanted, request_timeout=30).values():
            future.result(timeout=60)
        return cluster

    return trim


@contextlib.contextmanager
def http_served(handler: Callable[..., Any]) -> Iterator[int]:
    """An HTTP server of ``handler`` (a ``BaseHTTPRequestHandler`` class or factory) on a
    free port of 127.0.0.1, in a thread; its port."""
    from http.server import ThreadingHTTPServer

    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def eventually(check: Callable[[], Any], timeout_s: float = 10.0, interval_s: float = 0.05) -> Any:
    """Retry ``check`` until it returns a truthy value; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s: {check}")
        time.sleep(interval_s)


def ack_polled(sub: Any, got: list[Any], error: type[Exception]) -> Exception | None:
    """One poll of a share subscriber, each record kept in ``got`` and acked; the ``error``
    the poll raised instead, if it did."""
    try:
        batch = sub.poll(100)
    except error as exc:
        return exc
    for record in batch:
        got.append(record)
        sub.ack(record)
    return None


@pytest.fixture(scope="session")
def aio_loop() -> Iterator[LoopThread]:
    """One event loop in a background thread for every asyncio client of the session."""
    loop = LoopThread()
    yield loop
    loop.close()


@pytest.fixture(params=["sync", "aio"])
def api(request: pytest.FixtureRequest) -> Api:
    """The API under test: the sync classes, or the asyncio ones behind the same calls
    (``tests/aio/adapter.py``), so one test body checks both."""
    if request.param == "sync":
        return SYNC
    return aio_api(request.getfixturevalue("aio_loop"))
