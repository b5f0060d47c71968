"""The embedded Apache Kafka as a three-node cluster (replication 3, ``min.insync.replicas=2``)
under the faults the chaos campaign injects: a node paused (SIGSTOP, a long GC pause) and
resumed, a node SIGKILLed and restarted. Writes acknowledged with ``acks=all`` go on through
each fault, the node comes back into every replica set, and stopping the cluster ends every
node, a paused one too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bolide.facade import BrokerError, EmbeddedBroker, Publisher, PublisherConfig, StreamConfig
from bolide.facade.broker.apache import kafka_unavailable
from bolide.facade.kafka import admin_client
from tests.conftest import eventually

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

#: What a replicated three-node cluster runs with (the chaos campaign uses the same).
REPLICATED = {"default.replication.factor": "3", "min.insync.replicas": "2"}


@pytest.fixture(scope="module")
def trio() -> Iterator[EmbeddedBroker]:
    reason = kafka_unavailable()
    if reason is not None:
        pytest.skip(f"a 3-node cluster needs the Apache Kafka engine: {reason}")
    with EmbeddedBroker(engine="kafka", brokers=3, broker_settings=REPLICATED) as broker:
        yield broker


def _state(pid: int) -> str:
    """The process state letter from ``/proc`` (``T``: stopped)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


def _replicas(broker: EmbeddedBroker, topic: str) -> tuple[int, list[int]]:
    meta = admin_client(broker.cluster()).list_topics(topic, timeout=10)
    partition = meta.topics[topic].partitions[0]
    return partition.leader, sorted(partition.isrs)


def _acknowledged(pub: Publisher, value: bytes) -> int:
    return pub.publish_async(value).result(180)


def test_a_paused_node_and_a_killed_node_come_back(trio: EmbeddedBroker) -> None:
    stream = StreamConfig(name="trio", partitions=1, replication_factor=3, min_insync_replicas=2)
    with Publisher(trio.cluster(), PublisherConfig(stream=stream)) as pub:
        first = _acknowledged(pub, b"before")
        leader, isr = _replicas(trio, "trio")
        assert isr == [1, 2, 3]
        pids = dict(zip(trio.node_ids, trio.pids, strict=True))

        trio.pause_node(leader)
        eventually(lambda: _state(pids[leader]) == "T", 30)  # signals arrive asynchronously
        # The leader answers nothing: the others elect a new one, and acks=all goes on with two.
        assert _acknowledged(pub, b"paused") > first
        assert _replicas(trio, "trio")[0] != leader
        trio.resume_node(leader)
        trio.resume_node(leader)  # resuming a running node does nothing
        eventually(lambda: _state(pids[leader]) != "T", 30)
        eventually(lambda: _replicas(trio, "trio")[1] == [1, 2, 3], 180, 0.5)

        victim = _replicas(trio, "trio")[0]
        trio.kill_node(victim)
        assert _acknowledged(pub, b"killed") > first
        with pytest.raises(BrokerError, match="not running"):
            trio.pause_node(victim)
        trio.start_node(victim)
        eventually(lambda: _replicas(trio, "trio")[1] == [1, 2, 3], 180, 0.5)
        assert _acknowledged(pub, b"after") > first

    with pytest.raises(ValueError, match="no node 4"):
        trio.pause_node(4)
    trio.pause_node(trio.node_ids[-1])
    every = trio.pids
    assert len(every) == 3
    trio.stop()  # a paused node too: it is continued, then ends
    assert not any(Path(f"/proc/{pid}").exists() for pid in every)
