"""Share groups as operators see them (``bolide lag``): the share groups of a cluster and, per
partition they read, the share-partition start offset (the first record not yet finished:
acked, rejected or archived) against the log end, the backlog of the queue.

confluent-kafka's admin client has no share-group calls, so these are Kafka's own requests
spoken directly (ListGroups v5 filtered to ``share``, FindCoordinator v4,
DescribeShareGroupOffsets v0), on plaintext clusters; elsewhere no share group is reported.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from bolide.facade.config import Cluster
from bolide.facade.errors import BrokerError
from bolide.facade.kafka import admin_client, log_ends
from bolide.facade.kafka.features import bootstrap_wire, broker_features
from bolide.facade.kafka.wire import Reader, Wire, array, i8, nullable_array, string
from bolide.facade.ops.inventory import partition_counts

__all__ = ["ShareLag", "list_share_groups", "share_group_starts", "share_lags"]

log = logging.getLogger(__name__)

_LIST_GROUPS, _FIND_COORDINATOR, _DESCRIBE_SHARE_OFFSETS = 16, 10, 90
_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ShareLag:
    """One share group's queue on one partition.

    Attributes:
        group: The share group.
        stream: The stream (topic).
        partition: The partition.
        start: The share-partition start offset: every record below it is finished.
        log_end: The next offset to be written.
        backlog: Records from ``start`` to the end: available, or acquired and in flight.
    """

    group: str
    stream: str
    partition: int
    start: int
    log_end: int
    backlog: int


def _brokers(cluster: Cluster) -> list[tuple[str, int]]:
    meta = admin_client(cluster).list_topics(timeout=_TIMEOUT_S)
    return sorted((str(b.host), int(b.port)) for b in meta.brokers.values())


def list_share_groups(cluster: Cluster) -> list[str]:
    """The share groups of the cluster, sorted (empty where share groups do not exist or the
    cluster is not reached in plaintext).

    Raises:
        BrokerError: A broker did not answer.
    """
    features = broker_features(cluster)
    if features is None or features.share_groups() is not None:
        return []
    found: set[str] = set()
    states, types = array([]), array([string("share")])
    for host, port in _brokers(cluster):  # each broker lists the groups it coordinates
        try:
            with Wire(host, port, _TIMEOUT_S) as wire:
                reader = wire.call(_LIST_GROUPS, 5, states + types + b"\x00")
        except (OSError, struct.error) as exc:
            raise BrokerError(f"listing share groups on {host}:{port} failed: {exc}") from exc
        reader.fixed(">i")  # throttle
        if reader.fixed(">h"):
            continue  # that broker cannot list (still loading): its groups show next time
        found.update(g for g in reader.array(_listed_group) if g is not None)
    return sorted(found)


def _listed_group(reader: Reader) -> str | None:
    group = reader.string()
    for _ in range(3):  # protocol type, state, type
        reader.string()
    reader.tags()
    return group


def share_group_starts(cluster: Cluster, group: str) -> dict[tuple[str, int], int]:
    """The share-partition start offset of every partition ``group`` has state for.

    Raises:
        BrokerError: The coordinator did not answer, or answered with an error.
    """
    wire = bootstrap_wire(cluster, _TIMEOUT_S)
    if wire is None:
        return {}
    try:
        with wire:
            found = wire.call(_FIND_COORDINATOR, 4, i8(0) + array([string(group)]) + b"\x00")
            host, port = _coordinator(found, group)
        with Wire(host, port, _TIMEOUT_S) as coordinator:
            body = array([string(group) + nullable_array(None) + b"\x00"]) + b"\x00"
            reader = coordinator.call(_DESCRIBE_SHARE_OFFSETS, 0, body)
    except (OSError, struct.error) as exc:
        raise BrokerError(f"reading share group {group!r} failed: {exc}") from exc
    reader.fixed(">i")  # throttle
    starts: dict[tuple[str, int], int] = {}
    for described in reader.array(_described_group):
        starts.update(described)
    return starts


def _coordinator(reader: Reader, group: str) -> tuple[str, int]:
    reader.fixed(">i")  # throttle
    for _ in range(reader.uvarint() - 1):
        reader.string()  # the key
        reader.fixed(">i")  # node id
        host, port, error = reader.string(), reader.fixed(">i"), reader.fixed(">h")
        message = reader.string()
        reader.tags()
        if error or host is None:
            raise BrokerError(f"no coordinator for share group {group!r}: {message or error}")
        return host, port
    raise BrokerError(f"no coordinator for share group {group!r}")


def _described_group(reader: Reader) -> dict[tuple[str, int], int]:
    group = reader.string()
    starts: dict[tuple[str, int], int] = {}
    for _ in range(reader.uvarint() - 1):
        topic = reader.string() or ""
        reader.skip(16)  # the topic id
        for _ in range(reader.uvarint() - 1):
            partition, start = reader.fixed(">i"), reader.fixed(">q")
            reader.fixed(">i")  # leader epoch
            error, message = reader.fixed(">h"), reader.string()
            reader.tags()
            if error == 0 and start >= 0:
                starts[(topic, partition)] = start
            elif error:
                log.debug("share group %s on %s[%d]: %s", group, topic, partition, message)
        reader.tags()
    error, message = reader.fixed(">h"), reader.string()
    reader.tags()
    if error:
        raise BrokerError(f"describing share group {group!r} failed: {message or error}")
    return starts


def share_lags(
    cluster: Cluster,
    groups: Iterable[str] | None = None,
    streams: Iterable[str] | None = None,
    *,
    counts: Mapping[str, int] | None = None,
    ends: Mapping[tuple[str, int], int] | None = None,
) -> list[ShareLag]:
    """The backlog of share groups (all, or ``groups``) on their partitions (of ``streams``
    when given), sorted by group, stream, partition. ``counts`` (partitions per topic) and
    ``ends`` (log ends already measured, as ``lag_report`` has them) spare asking again.

    Raises:
        BrokerError: The cluster did not answer.
    """
    wanted = set(streams) if streams is not None else None
    named = list_share_groups(cluster)
    if groups is not None:
        named = [g for g in named if g in set(groups)]
    rows: list[ShareLag] = []
    known: dict[tuple[str, int], int] = dict(ends or {})
    measured: set[str] = set()
    for group in named:
        for (stream, partition), start in sorted(share_group_starts(cluster, group).items()):
            if wanted is not None and stream not in wanted:
                continue
            if (stream, partition) not in known and stream not in measured:
                measured.add(stream)
                if counts is None:
                    counts = partition_counts(cluster)
                parts = range(counts.get(stream, 0))
                known.update(((stream, p), e) for p, e in log_ends(cluster, stream, parts).items())
            end = known.get((stream, partition), start)
            rows.append(ShareLag(group, stream, partition, start, end, max(0, end - start)))
    return rows
