"""Kafka plumbing shared by publishers, subscribers and tools: client defaults, topics, ends."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType, TopicMetadata

from bolide.facade.config import Cluster, StreamConfig
from bolide.facade.errors import (
    AuthorizationError,
    BolideError,
    BrokerError,
    StreamConfigMismatchError,
)
from bolide.facade.kafka.compat import confirm_ends, confirm_time_offsets, stale_watermarks
from bolide.facade.kafka.fatal import AUTHENTICATION_CODES, Refusals, authentication_error
from bolide.facade.ports import DurableClient

T = TypeVar("T")

__all__ = [
    "CONSUMER_DEFAULTS",
    "PRODUCER_DEFAULTS",
    "admin_client",
    "admin_config",
    "broker_setting",
    "client_backlog",
    "committed_offsets",
    "delete_group",
    "ensure_topic",
    "forget_topic",
    "log_ends",
    "log_starts",
    "new_client",
    "offsets_for_time",
    "partition_count",
    "partition_counts",
    "probe_consumer",
    "replica_count",
]


class _LibrdkafkaLog:
    """Where librdkafka's own lines go (a client's ``logger``): the ``bolide.kafka`` logger,
    instead of librdkafka's bare lines on stderr.

    A condition librdkafka retries by itself, said by a line ending in ``retrying`` (``GETPID
    ... Coordinator load in progress: retrying`` on most first publishes to a fresh broker), is
    logged at debug: it is not a fault unless it lasts, and then the call waiting on it fails
    with its own error.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def log(self, level: int, msg: str, *args: Any) -> None:
        text = str(args[-1]) if args else msg
        if level > logging.DEBUG and text.rstrip().endswith("retrying"):
            level = logging.DEBUG
        self.logger.log(level, msg, *args)


#: librdkafka's own log lines go to the ``bolide.kafka`` logger instead of stderr.
_KAFKA_LOG = _LibrdkafkaLog(logging.getLogger("bolide.kafka"))

#: Producer defaults: Meteor's per-publisher order across retries needs idempotence.
PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 1,
    "logger": _KAFKA_LOG,
}

#: Consumer defaults chosen for low latency; any of them can be overridden.
CONSUMER_DEFAULTS: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "fetch.wait.max.ms": 10,
    "fetch.queue.backoff.ms": 1,
    "logger": _KAFKA_LOG,
}

_TIMEOUT_S = 10.0
#: Partition count per (bootstrap servers, client identity, topic), and the topic settings
#: already checked. The identity (``_identity``) keeps a topic one user described from
#: standing for another, whose ACLs may refuse it.
_known_topics: dict[tuple[str, str, str], tuple[int, set[frozenset[tuple[str, str]]]]] = {}
_topics_lock = threading.Lock()

#: Local errors of a request that reached no broker (down, unreachable, not answering in
#: time, its name not resolved): asking again may succeed.
_UNREACHABLE = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError._RESOLVE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
    }
)


def new_client(factory: Callable[[dict[str, Any]], T], config: dict[str, Any], source: str) -> T:
    """Build a librdkafka client, turning a refused setting into a ``ValueError``.

    librdkafka checks every setting when the client is built, before it connects anywhere, so
    an unknown name or a bad value is reported here, naming where it came from.
    """
    try:
        return factory(config)
    except KafkaException as exc:
        raise ValueError(f"{source}: {_missing_file(config) or exc.args[0].str()}") from exc


#: librdkafka settings that name a file (or, for the CA, a folder) to read.
_FILE_SETTINGS = (
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.keystore.location",
    "ssl.crl.location",
)


def _missing_file(config: dict[str, Any]) -> str | None:
    """Which TLS file setting names nothing: librdkafka only says "BIO lib" then."""
    for key in _FILE_SETTINGS:
        value = config.get(key)
        if isinstance(value, str) and value != "probe" and not Path(value).exists():
            return f"{key}={value!r}: no such file"
    return None


def admin_config(cluster: Cluster) -> dict[str, Any]:
    """The settings of the cluster's admin clients."""
    return cluster.client_config({"logger": _KAFKA_LOG})


def admin_client(cluster: Cluster) -> AdminClient:
    """An AdminClient with the cluster's settings.

    Raises:
        ValueError: librdkafka refused one of the cluster's settings (named in the message).
    """
    return new_client(AdminClient, admin_config(cluster), "cluster setting")


def broker_setting(cluster: Cluster, name: str) -> str | None:
    """A broker setting (``server.properties``) as the first broker that answers has it;
    ``None`` when it cannot be read (no DESCRIBE_CONFIGS on the cluster, say): for naming in
    an error, never needed to go on."""
    try:
        admin = admin_client(cluster)
        brokers = admin.list_topics(timeout=_TIMEOUT_S).brokers
        resource = ConfigResource(ResourceType.BROKER, str(min(brokers)))
        entries = admin.describe_configs([resource])[resource].result(timeout=_TIMEOUT_S)
    except (KafkaException, ValueError):
        return None
    entry = entries.get(name)
    return None if entry is None or entry.value is None else str(entry.value)


def partition_count(admin: AdminClient, topic: str) -> int | None:
    info = _topic(admin, topic)
    return None if info is None else len(info.partitions)


def replica_count(admin: AdminClient, topic: str) -> int | None:
    """The fewest replicas a partition of ``topic`` has (``None``: no such topic)."""
    info = _topic(admin, topic)
    return None if info is None else min(len(p.replicas) for p in info.partitions.values())


def _topic(admin: AdminClient, topic: str) -> TopicMetadata | None:
    """``topic``'s metadata, ``None`` when it has no partitions to show."""
    # A metadata request naming the topic may auto-create it on some brokers: list them all.
    info = admin.list_topics(timeout=_TIMEOUT_S).topics.get(topic)
    if info is None or info.error is not None or not info.partitions:
        return None
    return info


def partition_counts(cluster: Cluster, *, timeout_s: float = _TIMEOUT_S) -> dict[str, int]:
    """Partition count of every topic (one metadata request).

    Raises:
        BrokerError: The cluster did not answer.
    """
    try:
        metadata = admin_client(cluster).list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise BrokerError(f"cannot list topics: {exc.args[0].str()}", retriable=True) from exc
    return {
        name: len(t.partitions)
        for name, t in metadata.topics.items()
        if t.error is None and t.partitions
    }


def _check_configs(admin: AdminClient, stream: StreamConfig) -> None:
    wanted = stream.topic_settings()
    if not wanted:
        return
    resource = ConfigResource(ConfigResource.Type.TOPIC, stream.name)
    try:
        described = admin.describe_configs([resource])[resource].result(timeout=_TIMEOUT_S)
    except KafkaException:
        return
    except TimeoutError:
        raise _no_answer("describe", stream.name) from None
    # Some brokers (Tansu) describe nothing: only compare what they do report.
    for key, value in wanted.items():
        entry = described.get(key)
        if entry is not None and entry.value is not None and str(entry.value) != value:
            raise StreamConfigMismatchError(
                f"topic {stream.name!r} has {key}={entry.value}, the stream config wants {value}",
                stream=stream.name,
            )


def ensure_topic(cluster: Cluster, stream: StreamConfig) -> int:
    """Create the stream's topic if missing (``partitions``, or 1 when unset); check an
    existing one agrees with what the config states (unset partitions take the topic's).

    A topic is described once per process for each client identity (the cluster's settings,
    credentials included): what one user learnt of it does not stand for another.

    Returns:
        The topic's partition count.

    Raises:
        StreamConfigMismatchError: The topic exists with other partitions or settings.
        AuthorizationError: The user may not describe (or create) the topic.
        AuthenticationError: The broker refused the cluster's credentials.
        BrokerError: The broker refused to create the topic, or could not be reached (then
            ``retriable``).
    """
    cache_key = (cluster.bootstrap_servers, _identity(cluster), stream.name)
    settings = frozenset(stream.topic_settings().items())
    with _topics_lock:
        known = _known_topics.get(cache_key)
        if known is None:
            count = _create_or_describe(cluster, stream)
            _known_topics[cache_key] = (count, {settings})
        else:
            count, checked = known
            if settings not in checked:  # another config of a known topic
                _check_configs(admin_client(cluster), stream)
                checked.add(settings)
    if stream.partitions is not None and count != stream.partitions:
        raise StreamConfigMismatchError(
            f"topic {stream.name!r} has {count} partitions, the stream config says "
            f"{stream.partitions}",
            stream=stream.name,
        )
    if stream.global_order and count != 1:
        raise StreamConfigMismatchError(
            f"topic {stream.name!r} has {count} partitions: global_order=True needs one "
            "(leave global_order unset to use the topic as it is)",
            stream=stream.name,
        )
    return count


def _identity(cluster: Cluster) -> str:
    """Who the broker takes the cluster's clients for: a digest of every client setting (SASL
    user and password, TLS certificate, an OAUTHBEARER callback, and any other that may change
    it), so that no secret is kept in clear in the known-topics cache."""
    settings = sorted((key, repr(value)) for key, value in cluster.client_config().items())
    return hashlib.sha256(repr(settings).encode()).hexdigest()


def _create_or_describe(cluster: Cluster, stream: StreamConfig) -> int:
    # Refused credentials come to the error_cb; the request itself only fails to connect.
    refusals = Refusals(f"admin of {stream.name!r}")
    settings = {**admin_config(cluster), "error_cb": refusals.error_cb}
    admin = new_client(AdminClient, settings, "cluster setting")
    try:
        count = partition_count(admin, stream.name)
        if count is None:
            new = NewTopic(
                stream.name,
                num_partitions=stream.partitions or 1,
                replication_factor=stream.replication_factor,
                config=stream.topic_settings(),
            )
            try:
                admin.create_topics([new], operation_timeout=_TIMEOUT_S)[stream.name].result(
                    timeout=_TIMEOUT_S
                )
            except TimeoutError:
                raise _no_answer("create", stream.name) from None
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
            count = _wait_for_topic(admin, stream.name)
        else:
            _check_configs(admin, stream)
    except KafkaException as exc:
        admin.poll(0)  # serves the error_cb
        raise _topic_error(stream.name, refusals.take() or exc.args[0]) from exc
    return count


def _topic_error(topic: str, err: KafkaError) -> BolideError:
    """What a failed describe or create of ``topic`` raises: an answer that retrying cannot
    fix as its typed error, anything else as a ``BrokerError``."""
    said = err.str()
    if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        return AuthorizationError(
            f"the broker refused to describe or create topic {topic!r} ({said}): grant the "
            "user DESCRIBE on it (WRITE and READ include it), and CREATE if bolide is to "
            "create it; or create it first",
            resource_type="topic",
            resource=topic,
            cause=err,
            stream=topic,
        )
    if err.code() in AUTHENTICATION_CODES:
        return authentication_error(err, topic)
    return BrokerError(
        f"cannot create or describe topic {topic!r}: {said}",
        stream=topic,
        retriable=err.retriable() or err.code() in _UNREACHABLE,
    )


def _no_answer(request: str, topic: str) -> BrokerError:
    """A broker that answers nothing (paused, overloaded) is unreachable, as in the other
    errors of the request: a retriable ``BrokerError``, not the future's bare TimeoutError."""
    return BrokerError(
        f"cannot {request} topic {topic!r}: no answer within {_TIMEOUT_S:g}s (the broker is "
        "down, paused or overloaded)",
        stream=topic,
        retriable=True,
    )


def _wait_for_topic(admin: AdminClient, topic: str) -> int:
    deadline = time.monotonic() + _TIMEOUT_S
    while time.monotonic() < deadline:
        count = partition_count(admin, topic)
        if count:
            return count
        time.sleep(0.05)
    # Created, not yet in the metadata the broker answers: described again later, it is.
    raise BrokerError(
        f"topic {topic!r} did not appear after creation", stream=topic, retriable=True
    )


def forget_topic(cluster: Cluster, name: str) -> None:
    """Drop a topic from the known-topics cache (after deleting it, or a broker restart), as
    every user of the cluster's bootstrap servers knew it."""
    with _topics_lock:
        known = [k for k in _known_topics if (k[0], k[2]) == (cluster.bootstrap_servers, name)]
        for key in known:
            del _known_topics[key]


#: Errors of a partition whose leader is not known yet or has moved: asking again succeeds.
_LEADER_MOVING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        # The handle of a broker that left the cluster's metadata (a node killed) is destroyed,
        # failing what was in flight to it: asked again, the new leader answers.
        KafkaError._DESTROY_BROKER,
    }
)

#: Errors of a partition the client's metadata does not show for a moment: a topic another
#: client just created, or metadata answered by a node that restarted and has not caught up with
#: the cluster's. Asked of a partition known to exist (assigned, listed), asking again succeeds.
_PARTITION_UNSEEN = frozenset(
    {
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
    }
)

#: Errors of a group coordinator that is moving or still loading: asking again succeeds.
_COORDINATOR_BUSY = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
    }
)


def _ask_again(ask: Callable[[float], T], busy: frozenset[int], timeout_s: float) -> T:
    """``ask(timeout_s_left)``, asked again while it fails with one of the ``busy`` errors
    (a leader or coordinator that moves or still loads), until ``timeout_s`` has passed.

    Raises:
        KafkaException: Any other error, or still busy at the deadline.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ask(max(0.1, deadline - time.monotonic()))
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.code() not in busy or time.monotonic() >= deadline:
                raise
        time.sleep(0.1)


def committed_offsets(
    consumer: Consumer, partitions: list[TopicPartition], timeout_s: float = _TIMEOUT_S
) -> list[TopicPartition]:
    """``consumer.committed(partitions)``, asked again while the group's coordinator moves or
    loads (a broker that just started, a leader that changed), until ``timeout_s`` has passed.

    Raises:
        KafkaException: Any other error, or the coordinator still busy at the deadline.
    """
    return _ask_again(
        lambda left: list(consumer.committed(partitions, timeout=left)),
        _COORDINATOR_BUSY,
        timeout_s,
    )


def delete_group(cluster: Cluster, group_id: str, timeout_s: float = _TIMEOUT_S) -> None:
    """Delete a consumer group (its committed offsets), asked again while its coordinator
    moves or loads (a group the broker has not placed yet answers NOT_COORDINATOR for a
    moment), until ``timeout_s`` has passed.

    Raises:
        KafkaException: Any other error (GROUP_ID_NOT_FOUND, a group with members, a missing
            DELETE ACL...), or the coordinator still busy at the deadline.
    """
    admin = admin_client(cluster)

    def ask(left: float) -> None:
        request = min(left, 10.0)
        admin.delete_consumer_groups([group_id], request_timeout=request)[group_id].result(
            timeout=left
        )

    _ask_again(ask, _COORDINATOR_BUSY, timeout_s)


def probe_consumer(cluster: Cluster, **extra: Any) -> Consumer:
    """A throwaway consumer for offset lookups; it never commits."""
    return Consumer(
        cluster.client_config(
            CONSUMER_DEFAULTS,
            {"group.id": f"bolide-probe-{uuid.uuid4().hex}", "enable.partition.eof": True},
            extra,
        )
    )


def _watermarks(
    consumer: Consumer, topic: str, partition: int, timeout_s: float, *, cached: bool
) -> tuple[int, int]:
    """The reported (low, high) watermarks; an unreachable broker is a ``BrokerError``.

    A partition whose leader is not known yet (a topic just created, a leader that moved)
    answers NOT_LEADER_FOR_PARTITION or the like for a moment, and one missing from the
    client's metadata answers "Unknown partition": asked again until ``timeout_s``.
    """
    tp = TopicPartition(topic, partition)
    try:
        low, high = _ask_again(
            lambda left: consumer.get_watermark_offsets(tp, timeout=left, cached=cached),
            _LEADER_MOVING | _PARTITION_UNSEEN,
            timeout_s,
        )
    except KafkaException as exc:
        raise BrokerError(
            f"cannot read the offsets of {topic}[{partition}]: {exc.args[0].str()}",
            stream=topic,
            partition=partition,
            retriable=True,
        ) from exc
    return int(low), int(high)


def log_starts(
    consumer: Consumer, topic: str, partitions: Iterable[int], *, cluster: Cluster
) -> dict[int, int]:
    """First offset Kafka still holds, per partition (the one place that asks the broker).

    ``consumer`` talks to ``cluster``, whose ``log_start_overrides`` can raise a start (never
    lower it): a broker that never deletes records then stands in for one that has.
    """
    overrides = cluster.log_start_overrides.get(topic, {})
    starts: dict[int, int] = {}
    for p in partitions:
        low = _watermarks(consumer, topic, p, _TIMEOUT_S, cached=False)[0]
        starts[p] = max(low, overrides.get(p, 0))
    return starts


def log_ends(
    cluster: Cluster,
    topic: str,
    partitions: Iterable[int],
    *,
    timeout_s: float = _TIMEOUT_S,
    isolation: str | None = None,
    consumer: Consumer | None = None,
) -> dict[int, int]:
    """The end (next offset to be written) of each partition.

    Kafka's reported high watermark is the end; on a broker whose watermark may point into the
    last batch (``bolide.facade.kafka.compat``) the end is confirmed by reading forward from it.

    Args:
        cluster: Where the topic lives.
        topic: The topic.
        partitions: Its partitions to measure.
        timeout_s: Longest wait for the broker.
        isolation: ``"read_committed"`` answers the last stable offset (the first offset of
            the oldest open transaction, else the end): where such a reader stops and what it
            will read next. ``"read_uncommitted"`` answers the end of the log. ``None`` keeps
            the cluster's setting (librdkafka's default is ``read_committed``).
        consumer: A ``probe_consumer`` to reuse across calls (reassigned, left open; its own
            isolation level applies, not ``isolation``); by default one is made and closed.
    """
    parts = list(partitions)
    own = consumer is None
    if consumer is None:
        consumer = probe_consumer(cluster, **({"isolation.level": isolation} if isolation else {}))
    try:
        marks = {p: _watermarks(consumer, topic, p, timeout_s, cached=False) for p in parts}
        if not stale_watermarks(cluster):
            return {p: max(low, high) for p, (low, high) in marks.items()}
        return confirm_ends(consumer, topic, marks, timeout_s)
    finally:
        if own:
            consumer.close()


def offsets_for_time(
    cluster: Cluster, topic: str, partitions: Iterable[int], when_ms: int
) -> dict[int, int]:
    """The first offset whose record's timestamp is at or after ``when_ms``, per partition;
    the partition's end when there is none (Kafka's ``offsetsForTimes``).

    Raises:
        BrokerError: The broker refused or did not answer the lookup.
    """
    parts = list(partitions)
    ends = log_ends(cluster, topic, parts)
    consumer = probe_consumer(cluster)
    try:
        try:
            found = consumer.offsets_for_times(
                [TopicPartition(topic, p, when_ms) for p in parts], _TIMEOUT_S
            )
        except KafkaException as exc:
            raise BrokerError(
                f"cannot look up offsets by time on {topic!r}: {exc}", stream=topic
            ) from None
        answers: dict[int, int] = {}
        for tp in found:  # -1: no record at or after the time
            end = ends[tp.partition]
            answers[tp.partition] = tp.offset if 0 <= tp.offset <= end else end
        if not stale_watermarks(cluster):
            return answers
        starts = log_starts(consumer, topic, parts, cluster=cluster)
        return confirm_time_offsets(consumer, topic, answers, when_ms, starts, ends)
    finally:
        consumer.close()


def client_backlog(cluster: Cluster, client: DurableClient) -> dict[str, dict[int, int]]:
    """Records waiting for a durable client: end offset minus position, per stream and partition.

    A partition without a committed position counts from the first record Kafka holds. A
    stream whose topic no longer exists is left out.
    """
    admin = admin_client(cluster)
    consumer = probe_consumer(cluster, **{"group.id": client.group_id})
    try:
        out: dict[str, dict[int, int]] = {}
        for stream in client.streams:
            count = partition_count(admin, stream)
            if not count:
                continue
            parts = range(count)
            ends = log_ends(cluster, stream, parts)
            starts = log_starts(consumer, stream, parts, cluster=cluster)
            committed = committed_offsets(consumer, [TopicPartition(stream, p) for p in parts])
            out[stream] = {}
            for tp in committed:
                position = tp.offset if tp.offset >= 0 else starts[tp.partition]
                out[stream][tp.partition] = max(0, ends[tp.partition] - position)
        return out
    finally:
        consumer.close()
