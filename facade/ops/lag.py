"""Consumer lag, archive lag, durable and share-group backlogs: what ``bolide lag`` and
``bolide top`` show.

Lag is Kafka's: a group's committed offset (the next record it reads) against the partition's
true end (``kafka.log_ends``, not a possibly stale high watermark). A group that committed
nothing on a partition reads it from the first record Kafka holds, so all of those count
(``kafka-consumer-groups.sh`` prints ``-`` there; bolide's grouped subscribers start at the
earliest record, and so does this figure). The archive's lag compares the history store's
largest offset with the same end; a durable client's backlog is its group's lag.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from bolide.facade.config import Cluster
from bolide.facade.health import partition_lag
from bolide.facade.kafka import log_ends, log_starts, probe_consumer
from bolide.facade.ops.durables import client_backlog
from bolide.facade.ops.inventory import GroupInfo, describe_groups, list_groups, partition_counts
from bolide.facade.ops.shares import ShareLag, share_lags
from bolide.facade.ports import DurableClient, HistoryStore, now_ms

__all__ = [
    "ArchiveLag",
    "DurableBacklog",
    "LagReport",
    "PartitionLag",
    "Rates",
    "durable_backlogs",
    "lag_report",
    "rates",
]


@dataclass(frozen=True)
class PartitionLag:
    """One group's position on one partition.

    Attributes:
        group: The consumer group.
        stream: The stream (topic).
        partition: The partition.
        committed: The committed offset (next record the group reads); ``None`` when the
            group committed nothing there.
        log_start: The first offset Kafka still holds.
        log_end: The next offset to be written.
        lag: Records from the committed offset (else the log start) to the end.
        member_id: The owning member, when the broker reports members.
        client_id: The owner's ``client.id``.
        host: The owner's host.
    """

    group: str
    stream: str
    partition: int
    committed: int | None
    log_start: int
    log_end: int
    lag: int
    member_id: str | None = None
    client_id: str | None = None
    host: str | None = None


@dataclass(frozen=True)
class ArchiveLag:
    """How far the history store trails one partition.

    Attributes:
        stream: The stream.
        partition: The partition.
        archived: The largest offset in the store (``None``: nothing archived).
        position: The next offset to archive (never below the log start: what Kafka dropped
            unarchived cannot be archived any more).
        log_end: The next offset to be written.
        lag: Records Kafka holds that the store does not.
    """

    stream: str
    partition: int
    archived: int | None
    position: int
    log_end: int
    lag: int


@dataclass(frozen=True)
class DurableBacklog:
    """A durable client and the records waiting for it.

    Attributes:
        durable_id: The client's durable id.
        group_id: Its consumer group.
        state: ``connected``, ``away`` or ``expired`` (away past its timeout).
        away_s: Seconds since it was last seen (0 while connected).
        timeout_s: How long it may stay away.
        backlog: Records waiting, per stream and partition.
        markers: Its latest marker (stream -> partition -> the end offset when it
            connected): what it replays up to before it goes live.
        marker_ms: When that marker was taken (``None``: never).
    """

    durable_id: str
    group_id: str
    state: str
    away_s: float
    timeout_s: float
    backlog: dict[str, dict[int, int]]
    markers: dict[str, dict[int, int]] = field(default_factory=dict)
    marker_ms: int | None = None

    @property
    def total(self) -> int:
        """Records waiting over all streams and partitions."""
        return sum(n for parts in self.backlog.values() for n in parts.values())


@dataclass(frozen=True)
class LagReport:
    """A snapshot of lags, the archive and durable clients.

    Attributes:
        partitions: Group lags, sorted by group, stream, partition.
        groups: The groups described (state, members).
        archive: Archive lags, sorted by stream, partition.
        durable: Durable clients, sorted by id.
        share: Share groups' backlogs (``bolide.facade.ops.shares``), sorted by group,
            stream, partition.
        ends: Log end per ``(stream, partition)`` of every stream measured.
        taken_at: ``time.monotonic()`` when the snapshot was taken (for rates).
        taken_ms: Epoch milliseconds when it was taken.
    """

    partitions: tuple[PartitionLag, ...] = ()
    groups: tuple[GroupInfo, ...] = ()
    archive: tuple[ArchiveLag, ...] = ()
    durable: tuple[DurableBacklog, ...] = ()
    share: tuple[ShareLag, ...] = ()
    ends: dict[tuple[str, int], int] = field(default_factory=dict)
    taken_at: float = 0.0
    taken_ms: int = 0

    @property
    def max_lag(self) -> int:
        """The largest lag of any group partition, archive partition or durable client."""
        lags = [p.lag for p in self.partitions] + [a.lag for a in self.archive]
        lags += [d.total for d in self.durable] + [q.backlog for q in self.share]
        return max(lags, default=0)

    def over(self, limit: int) -> list[str]:
        """What lags by more than ``limit`` records, one line each (for alerts)."""
        out = [
            f"group {p.group} on {p.stream}[{p.partition}]: lag {p.lag}"
            for p in self.partitions
            if p.lag > limit
        ]
        out += [
            f"archive of {a.stream}[{a.partition}]: lag {a.lag}"
            for a in self.archive
            if a.lag > limit
        ]
        out += [
            f"durable client {d.durable_id} ({d.state}): backlog {d.total}"
            for d in self.durable
            if d.total > limit
        ]
        out += [
            f"share group {q.group} on {q.stream}[{q.partition}]: backlog {q.backlog}"
            for q in self.share
            if q.backlog > limit
        ]
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values (``bolide lag --json``)."""
        return {
            "taken_ms": self.taken_ms,
            "max_lag": self.max_lag,
            "partitions": [
                {
                    "group": p.group,
                    "stream": p.stream,
                    "partition": p.partition,
                    "committed": p.committed,
                    "log_start": p.log_start,
                    "log_end": p.log_end,
                    "lag": p.lag,
                    "member_id": p.member_id,
                    "client_id": p.client_id,
                    "host": p.host,
                }
                for p in self.partitions
            ],
            "groups": [{"group": g.group_id, "state": g.state} for g in self.groups],
            "archive": [
                {
                    "stream": a.stream,
                    "partition": a.partition,
                    "archived": a.archived,
                    "position": a.position,
                    "log_end": a.log_end,
                    "lag": a.lag,
                }
                for a in self.archive
            ],
            "durable": [
                {
                    "durable_id": d.durable_id,
                    "group": d.group_id,
                    "state": d.state,
                    "away_s": round(d.away_s, 3),
                    "timeout_s": d.timeout_s,
                    "backlog": d.total,
                    "backlog_by_partition": {
                        s: {str(p): n for p, n in parts.items()} for s, parts in d.backlog.items()
                    },
                }
                for d in self.durable
            ],
            "share": [
                {"group": q.group, "stream": q.stream, "partition": q.partition,
                 "start": q.start, "log_end": q.log_end, "backlog": q.backlog}
                for q in self.share
            ],
        }  # fmt: skip


def durable_backlogs(
    cluster: Cluster, clients: Iterable[DurableClient], *, at_ms: int | None = None
) -> list[DurableBacklog]:
    """Each durable client's state and the records waiting for it, sorted by id."""
    at = at_ms if at_ms is not None else now_ms()
    out = []
    for client in sorted(clients, key=lambda c: c.durable_id):
        state = "connected" if client.connected else ("expired" if client.expired(at) else "away")
        out.append(
            DurableBacklog(
                durable_id=client.durable_id,
                group_id=client.group_id,
                state=state,
                away_s=client.away_s(at),
                timeout_s=client.timeout_s,
                backlog=client_backlog(cluster, client),
                markers=client.markers,
                marker_ms=client.marker_ms,
            )
        )
    return out


def lag_report(
    cluster: Cluster,
    *,
    groups: Iterable[str] | None = None,
    streams: Iterable[str] | None = None,
    store: HistoryStore | None = None,
    archived: Iterable[str] = (),
    durable_clients: Iterable[DurableClient] = (),
    all_streams: bool = False,
) -> LagReport:
    """Lag of consumer groups, of the archive and of durable clients, in one snapshot.

    Args:
        cluster: The cluster.
        groups: Groups to report (default: every group with offsets or members on
            ``streams``, or every group).
        streams: Streams to report (default: those the groups read).
        store: The history store; with it, the archive lag of ``archived`` streams (or of
            ``streams`` when ``archived`` is empty).
        archived: Streams whose archive lag to report.
        durable_clients: Durable clients (a registry's ``list()``) whose backlog to report.
        all_streams: Measure the ends of every topic (``bolide top``'s publish rates).

    Raises:
        BrokerError: The cluster did not answer.
        StoreError: The store did not answer.
    """
    taken_at, taken_ms = time.monotonic(), now_ms()
    wanted = set(streams) if streams is not None else None
    counts = partition_counts(cluster)
    named = sorted(set(groups)) if groups is not None else list_groups(cluster)
    described = describe_groups(cluster, named)
    if groups is None and wanted is not None:
        described = [g for g in described if wanted & set(g.streams)]
    to_archive = set(archived) or (wanted or set())
    measured = _measured(
        described,
        wanted,
        counts,
        asked_groups=groups is not None,
        archived=to_archive if store is not None else set(),
        all_streams=all_streams,
    )
    starts, ends = _log_bounds(cluster, measured, counts)
    bounds = (measured, counts, starts, ends)
    asked = wanted if groups is not None else None
    rows = [row for g in described for row in _group_rows(g, asked, *bounds)]
    archive = []
    if store is not None:
        archive = _archive_rows(store, sorted(to_archive & measured), *bounds[1:])
    return LagReport(
        tuple(rows),
        tuple(described),
        tuple(archive),
        tuple(durable_backlogs(cluster, durable_clients, at_ms=taken_ms)),
        tuple(share_lags(cluster, groups, wanted, counts=counts, ends=ends)),
        ends,
        taken_at,
        taken_ms,
    )


_Bounds = dict[tuple[str, int], int]


def _measured(
    described: list[GroupInfo],
    wanted: set[str] | None,
    counts: dict[str, int],
    *,
    asked_groups: bool,
    archived: set[str],
    all_streams: bool,
) -> set[str]:
    """The streams whose log bounds a report needs (those that exist)."""
    measured: set[str] = set()
    for g in described:
        measured.update(g.streams if wanted is None else wanted & set(g.streams))
    if asked_groups and wanted is not None:
        measured |= wanted  # asked for both: report them even with nothing committed
    measured |= archived
    if all_streams:
        measured |= set(counts) if wanted is None else wanted
    return measured & set(counts)


def _log_bounds(
    cluster: Cluster, measured: set[str], counts: dict[str, int]
) -> tuple[_Bounds, _Bounds]:
    """Log start and end offsets of every partition of ``measured``, through one consumer."""
    consumer = probe_consumer(cluster)
    starts: _Bounds = {}
    ends: _Bounds = {}
    try:
        for stream in sorted(measured):
            parts = range(counts[stream])
            for p, o in log_starts(consumer, stream, parts, cluster=cluster).items():
                starts[(stream, p)] = o
            for p, o in log_ends(cluster, stream, parts, consumer=consumer).items():
                ends[(stream, p)] = o
    finally:
        consumer.close()
    return starts, ends


def _group_rows(
    g: GroupInfo,
    asked: set[str] | None,
    measured: set[str],
    counts: dict[str, int],
    starts: _Bounds,
    ends: _Bounds,
) -> list[PartitionLag]:
    """One row per partition of the streams group ``g`` reads (or of ``asked``)."""
    rows = []
    for stream in g.streams if asked is None else sorted(asked):
        if stream not in measured:
            continue
        for p in range(counts[stream]):
            committed = g.committed.get((stream, p))
            owner = g.owner(stream, p)
            start, end = starts[(stream, p)], ends[(stream, p)]
            rows.append(
                PartitionLag(
                    group=g.group_id,
                    stream=stream,
                    partition=p,
                    committed=committed,
                    log_start=start,
                    log_end=end,
                    lag=partition_lag(end, committed, start),
                    member_id=owner.member_id if owner else None,
                    client_id=owner.client_id if owner else None,
                    host=owner.host if owner else None,
                )
            )
    return rows


def _archive_rows(
    store: HistoryStore,
    streams: list[str],
    counts: dict[str, int],
    starts: _Bounds,
    ends: _Bounds,
) -> list[ArchiveLag]:
    """How far the archive of each partition of ``streams`` is behind Kafka's log end."""
    archive = []
    for stream in streams:
        for p in range(counts[stream]):
            largest = store.largest_offset(stream, p)
            start, end = starts[(stream, p)], ends[(stream, p)]
            position = start if largest is None else max(largest + 1, start)
            archive.append(
                ArchiveLag(stream, p, largest, position, end, partition_lag(end, position))
            )
    return archive


@dataclass(frozen=True)
class Rates:
    """Records per second between two reports.

    Attributes:
        published: Per stream: growth of the log ends.
        consumed: Per ``(group, stream, partition)``: growth of the committed offsets.
        archived: Per ``(stream, partition)``: growth of the archive's positions.
    """

    published: dict[str, float]
    consumed: dict[tuple[str, str, int], float]
    archived: dict[tuple[str, int], float]


def rates(before: LagReport, after: LagReport) -> Rates:
    """Publish, consume (committed) and archive rates between two snapshots."""
    span = max(after.taken_at - before.taken_at, 1e-6)
    published: dict[str, float] = {}
    for (stream, p), end in after.ends.items():
        if (stream, p) in before.ends:
            grown = max(0, end - before.ends[(stream, p)])
            published[stream] = published.get(stream, 0.0) + grown / span
    was = {(r.group, r.stream, r.partition): r.committed for r in before.partitions}
    consumed: dict[tuple[str, str, int], float] = {}
    for r in after.partitions:
        key = (r.group, r.stream, r.partition)
        if key in was and r.committed is not None:
            old = was[key]
            consumed[key] = max(0, r.committed - (old if old is not None else r.committed)) / span
    positions = {(a.stream, a.partition): a.position for a in before.archive}
    archived: dict[tuple[str, int], float] = {}
    for a in after.archive:
        where = (a.stream, a.partition)
        if where in positions:
            archived[where] = max(0, a.position - positions[where]) / span
    return Rates(published=published, consumed=consumed, archived=archived)
