"""DeleteRecords: trimming a partition's log below an offset (an archive's capacity, a
dead-letter purge), and whether the broker supports it.

Trimming uses Kafka's DeleteRecords. Some brokers advertise it in their ApiVersions answer yet
close the connection when asked (the embedded Tansu broker does), so support is decided by a
real, harmless request: deleting the records before offset 0, which changes nothing on a
broker that supports it.
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from bolide.facade.config import Cluster
from bolide.facade.errors import BrokerError
from bolide.facade.kafka.admin import admin_client

__all__ = ["require_delete_records", "trim"]

log = logging.getLogger(__name__)

_PROBE_TIMEOUT_S = 5.0
_UNSUPPORTED = {
    KafkaError.UNSUPPORTED_VERSION,
    KafkaError.INVALID_REQUEST,
    KafkaError._UNSUPPORTED_FEATURE,
}
_DENIED = {KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED}


def require_delete_records(
    cluster: Cluster, topic: str, *, timeout_s: float = _PROBE_TIMEOUT_S
) -> None:
    """Check that the broker deletes records on request (what ``capacity`` needs).

    Sends DeleteRecords for offset 0 of ``topic``'s partition 0: a no-op where it is supported.

    Raises:
        BrokerError: The broker does not support DeleteRecords, refuses it (ACLs), or could
            not be asked; the message says why and what to use instead.
    """
    admin = admin_client(cluster)
    tp = TopicPartition(topic, 0, 0)
    instead = (
        "StreamConfig(capacity=...) needs it; use retention_ms/retention_bytes instead, or a "
        "broker that implements DeleteRecords (Apache Kafka, Redpanda...)"
    )
    try:
        futures = admin.delete_records([tp], request_timeout=timeout_s, operation_timeout=timeout_s)
        next(iter(futures.values())).result(timeout=timeout_s + 1)
        return
    except KafkaException as exc:
        err: KafkaError = exc.args[0]
        code = err.code()
    except TimeoutError:
        raise BrokerError(
            f"the broker at {cluster.bootstrap_servers} did not answer DeleteRecords within "
            f"{timeout_s}s; {instead}",
            stream=topic,
        ) from None
    if code == KafkaError._TRANSPORT and _answers(cluster):
        # The broker is up and answers other requests: it dropped the connection on this one.
        raise BrokerError(
            f"the broker at {cluster.bootstrap_servers} does not support DeleteRecords (it "
            f"closed the connection when asked to delete records of {topic!r}); {instead}",
            stream=topic,
        )
    if code in _UNSUPPORTED:
        raise BrokerError(
            f"the broker at {cluster.bootstrap_servers} does not support DeleteRecords "
            f"({err.str()}); {instead}",
            stream=topic,
        )
    if code in _DENIED:
        raise BrokerError(
            f"the broker refuses DeleteRecords on {topic!r} ({err.str()}): capacity needs the "
            "DELETE permission on the topic",
            stream=topic,
        )
    raise BrokerError(
        f"could not check DeleteRecords support on {cluster.bootstrap_servers}: {err.str()}",
        stream=topic,
        retriable=err.retriable(),
    )


def _answers(cluster: Cluster) -> bool:
    try:
        admin_client(cluster).list_topics(timeout=_PROBE_TIMEOUT_S)
    except KafkaException:
        return False
    return True


def trim(
    cluster: Cluster, before: dict[tuple[str, int], int], *, timeout_s: float = 10.0
) -> dict[tuple[str, int], int]:
    """Delete records below the given offsets; return the new log starts that succeeded.

    Failures are logged, not raised: trimming is housekeeping and the next batch retries it.
    """
    if not before:
        return {}
    admin = admin_client(cluster)
    request = [TopicPartition(t, p, o) for (t, p), o in before.items()]
    done: dict[tuple[str, int], int] = {}
    futures = admin.delete_records(request, request_timeout=timeout_s, operation_timeout=timeout_s)
    for tp, future in futures.items():
        try:
            result = future.result(timeout=timeout_s + 1)
            done[(tp.topic, tp.partition)] = int(result.low_watermark)
        except (KafkaException, TimeoutError) as exc:
            log.warning("could not trim %s[%d]: %s", tp.topic, tp.partition, exc)
    return done
