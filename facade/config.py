"""Typed, frozen configuration: streams, publishers and subscribers (and the cluster, from
``bolide.facade.cluster``).

librdkafka settings pass through untouched as dicts of dotted keys (``"linger.ms"``,
``"sasl.password"``) beside the typed fields; bolide never invents aliases for them.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from bolide.facade.cluster import TOPIC_NAME, Cluster, check_settings, safe_repr
from bolide.facade.errors import InvalidInitialOffsetSchemeError
from bolide.facade.ports import HistoryStore, PositionStore
from bolide.facade.redaction import redact, redact_url
from bolide.facade.validate import check_int, check_seconds

__all__ = [
    "Cluster",
    "ErrorHandler",
    "HistoryStore",
    "InitialOffsetScheme",
    "Isolation",
    "PositionStore",
    "PublisherConfig",
    "StreamConfig",
    "SubscriberConfig",
    "redact",
    "redact_url",
]

ErrorHandler = Callable[[str, BaseException | None], None]

#: librdkafka's ``isolation.level`` values: what a subscriber sees of transactional streams.
Isolation = Literal["read_committed", "read_uncommitted"]
_ISOLATIONS = ("read_committed", "read_uncommitted")


class InitialOffsetScheme(enum.Enum):
    """Where a subscriber starts when it has no confirmed position (table: docs/concepts.md)."""

    EARLIEST = "earliest"
    LATEST = "latest"
    NONE = "none"
    AUTO = "auto"


def _check_group(name: str, value: object) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str or None, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} must be a non-empty string")


#: How a grouped subscriber's partitions move in a rebalance: ``"eager"`` (the classic
#: protocol's range and roundrobin: every member gives everything up, then takes its share),
#: ``"cooperative"`` (classic with cooperative-sticky) or ``"consumer"`` (Kafka 4's group
#: protocol, KIP-848): only the partitions that move are revoked and assigned.
RebalanceProtocol = Literal["eager", "cooperative", "consumer"]

#: Settings the consumer group protocol (KIP-848) moves to the broker, and where they went.
_BROKER_SIDE = {
    "session.timeout.ms": "the broker's group.consumer.session.timeout.ms",
    "heartbeat.interval.ms": "the broker's group.consumer.heartbeat.interval.ms",
    "partition.assignment.strategy": (
        "the broker's assignors (group.consumer.assignors; pick one with group.remote.assignor)"
    ),
    "group.protocol.type": "the protocol itself",
}


def rebalance_protocol(source: str, settings: Mapping[str, Any]) -> RebalanceProtocol:
    """How the consumer ``settings`` rebalance; refuses what does not apply to the protocol.

    Raises:
        ValueError: ``group.protocol`` is neither ``classic`` nor ``consumer``, or a setting
            the consumer protocol keeps on the broker is given with it.
    """
    protocol = str(settings.get("group.protocol", "classic")).lower()
    if protocol == "consumer":
        for key, owner in _BROKER_SIDE.items():
            if key in settings:
                raise ValueError(
                    f"{source}: {key} does not apply with group.protocol=consumer (KIP-848): "
                    f"it is {owner}; leave it out"
                )
        return "consumer"
    if protocol != "classic":
        raise ValueError(
            f"{source}: group.protocol={protocol!r} is not a group protocol (classic or consumer)"
        )
    strategy = str(settings.get("partition.assignment.strategy", ""))
    return "cooperative" if "cooperative" in strategy else "eager"


@dataclass(frozen=True, kw_only=True)
class StreamConfig:
    """A stream and its topic.

    Args:
        name: Topic name (Kafka's rules: 1-249 of ``[A-Za-z0-9._-]``).
        partitions: Number of partitions. ``None`` (default): an existing topic is used with
            the partitions it has; a missing one is created with 1.
        replication_factor: Replicas per partition (Meteor's sync replicas).
        min_insync_replicas: Topic's ``min.insync.replicas``; ``None`` keeps the broker's.
        global_order: One total order for all subscribers (one partition). ``False`` keeps
            each publisher's order only and lets a subscriber group spread the partitions.
            ``None`` (default): global order exactly when the topic has one partition.
        retention_ms: Topic ``retention.ms`` (Meteor's ring buffer capacity, by time).
        retention_bytes: Topic ``retention.bytes``.
        store: History store that holds what Kafka dropped (``bolide.stores.SqlStore``).
        capacity: Keep about this many records per partition in Kafka once archived.
        topic_config: Further topic settings by Kafka's names (``"cleanup.policy"``...).
    """

    name: str
    partitions: int | None = None
    replication_factor: int = 1
    min_insync_replicas: int | None = None
    global_order: bool | None = None
    retention_ms: int | None = None
    retention_bytes: int | None = None
    store: HistoryStore | None = field(default=None, compare=False)
    capacity: int | None = None
    topic_config: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a str, not {type(self.name).__name__}")
        if not TOPIC_NAME.match(self.name) or self.name in {".", ".."}:
            raise ValueError(
                f"name {self.name!r} is not a valid topic name (1-249 of [A-Za-z0-9._-])"
            )
        if self.partitions is not None:
            check_int("partitions", self.partitions, minimum=1)
        check_int("replication_factor", self.replication_factor, minimum=1)
        if self.min_insync_replicas is not None:
            check_int("min_insync_replicas", self.min_insync_replicas, minimum=1)
        if self.global_order is not None and not isinstance(self.global_order, bool):
            raise TypeError("global_order must be a bool or None")
        if self.global_order and self.partitions not in (None, 1):
            raise ValueError(
                f"partitions={self.partitions} contradicts global_order=True: one total order "
                "needs one partition; set global_order=False for per-publisher order"
            )
        for name in ("retention_ms", "retention_bytes"):
            value = getattr(self, name)
            if value is not None:
                check_int(name, value, minimum=-1)
        if self.capacity is not None:
            check_int("capacity", self.capacity, minimum=1)
            if self.store is None:
                raise ValueError("capacity needs a store: records past capacity go to history")
        if self.store is not None and not isinstance(self.store, HistoryStore):
            raise TypeError("store must implement HistoryStore (e.g. bolide.stores.SqlStore)")
        if not isinstance(self.topic_config, Mapping):
            raise TypeError("topic_config must be a mapping of topic settings")

    def topic_settings(self) -> dict[str, str]:
        """Kafka topic configs implied by this stream."""
        settings = {k: str(v) for k, v in self.topic_config.items()}
        if self.retention_ms is not None:
            settings["retention.ms"] = str(self.retention_ms)
        if self.retention_bytes is not None:
            settings["retention.bytes"] = str(self.retention_bytes)
        if self.min_insync_replicas is not None:
            settings["min.insync.replicas"] = str(self.min_insync_replicas)
        return settings


@dataclass(frozen=True, kw_only=True, repr=False)
class PublisherConfig:
    """Publisher settings.

    Args:
        stream: The stream to publish to.
        group: Message group stamped on every record (its Kafka key).
        auto_group: Pick one random message group for this publisher (HornetQ's auto-group).
        producer_config: librdkafka producer settings, passed through
            (``transaction.timeout.ms`` among them).
        serde: Encodes ``publish_async(obj)`` values (e.g. ``AvroSerde``).
        transactional_id: Makes the publisher transactional (librdkafka's ``transactional.id``):
            it publishes only inside ``with pub.transaction()``, and a newer publisher with
            the same id fences this one (docs/exactly-once.md).
    """

    stream: StreamConfig
    group: str | None = None
    auto_group: bool = False
    producer_config: Mapping[str, Any] = field(default_factory=dict)
    serde: Any = None
    transactional_id: str | None = None

    __repr__ = safe_repr

    def __post_init__(self) -> None:
        if not isinstance(self.stream, StreamConfig):
            raise TypeError("stream must be a StreamConfig")
        _check_group("group", self.group)
        if not isinstance(self.auto_group, bool):
            raise TypeError("auto_group must be a bool")
        if self.group is not None and self.auto_group:
            raise ValueError("group and auto_group=True contradict each other: pick one")
        object.__setattr__(
            self, "producer_config", check_settings("producer_config", self.producer_config)
        )
        _check_group("transactional_id", self.transactional_id)
        if "transactional.id" in self.producer_config:
            raise ValueError(
                "producer_config: pass transactional.id as PublisherConfig(transactional_id=...)"
            )


#: librdkafka's upper bound on the records one ``consume`` call may return.
MAX_BATCH = 1_000_000


@dataclass(frozen=True, kw_only=True, repr=False)
class SubscriberConfig:
    """Subscriber settings.

    Give exactly one of ``stream``, ``streams`` and ``pattern``.

    Args:
        stream: The stream to read.
        streams: Several streams to read (Kafka's subscription to a list of topics); each
            record's ``stream`` names its source (docs/concepts.md#several-streams).
        pattern: Read every topic whose whole name matches this regular expression (Python's
            ``re.fullmatch``; topics named ``__...`` are left out, as Kafka's internal topics
            are), and those created later once the client looks again
            (``topic.metadata.refresh.interval.ms`` in ``consumer_config``, librdkafka's
            default 300000).
        group: Subscriber group (Kafka consumer group); ``None`` for an ungrouped subscriber.
        initial_offset_scheme: Where to start without a position (table: docs/concepts.md).
        lease_timeout_ms: A grouped subscriber that stops polling for this long loses its lease
            (``session.timeout.ms`` and ``max.poll.interval.ms``). With Kafka 4's group
            protocol (``group.protocol=consumer`` in ``consumer_config``) it bounds the polls
            only: the broker's ``group.consumer.session.timeout.ms`` is the session
            (docs/kafka-estate.md#rebalancing).
        max_batch: Most records one ``poll`` returns (1 to 1,000,000, librdkafka's bound).
        error_handler: ``fn(summary, error)`` for failures outside any one call; logs if unset.
        consumer_config: librdkafka consumer settings, passed through. Rebalancing is eager
            by default; ``partition.assignment.strategy=cooperative-sticky`` or
            ``group.protocol=consumer`` moves only the partitions that change hands.
        durable_id: Makes this a durable client (GemFire): on reconnect it first gets what it
            missed while away (docs/durable.md).
        durable_timeout_s: A durable client away longer than this is forgotten.
        durable_registry: Store holding the durable registry; defaults to ``stream.store``.
        on_assign: ``fn(partitions)`` after this subscriber gains partitions (grouped): partition
            numbers for one ``stream``, ``(stream, partition)`` pairs for several.
        on_revoke: ``fn(partitions)`` after it gives them up or loses them (grouped); e.g.
            ``Resequencer.forget`` each, since the new owner re-reads from the last confirm.
        on_live: Called once when a durable client's replay is done.
        on_expired: Called when a durable client reconnects after its timeout.
        serde: Decodes ``record.value`` (e.g. ``AvroSerde``).
        dead_letter: Stream that receives records the serde cannot decode.
        isolation: ``"read_committed"`` (the default, librdkafka's too) delivers only committed
            transactions and stops at the last stable offset while one is open;
            ``"read_uncommitted"`` delivers everything written (docs/exactly-once.md).
        positions: Keep the positions in the application's database
            (``bolide.stores.SqlPositions``): they are read from there at start (ungrouped)
            or on assignment (grouped), and ``confirm(conn=...)`` writes them in the
            application's transaction.
        share_group: Read ``stream`` as a queue, in this Kafka share group (KIP-932): each
            record goes to one member and is acknowledged on its own (docs/queues.md).
            Exclusive with ``group``, ``durable_id`` and ``positions``.
        share_group_config: The share group's own settings, by Kafka's names (e.g.
            ``share.record.lock.duration.ms``, ``share.delivery.count.limit``), set on the
            group when the subscriber starts; ``initial_offset_scheme`` sets
            ``share.auto.offset.reset``.
        shared_fetch_bytes: While two or more ungrouped subscribers (without a serde or a
            durable id) of a stream are open in the process, they read its shared fetch: one
            consumer keeps what it read in a ring of this many bytes (split among the
            partitions), and each subscriber reads the ring from its own position, falling
            back to its own consumer where the ring does not hold it
            (docs/performance.md#shared-fetch).
            Subscribers share records (``SharedRecord``): treat them as read-only; publishing
            one publishes a copy. ``0`` reads alone.
        transactional: Its positions are confirmed in Kafka transactions
            (``Publisher.confirm(sub)``) and nowhere else: a durable client then never commits
            what its polls delivered, nor on close, so nothing it read inside an aborted
            transaction is confirmed (docs/exactly-once.md). Grouped only; a durable client
            confirmed through transactions needs it.
    """

    stream: StreamConfig | None = None
    streams: Sequence[StreamConfig] | None = None
    pattern: str | None = None
    group: str | None = None
    initial_offset_scheme: InitialOffsetScheme = InitialOffsetScheme.AUTO
    lease_timeout_ms: int = 10_000
    max_batch: int = 1_000
    error_handler: ErrorHandler | None = field(default=None, compare=False)
    consumer_config: Mapping[str, Any] = field(default_factory=dict)
    durable_id: str | None = None
    durable_timeout_s: float = 300.0
    durable_registry: Any = field(default=None, compare=False)
    on_assign: Callable[[list[Any]], None] | None = field(default=None, compare=False)
    on_revoke: Callable[[list[Any]], None] | None = field(default=None, compare=False)
    on_live: Callable[[], None] | None = field(default=None, compare=False)
    on_expired: Callable[[str], None] | None = field(default=None, compare=False)
    serde: Any = None
    dead_letter: StreamConfig | None = None
    isolation: Isolation = "read_committed"
    positions: PositionStore | None = field(default=None, compare=False)
    share_group: str | None = None
    share_group_config: Mapping[str, Any] = field(default_factory=dict)
    shared_fetch_bytes: int = 4 * 1024 * 1024
    transactional: bool = False

    __repr__ = safe_repr

    def __post_init__(self) -> None:
        self._check_sources()
        _check_group("group", self.group)
        self._check_exactly_once()
        for hook in ("on_assign", "on_revoke", "on_live", "on_expired"):
            if getattr(self, hook) is not None and not callable(getattr(self, hook)):
                raise TypeError(f"{hook} must be callable")
        if not isinstance(self.initial_offset_scheme, InitialOffsetScheme):
            raise TypeError("initial_offset_scheme must be an InitialOffsetScheme")
        check_int("lease_timeout_ms", self.lease_timeout_ms, minimum=1_000)
        check_int("max_batch", self.max_batch, minimum=1, maximum=MAX_BATCH)
        if self.error_handler is not None and not callable(self.error_handler):
            raise TypeError("error_handler must be callable")
        object.__setattr__(
            self, "consumer_config", check_settings("consumer_config", self.consumer_config)
        )
        rebalance_protocol("consumer_config", self.consumer_config)
        if self.durable_id is not None:
            if not isinstance(self.durable_id, str) or not self.durable_id:
                raise ValueError("durable_id must be a non-empty string")
            if self.group is not None:
                raise ValueError("durable_id and group contradict: a durable client has its own")
        check_seconds("durable_timeout_s", self.durable_timeout_s)
        check_int("shared_fetch_bytes", self.shared_fetch_bytes, minimum=0)
        self._check_share()
        if not self.grouped and self.initial_offset_scheme is InitialOffsetScheme.NONE:
            raise InvalidInitialOffsetSchemeError(
                "initial_offset_scheme NONE is illegal for an ungrouped subscriber",
                stream=self.stream.name if self.stream is not None else None,
            )

    def _check_sources(self) -> None:
        given = [n for n in ("stream", "streams", "pattern") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of stream, streams and pattern"
                + (f", not {' and '.join(given)}" if given else "")
            )
        if self.stream is not None and not isinstance(self.stream, StreamConfig):
            raise TypeError("stream must be a StreamConfig")
        if self.streams is not None:
            if isinstance(self.streams, StreamConfig | str) or not isinstance(
                self.streams, Sequence
            ):
                raise TypeError("streams must be a list of StreamConfig")
            streams = tuple(self.streams)
            if not streams or not all(isinstance(s, StreamConfig) for s in streams):
                raise TypeError("streams must be a non-empty list of StreamConfig")
            names = [s.name for s in streams]
            if len(set(names)) != len(names):
                raise ValueError(f"streams name a topic twice: {names}")
            object.__setattr__(self, "streams", streams)
        if self.pattern is not None:
            if not isinstance(self.pattern, str) or not self.pattern:
                raise TypeError("pattern must be a non-empty str (a regular expression)")
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(
                    f"pattern {self.pattern!r} is not a regular expression: {exc}"
                ) from exc
        if self.stream is None and self.durable_id is not None:
            raise ValueError(
                "a durable client reads one stream: durable_id needs stream=, not streams= or "
                "pattern="
            )

    def _check_share(self) -> None:
        _check_group("share_group", self.share_group)
        settings = self.share_group_config
        if not isinstance(settings, Mapping):
            raise TypeError("share_group_config must be a mapping of share group settings")
        if self.share_group is None:
            if settings:
                raise ValueError("share_group_config needs share_group")
            return
        for name in ("group", "durable_id", "positions", "on_assign", "on_revoke"):
            if getattr(self, name) is not None:
                raise ValueError(f"share_group and {name} contradict: a share group is a queue")
        if self.stream is None:
            raise ValueError("a share group subscriber reads one stream: give stream=")
        if self.initial_offset_scheme is InitialOffsetScheme.NONE:
            raise InvalidInitialOffsetSchemeError(
                "initial_offset_scheme NONE does not apply to a share group: it starts where "
                "share.auto.offset.reset says (EARLIEST or LATEST)",
                stream=self.stream.name,
            )
        for key, value in settings.items():
            if not isinstance(key, str) or not key.startswith("share."):
                raise ValueError(f"share_group_config: {key!r} is not a share group setting")
            if not isinstance(value, str | int) or isinstance(value, bool):
                raise TypeError(f"share_group_config: {key!r} must be a str or an int")
        object.__setattr__(self, "share_group_config", dict(settings))

    @property
    def single(self) -> StreamConfig:
        """The one stream of a ``stream=`` config.

        Raises:
            ValueError: The config reads several streams (``streams=`` or ``pattern=``).
        """
        if self.stream is None:
            raise ValueError("this config reads several streams (streams= or pattern=)")
        return self.stream

    def _check_exactly_once(self) -> None:
        if not isinstance(self.transactional, bool):
            raise TypeError("transactional must be a bool")
        if self.transactional and (not self.grouped or self.positions is not None):
            raise ValueError(
                "transactional=True is for a grouped subscriber whose consumer group holds its "
                "positions (a Kafka transaction confirms them): not ungrouped, not positions="
            )
        if self.isolation not in _ISOLATIONS:
            raise ValueError(
                f"isolation must be 'read_committed' or 'read_uncommitted', not {self.isolation!r}"
            )
        level = dict(self.consumer_config or {}).get("isolation.level", self.isolation)
        if level != self.isolation:
            raise ValueError(
                f"consumer_config isolation.level={level!r} contradicts isolation="
                f"{self.isolation!r}: set isolation only"
            )
        if self.positions is None:
            return
        if not isinstance(self.positions, PositionStore):
            raise TypeError(
                "positions must implement PositionStore (e.g. bolide.stores.SqlPositions)"
            )
        if self.positions.group is None and self.group is None and self.durable_id is None:
            raise ValueError(
                "an ungrouped subscriber keeps its positions under a name of its own: "
                "SqlPositions(store, group=...)"
            )

    @property
    def grouped(self) -> bool:
        """True for subscriber groups and durable clients (both use a consumer group)."""
        return self.group is not None or self.durable_id is not None
