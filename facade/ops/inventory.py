"""Topics and consumer groups as the broker reports them (kcat ``-L``, ``kafka-consumer-groups``).

Admin calls go through confluent-kafka's ``AdminClient``: ``list_consumer_groups``,
``describe_consumer_groups``, ``list_consumer_group_offsets``, ``describe_configs`` and the
cluster metadata; log starts and ends through ``bolide.facade.kafka``. Some brokers answer
less than Apache Kafka (the embedded Tansu: no group members, no topic settings; see
docs/compatibility.md): what they leave out comes back empty, never invented.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource

from bolide.facade.config import Cluster
from bolide.facade.errors import AuthorizationError, BolideError, BrokerError
from bolide.facade.kafka import (
    admin_client,
    log_ends,
    log_starts,
    partition_counts,
    probe_consumer,
)

__all__ = [
    "PROBE_GROUP_PREFIX",
    "GroupInfo",
    "MemberInfo",
    "PartitionInfo",
    "TopicInfo",
    "committed_offsets",
    "describe_groups",
    "list_groups",
    "list_topics",
    "partition_counts",
    "topic_settings",
]

_TIMEOUT_S = 10.0

#: Groups of bolide's throwaway offset probes: never listed.
PROBE_GROUP_PREFIX = "bolide-probe-"


@dataclass(frozen=True)
class MemberInfo:
    """One member of a consumer group.

    Attributes:
        member_id: The member id the coordinator gave it.
        client_id: The client's ``client.id`` (bolide: ``bolide-sub-<stream>``).
        host: Where it connects from.
        assignment: The ``(stream, partition)`` pairs it owns.
        instance_id: Its ``group.instance.id`` (a static member), else ``None``.
    """

    member_id: str
    client_id: str
    host: str
    assignment: tuple[tuple[str, int], ...]
    instance_id: str | None = None


@dataclass(frozen=True)
class GroupInfo:
    """A consumer group: a bolide subscriber group, a durable client's group, the archiver's
    group, or any other Kafka consumer's.

    Attributes:
        group_id: The group id.
        state: ``STABLE``, ``EMPTY``, ``PREPARING_REBALANCE``... (``UNKNOWN`` when not told).
        members: Its members and their partitions (empty when the broker reports none).
        committed: Committed offsets (next offset to read) per ``(stream, partition)``.
        coordinator: The coordinating broker, ``host:port``.
        assignor: The partition assignor in use.
        protocol: ``CLASSIC`` or ``CONSUMER`` (KIP-848), ``UNKNOWN`` when not told.
    """

    group_id: str
    state: str
    members: tuple[MemberInfo, ...] = ()
    committed: dict[tuple[str, int], int] = field(default_factory=dict)
    coordinator: str | None = None
    assignor: str | None = None
    protocol: str = "UNKNOWN"

    @property
    def streams(self) -> tuple[str, ...]:
        """The streams it has committed offsets on or is assigned, sorted."""
        names = {s for s, _ in self.committed}
        names.update(s for m in self.members for s, _ in m.assignment)
        return tuple(sorted(names))

    def owner(self, stream: str, partition: int) -> MemberInfo | None:
        """The member that owns a partition, if the broker reports one."""
        for member in self.members:
            if (stream, partition) in member.assignment:
                return member
        return None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values."""
        return {
            "group": self.group_id,
            "state": self.state,
            "coordinator": self.coordinator,
            "assignor": self.assignor,
            "streams": list(self.streams),
            "members": [
                {
                    "member_id": m.member_id,
                    "client_id": m.client_id,
                    "host": m.host,
                    "assignment": [{"stream": s, "partition": p} for s, p in m.assignment],
                }
                for m in self.members
            ],
            "committed": [
                {"stream": s, "partition": p, "offset": o}
                for (s, p), o in sorted(self.committed.items())
            ],
        }


def _protocol(described: Any) -> str:
    """The group's protocol as the broker named it (``CLASSIC``, ``CONSUMER``)."""
    kind = getattr(described, "type", None)
    return str(getattr(kind, "name", None) or "UNKNOWN")


@dataclass(frozen=True)
class PartitionInfo:
    """One partition of a topic.

    Attributes:
        partition: Its number.
        leader: The leader broker's id (``None`` when leaderless).
        replicas: The replicas' broker ids.
        isrs: The in-sync replicas' broker ids.
        log_start: The first offset Kafka still holds.
        log_end: The next offset to be written.
    """

    partition: int
    leader: int | None
    replicas: tuple[int, ...]
    isrs: tuple[int, ...]
    log_start: int
    log_end: int

    @property
    def records(self) -> int:
        """Offsets held (records, plus transaction markers on transactional streams)."""
        return max(0, self.log_end - self.log_start)


@dataclass(frozen=True)
class TopicInfo:
    """A topic (a bolide stream, or any other).

    Attributes:
        name: The topic name.
        partitions: Its partitions.
        settings: Topic settings that are not the broker's defaults (``retention.ms``...);
            empty when the broker describes none.
    """

    name: str
    partitions: tuple[PartitionInfo, ...]
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def records(self) -> int:
        """Offsets held over all partitions."""
        return sum(p.records for p in self.partitions)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values."""
        return {
            "topic": self.name,
            "partitions": [
                {
                    "partition": p.partition,
                    "leader": p.leader,
                    "replicas": list(p.replicas),
                    "isrs": list(p.isrs),
                    "log_start": p.log_start,
                    "log_end": p.log_end,
                    "records": p.records,
                }
                for p in self.partitions
            ],
            "records": self.records,
            "settings": self.settings,
        }


#: Refusals the user's ACLs explain: the resource type refused, for the message.
_REFUSED = {
    KafkaError.GROUP_AUTHORIZATION_FAILED: "group",
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster",
}


def _broker_error(what: str, exc: BaseException) -> BolideError:
    """A failed admin call: an ``AuthorizationError`` when an ACL is missing, else a
    retriable ``BrokerError``."""
    err = exc.args[0] if isinstance(exc, KafkaException) else None
    detail = err.str() if isinstance(err, KafkaError) else str(exc)
    kind = _REFUSED.get(err.code()) if isinstance(err, KafkaError) else None
    if kind is not None:
        return AuthorizationError(
            f"{what}: {detail}: grant the user DESCRIBE on that {kind} "
            "(docs/kafka-estate.md lists the ACLs of each command)",
            resource_type=kind,
            cause=err,
        )
    return BrokerError(f"{what}: {detail}", retriable=True)


def list_groups(cluster: Cluster, *, timeout_s: float = _TIMEOUT_S) -> list[str]:
    """Every consumer group the cluster knows, sorted (bolide's offset probes left out).

    Raises:
        BrokerError: The cluster did not answer.
    """
    admin = admin_client(cluster)
    try:
        result = admin.list_consumer_groups(request_timeout=timeout_s).result(timeout=timeout_s)
    except (KafkaException, TimeoutError) as exc:
        raise _broker_error("cannot list consumer groups", exc) from exc
    return sorted(g.group_id for g in result.valid if not g.group_id.startswith(PROBE_GROUP_PREFIX))


def committed_offsets(
    admin: AdminClient, group: str, *, timeout_s: float = _TIMEOUT_S
) -> dict[tuple[str, int], int]:
    """A group's committed offsets on every partition it committed (OffsetFetch).

    Raises:
        BrokerError: The cluster did not answer.
    """
    request = [ConsumerGroupTopicPartitions(group)]
    try:
        future = admin.list_consumer_group_offsets(request, request_timeout=timeout_s)[group]
        answer = future.result(timeout=timeout_s)
    except (KafkaException, TimeoutError) as exc:
        raise _broker_error(f"cannot read the offsets of group {group!r}", exc) from exc
    return {
        (tp.topic, tp.partition): int(tp.offset)
        for tp in answer.topic_partitions or []
        if tp.offset is not None and tp.offset >= 0 and tp.error is None
    }


def describe_groups(
    cluster: Cluster, groups: Iterable[str], *, timeout_s: float = _TIMEOUT_S
) -> list[GroupInfo]:
    """State, members and committed offsets of ``groups`` (DescribeGroups and OffsetFetch).

    Raises:
        BrokerError: The cluster did not answer.
    """
    names = sorted(set(groups))
    if not names:
        return []
    admin = admin_client(cluster)
    try:
        futures = admin.describe_consumer_groups(names, request_timeout=timeout_s)
    except KafkaException as exc:
        raise _broker_error("cannot describe consumer groups", exc) from exc
    out = []
    for name in names:
        try:
            described = futures[name].result(timeout=timeout_s)
        except (KafkaException, TimeoutError) as exc:
            raise _broker_error(f"cannot describe group {name!r}", exc) from exc
        members = tuple(
            MemberInfo(
                member_id=m.member_id,
                client_id=m.client_id,
                host=m.host,
                assignment=tuple(
                    sorted(
                        (tp.topic, tp.partition)
                        for tp in (m.assignment.topic_partitions if m.assignment else [])
                    )
                ),
                instance_id=getattr(m, "group_instance_id", None) or None,
            )
            for m in described.members
        )
        coordinator = described.coordinator
        out.append(
            GroupInfo(
                group_id=name,
                state=described.state.name if described.state is not None else "UNKNOWN",
                members=members,
                committed=committed_offsets(admin, name, timeout_s=timeout_s),
                coordinator=f"{coordinator.host}:{coordinator.port}" if coordinator else None,
                assignor=described.partition_assignor or None,
                protocol=_protocol(described),
            )
        )
    return out


def topic_settings(
    admin: AdminClient, topic: str, *, timeout_s: float = _TIMEOUT_S
) -> dict[str, str]:
    """A topic's settings that are not the broker's defaults (DescribeConfigs); empty when
    the broker describes none."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    try:
        described = admin.describe_configs([resource])[resource].result(timeout=timeout_s)
    except (KafkaException, TimeoutError):
        return {}
    return {
        key: str(entry.value)
        for key, entry in sorted(described.items())
        if entry.value is not None and not entry.is_default
    }


def list_topics(
    cluster: Cluster,
    names: Iterable[str] | None = None,
    *,
    settings: bool = True,
    timeout_s: float = _TIMEOUT_S,
) -> list[TopicInfo]:
    """Topics with their partitions, log starts and ends, and settings, sorted by name.

    Args:
        cluster: The cluster.
        names: Topics to describe (default: all); a name the cluster lacks is left out.
        settings: Also read each topic's settings (one DescribeConfigs per topic).
        timeout_s: Longest wait for each answer.

    Raises:
        BrokerError: The cluster did not answer.
    """
    admin = admin_client(cluster)
    try:
        # All topics: a metadata request naming one may auto-create it on some brokers.
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise _broker_error("cannot list topics", exc) from exc
    wanted = set(names) if names is not None else None
    out = []
    consumer = probe_consumer(cluster)
    try:
        for name in sorted(metadata.topics):
            topic = metadata.topics[name]
            if (wanted is not None and name not in wanted) or topic.error is not None:
                continue
            parts = sorted(topic.partitions)
            starts = log_starts(consumer, name, parts, cluster=cluster)
            ends = log_ends(cluster, name, parts, timeout_s=timeout_s, consumer=consumer)
            partitions = tuple(
                PartitionInfo(
                    partition=p,
                    leader=topic.partitions[p].leader if topic.partitions[p].leader >= 0 else None,
                    replicas=tuple(topic.partitions[p].replicas),
                    isrs=tuple(topic.partitions[p].isrs),
                    log_start=starts[p],
                    log_end=ends[p],
                )
                for p in parts
            )
            found = topic_settings(admin, name, timeout_s=timeout_s) if settings else {}
            out.append(TopicInfo(name=name, partitions=partitions, settings=found))
    finally:
        consumer.close()
    return out
