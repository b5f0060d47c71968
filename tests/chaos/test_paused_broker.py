"""Found by the fault campaign: a stream's topic checked while the broker is paused (a long GC
pause, SIGSTOP) failed with a bare ``TimeoutError`` from inside ``ensure_topic``, which a
``Subscriber`` or ``Publisher`` under construction let through; an archiver starting then
failed with a bare ``KafkaException``. Both are ``BrokerError``s."""

from __future__ import annotations

from pathlib import Path

import pytest

from bolide.facade import BrokerError, EmbeddedBroker, StreamConfig
from bolide.facade.kafka import ensure_topic
from bolide.stores import Archiver, SqlStore

pytestmark = [pytest.mark.reliability, pytest.mark.slow]


def test_checking_a_topic_on_a_paused_broker_is_a_broker_error() -> None:
    with EmbeddedBroker(engine="tansu") as broker:
        cluster = broker.cluster()
        ensure_topic(cluster, StreamConfig(name="paused", partitions=1))
        broker.pause_node(1)
        try:
            # Other settings of a known topic: its configuration is described again.
            stream = StreamConfig(name="paused", partitions=1, min_insync_replicas=1)
            with pytest.raises(BrokerError, match="paused"):
                ensure_topic(cluster, stream)
        finally:
            broker.resume_node(1)


def test_an_archiver_starting_on_a_paused_broker_raises_a_broker_error(tmp_path: Path) -> None:
    stream = StreamConfig(name="paused", partitions=1)
    with EmbeddedBroker(engine="tansu") as broker, SqlStore(f"sqlite:///{tmp_path}/a.db") as store:
        store.upgrade()
        archiver = Archiver(broker.cluster(), store, [stream], group="paused-archive")
        broker.pause_node(1)
        try:
            # Its first request names what it asked: which topic the stream is now.
            with pytest.raises(BrokerError, match="cannot describe 'paused'") as raised:
                archiver.run()
            assert raised.value.retriable
        finally:
            broker.resume_node(1)
