"""Which topic a stream's name stands for now: its Kafka topic id (KIP-516) and its cluster's id.

A topic deleted and created again under the same name is a new topic: a new topic id, offsets
from 0 again. What bolide stores of a topic (history, positions, markers) is kept per topic id,
so the one place that asks the broker who a name is lives here.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient

from bolide.facade.config import Cluster
from bolide.facade.errors import BrokerError
from bolide.facade.kafka.admin import admin_client
from bolide.facade.ports import TopicIdentity

__all__ = ["NO_TOPIC_ID", "TopicIdentity", "topic_id", "topic_identity"]

#: The topic id a broker without topic ids reports (the null Uuid, base64).
NO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"
_TIMEOUT_S = 30.0


def topic_identity(
    cluster: Cluster, topic: str, *, timeout_s: float = _TIMEOUT_S
) -> TopicIdentity | None:
    """The topic id of ``topic`` and its cluster's id; ``None`` when the topic does not exist
    or the broker reports no ids (an engine without KIP-516: nothing is then stored under a
    made-up id).

    Raises:
        BrokerError: The cluster did not answer.
    """
    admin = admin_client(cluster)  # one client, kept while its answers are awaited
    found = _topic_id(admin, cluster, topic, timeout_s)
    if found is None:
        return None
    try:  # the cluster's id, as every Metadata answer carries it
        cluster_id = admin.list_topics(topic=topic, timeout=timeout_s).cluster_id
    except KafkaException as exc:
        raise _unanswered(cluster, topic, exc.args[0]) from None
    return TopicIdentity(found, str(cluster_id)) if cluster_id else None


def topic_id(cluster: Cluster, topic: str, *, timeout_s: float = _TIMEOUT_S) -> str | None:
    """The Kafka topic id of ``topic`` (``describe_topics``); ``None`` when the topic does not
    exist or the broker reports no ids.

    Raises:
        BrokerError: The cluster did not answer.
    """
    return _topic_id(admin_client(cluster), cluster, topic, timeout_s)


def _topic_id(admin: AdminClient, cluster: Cluster, topic: str, timeout_s: float) -> str | None:
    try:
        described = admin.describe_topics(TopicCollection([topic]))[topic].result(timeout_s)
    except TimeoutError:
        raise _silent(cluster, topic, timeout_s) from None
    except KafkaException as exc:
        error: KafkaError = exc.args[0]
        if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return None
        raise _unanswered(cluster, topic, error) from None
    found = None if described.topic_id is None else str(described.topic_id)
    return None if found in (None, NO_TOPIC_ID) else found


def _silent(cluster: Cluster, topic: str, timeout_s: float) -> BrokerError:
    return BrokerError(
        f"cannot describe {topic!r} at {cluster.bootstrap_servers}: no answer within "
        f"{timeout_s:g}s",
        stream=topic,
        retriable=True,
    )


def _unanswered(cluster: Cluster, topic: str, error: KafkaError) -> BrokerError:
    return BrokerError(
        f"cannot describe {topic!r} at {cluster.bootstrap_servers}: {error.str()}",
        stream=topic,
        retriable=error.retriable(),
    )
