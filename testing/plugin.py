"""Pytest plugin for bolide users (entry point ``pytest11``), like Meteor's assurance module.

Fixtures:
    bolide_cluster: a session-wide ``Cluster``: ``BOLIDE_TEST_BOOTSTRAP`` when set, else an
        ``EmbeddedBroker`` of the engine ``BOLIDE_TEST_ENGINE`` names (``kafka``, ``tansu``),
        else a testcontainers Kafka when a Docker engine answers, else an ``EmbeddedBroker``
        with ``engine="auto"`` (Apache Kafka when it can run here, else Tansu). An embedded
        Apache Kafka runs the group settings ``BOLIDE_TEST_GROUP_SETTINGS`` names: ``fast``
        (the default: groups form at once, leases down to 500 ms) or ``stock`` (Kafka's own).
    bolide_broker: the session's ``EmbeddedBroker``, or ``None`` on an external or
        testcontainers Kafka.
    bolide_stream_factory: ``make(name_prefix="s", **stream_kwargs) -> StreamConfig`` with a
        fresh, unique topic name per call.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bolide.facade.broker import GROUP_SETTINGS, EmbeddedBroker, EngineName, GroupSettings
from bolide.facade.config import Cluster, StreamConfig

__all__ = [
    "bolide_backend",
    "bolide_broker",
    "bolide_cluster",
    "bolide_stream_factory",
    "cluster_backend",
]

log = logging.getLogger(__name__)

StreamFactory = Callable[..., StreamConfig]


def _docker_engine_answers() -> bool:
    """True when a Docker engine accepts connections (DOCKER_HOST or the default socket)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        if host.startswith("unix://"):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(2)
                sock.connect(host[len("unix://") :])
        elif host.startswith("tcp://"):
            address, _, port = host[len("tcp://") :].partition(":")
            with socket.create_connection((address, int(port or 2375)), timeout=2):
                pass
        else:
            return False
    except OSError:
        return False
    return True


def _docker_kafka() -> Iterator[Cluster] | None:
    """A testcontainers Kafka, or ``None`` when no Docker engine answers."""
    if not _docker_engine_answers():
        return None
    try:
        from testcontainers.community.kafka import KafkaContainer
    except ImportError:
        try:
            from testcontainers.kafka import KafkaContainer
        except ImportError:
            return None

    def run() -> Iterator[Cluster]:
        with KafkaContainer() as kafka:
            yield Cluster(kafka.get_bootstrap_server())

    return run()


def _group_settings() -> GroupSettings:
    """The embedded broker's group settings: ``BOLIDE_TEST_GROUP_SETTINGS``, ``fast`` unset."""
    chosen = os.environ.get("BOLIDE_TEST_GROUP_SETTINGS") or "fast"
    if chosen not in GROUP_SETTINGS:
        raise pytest.UsageError(
            f"BOLIDE_TEST_GROUP_SETTINGS must be {' or '.join(GROUP_SETTINGS)}, not {chosen!r}"
        )
    return chosen  # type: ignore[return-value]  # checked just above


def _embedded(engine: EngineName) -> Iterator[tuple[str, Cluster, EmbeddedBroker | None]]:
    with EmbeddedBroker(engine=engine, group_settings=_group_settings()) as broker:
        yield broker.engine, broker.cluster(), broker


def _backends() -> Iterator[tuple[str, Cluster, EmbeddedBroker | None]]:
    external = os.environ.get("BOLIDE_TEST_BOOTSTRAP")
    if external:
        yield "external", Cluster(external), None
        return
    engine = os.environ.get("BOLIDE_TEST_ENGINE", "")
    if engine in ("kafka", "tansu"):
        yield from _embedded(engine)  # type: ignore[arg-type]  # checked just above
        return
    if engine not in ("", "auto"):
        raise pytest.UsageError(f"BOLIDE_TEST_ENGINE must be kafka, tansu or auto, not {engine!r}")
    docker_kafka = _docker_kafka()
    if docker_kafka is not None:
        for cluster in docker_kafka:
            yield "testcontainers", cluster, None
        return
    yield from _embedded("auto")


def cluster_backend() -> Iterator[tuple[str, Cluster]]:
    """Yield ``(backend_name, cluster)`` for the Kafka chosen (see the module docstring), and
    clean up after; the name is ``external``, ``testcontainers``, ``kafka`` or ``tansu``."""
    for name, cluster, _ in _backends():
        yield name, cluster


@pytest.fixture(scope="session")
def _bolide_session_backend() -> Iterator[tuple[str, Cluster, EmbeddedBroker | None]]:
    for name, cluster, broker in _backends():
        log.info("bolide tests run against the %s broker at %s", name, cluster.bootstrap_servers)
        yield name, cluster, broker


@pytest.fixture(scope="session")
def bolide_backend(
    _bolide_session_backend: tuple[str, Cluster, EmbeddedBroker | None],
) -> tuple[str, Cluster]:
    """``(name, cluster)``: name is ``external``, ``testcontainers``, ``kafka`` (the embedded
    Apache Kafka) or ``tansu`` (the embedded Tansu)."""
    return _bolide_session_backend[0], _bolide_session_backend[1]


@pytest.fixture(scope="session")
def bolide_broker(
    _bolide_session_backend: tuple[str, Cluster, EmbeddedBroker | None],
) -> EmbeddedBroker | None:
    """The session's embedded broker, or ``None`` when the tests use another Kafka."""
    return _bolide_session_backend[2]


@pytest.fixture(scope="session")
def bolide_cluster(bolide_backend: tuple[str, Cluster]) -> Cluster:
    """A Kafka cluster for the whole test session (see the module docstring for the choice)."""
    return bolide_backend[1]


@pytest.fixture
def bolide_stream_factory(request: pytest.FixtureRequest) -> StreamFactory:
    """Make streams with fresh, unique topic names for one test."""
    base = request.node.name.split("[")[0][:60].replace("_", "-")

    def make(name_prefix: str | None = None, **kwargs: Any) -> StreamConfig:
        name = f"{name_prefix or base}-{uuid.uuid4().hex[:10]}"
        return StreamConfig(name=name, **kwargs)

    return make
