"""Pytest plugin for bolide users (entry point ``pytest11``), like Meteor's assurance module.

Fixtures:
    bolide_cluster: a session-wide ``Cluster``: ``BOLIDE_TEST_BOOTSTRAP`` when set, else a
        testcontainers Kafka when a Docker engine answers, else an ``EmbeddedBroker``.
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

from bolide.facade.broker import EmbeddedBroker
from bolide.facade.config import Cluster, StreamConfig

__all__ = ["bolide_backend", "bolide_cluster", "bolide_stream_factory", "cluster_backend"]

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


def cluster_backend() -> Iterator[tuple[str, Cluster]]:
    """Yield ``(backend_name, cluster)`` for the best Kafka available, and clean up after."""
    external = os.environ.get("BOLIDE_TEST_BOOTSTRAP")
    if external:
        yield "external", Cluster(external)
        return
    docker_kafka = _docker_kafka()
    if docker_kafka is not None:
        for cluster in docker_kafka:
            yield "testcontainers", cluster
        return
    with EmbeddedBroker() as broker:
        yield "embedded", broker.cluster()


@pytest.fixture(scope="session")
def bolide_backend() -> Iterator[tuple[str, Cluster]]:
    """``(name, cluster)``: name is ``external``, ``testcontainers`` or ``embedded``."""
    for name, cluster in cluster_backend():
        log.info("bolide tests run against the %s broker at %s", name, cluster.bootstrap_servers)
        yield name, cluster


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
