"""Health of a reading client (a subscriber or the archiver), for health checks and ``bolide lag``.

``Subscriber.health()`` and ``Archiver.health()`` answer a ``Health``: whether the client holds
its lease (its partitions), when it last polled, how far behind the end of each held partition
it reads, and whether it is closed. ``Health.healthy(...)`` turns that into one boolean for a
web health check; ``Health.to_dict()`` into JSON.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bolide.facade.config import Cluster
from bolide.facade.kafka import log_ends

__all__ = ["Health", "PartitionHealth", "measure", "partition_lag"]


def partition_lag(log_end: int, position: int | None, log_start: int = 0) -> int:
    """Records between a reader's position (next offset it reads) and the end of the log.

    A reader without a position reads from the first record Kafka holds (``log_start``), so
    everything held counts. A position past the end (the log was truncated) counts as 0.
    """
    return max(0, log_end - (position if position is not None else log_start))


@dataclass(frozen=True)
class PartitionHealth:
    """One held partition.

    Attributes:
        stream: The stream (topic).
        partition: The partition.
        position: The next offset the client reads (delivers, or archives); ``None`` while
            unknown.
        log_end: The next offset to be written (``None`` when not measured).
        lag: ``log_end - position`` (``None`` when either is unknown).
    """

    stream: str
    partition: int
    position: int | None
    log_end: int | None
    lag: int | None


@dataclass(frozen=True)
class Health:
    """A snapshot of a reading client's health.

    Attributes:
        kind: ``"subscriber"`` or ``"archiver"``.
        group: The consumer group (``None`` for an ungrouped subscriber).
        streams: The streams it reads.
        closed: The client is closed (a stopped archiver counts as closed).
        lease_held: It holds partitions (always true for an ungrouped subscriber).
        partitions: The held partitions, with position and lag.
        last_poll_ms: When it last polled, in epoch milliseconds (``None``: never).
        checked_ms: When the snapshot was taken, in epoch milliseconds.
    """

    kind: str
    group: str | None
    streams: tuple[str, ...]
    closed: bool
    lease_held: bool
    partitions: tuple[PartitionHealth, ...]
    last_poll_ms: int | None
    checked_ms: int

    @property
    def lag(self) -> int | None:
        """Total lag over the held partitions (``None`` when not measured)."""
        lags = [p.lag for p in self.partitions]
        return None if any(lag is None for lag in lags) else sum(lag for lag in lags if lag)

    @property
    def idle_s(self) -> float | None:
        """Seconds since the last poll (``None``: it never polled)."""
        if self.last_poll_ms is None:
            return None
        return max(0, self.checked_ms - self.last_poll_ms) / 1000

    def healthy(self, *, max_lag: int | None = None, max_idle_s: float | None = None) -> bool:
        """True when open, holding its lease, and within the given bounds.

        Args:
            max_lag: Largest lag allowed on any held partition (``None``: no bound).
            max_idle_s: Longest time since the last poll (``None``: no bound; a client that
                never polled fails any bound).
        """
        if self.closed or not self.lease_held:
            return False
        if max_lag is not None and any(
            p.lag is not None and p.lag > max_lag for p in self.partitions
        ):
            return False
        if max_idle_s is not None:
            idle = self.idle_s
            if idle is None or idle > max_idle_s:
                return False
        return True

    def to_dict(self) -> dict[str, Any]:
        """The snapshot as plain JSON-ready values."""
        return {
            "kind": self.kind,
            "group": self.group,
            "streams": list(self.streams),
            "closed": self.closed,
            "lease_held": self.lease_held,
            "last_poll_ms": self.last_poll_ms,
            "idle_s": self.idle_s,
            "lag": self.lag,
            "partitions": [
                {
                    "stream": p.stream,
                    "partition": p.partition,
                    "position": p.position,
                    "log_end": p.log_end,
                    "lag": p.lag,
                }
                for p in self.partitions
            ],
        }


def measure(
    cluster: Cluster,
    kind: str,
    group: str | None,
    streams: tuple[str, ...],
    positions: Mapping[tuple[str, int], int | None],
    *,
    closed: bool,
    last_poll_ms: int | None,
    lag: bool = True,
) -> Health:
    """Build a ``Health`` from a client's state, reading the log ends of its held partitions.

    Args:
        cluster: Where the streams live.
        kind: ``"subscriber"`` or ``"archiver"``.
        group: The client's consumer group.
        streams: The streams it reads.
        positions: Next offset per held ``(stream, partition)``; none held means no lease.
        closed: Whether it is closed.
        last_poll_ms: Its last poll, in epoch milliseconds.
        lag: Read the log ends (one round trip per stream); ``False`` leaves lags unknown.
    """
    ends: dict[tuple[str, int], int] = {}
    if lag and positions and not closed:
        by_stream: dict[str, list[int]] = {}
        for stream, partition in positions:
            by_stream.setdefault(stream, []).append(partition)
        for stream, parts in by_stream.items():
            ends.update(((stream, p), o) for p, o in log_ends(cluster, stream, parts).items())
    held = []
    for (stream, p), position in sorted(positions.items()):
        at_end = ends.get((stream, p))
        held.append(
            PartitionHealth(
                stream=stream,
                partition=p,
                position=position,
                log_end=at_end,
                lag=None if at_end is None or position is None else partition_lag(at_end, position),
            )
        )
    return Health(
        kind=kind,
        group=group,
        streams=streams,
        closed=closed,
        lease_held=bool(positions) and not closed,
        partitions=tuple(held),
        last_poll_ms=last_poll_ms,
        checked_ms=int(time.time() * 1000),
    )
