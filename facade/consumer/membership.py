"""``Membership``: what a subscriber does in a consumer group, and what it does without one.

The choice is made once, when the subscriber is built (``membership_of``), as one of two
classes behind one interface, the way aiokafka picks ``GroupCoordinator`` or
``NoGroupCoordinator`` once in ``start()``:

- ``GroupMember`` (a subscriber group, or a durable client): joins the group, holds a lease on
  the partitions the group gives it (kept by polling within ``lease_timeout_ms``), confirms
  to the group's offsets, and starts a partition without a confirmed position at the
  earliest record (``AUTO``);
- ``NoGroup`` (Meteor's ungrouped subscriber): assigns itself every partition for its life,
  holds no lease, confirms only into the application's database (``confirm(conn=...)``),
  may ``seek``, and starts at the end (``AUTO``).

Nothing else asks which one a subscriber is: each difference is a method here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, libversion

from bolide.facade.config import (
    Cluster,
    InitialOffsetScheme,
    RebalanceProtocol,
    SubscriberConfig,
    rebalance_protocol,
)
from bolide.facade.consumer.confirms import Confirms
from bolide.facade.consumer.lease import Lease
from bolide.facade.consumer.positions import Positions
from bolide.facade.consumer.state import GroupState, ManualState, PartitionState
from bolide.facade.errors import IllegalSubscriberStateError

__all__ = ["GroupMember", "Membership", "NoGroup", "membership_of", "protocol_of"]

#: librdkafka 2.12, the first release whose consumer group protocol (KIP-848) is GA.
_KIP848_GA = 0x020C0000


class Membership(ABC):
    """What differs between a subscriber in a consumer group and one without.

    Attributes:
        group_id: The consumer's ``group.id`` (an ungrouped subscriber's is a throwaway one,
            never committed to).
        group: The consumer group the subscriber reports (health, telemetry, ``repr``);
            ``None`` without one.
        auto_scheme: Where ``InitialOffsetScheme.AUTO`` starts a partition with no
            confirmed position.
        commits: Confirms reach the consumer group's offsets (a receiver's ``auto_confirm``
            and a parallel receiver's finished records go there).
        may_share: The subscriber holds every partition for life, so it may read through the
            process's shared fetch (``shared_fetch``).
    """

    group: str | None
    auto_scheme: InitialOffsetScheme
    commits: bool
    may_share: bool

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id

    # -- the consumer ----------------------------------------------------------------------

    @abstractmethod
    def settings(self, cluster: Cluster, config: SubscriberConfig) -> dict[str, Any]:
        """The librdkafka settings this membership needs (a member's lease), which the
        user's own ``consumer_config`` may override.

        Raises:
            ValueError: ``group.protocol=consumer`` on a librdkafka without it.
        """

    @abstractmethod
    def partition_state(
        self, cluster: Cluster, config: SubscriberConfig, consumer: Consumer, partitions: int
    ) -> PartitionState:
        """The partitions' state: those the group gives, or all ``partitions`` for life."""

    # -- joining and leaving ---------------------------------------------------------------

    @abstractmethod
    def start(
        self, positions: Positions, confirms: Confirms, lease: Lease, partitions: int
    ) -> None:
        """Join the group, or assign every partition where it starts (its stored position,
        else the initial offset scheme).

        Raises:
            OffsetLoadError: NONE, and the group confirmed nothing.
        """

    @abstractmethod
    def leave(self, lease: Lease, *, joining: bool) -> None:
        """Leave the group before the consumer closes (``joining``: a join may be on its
        way, the subscriber had not left already by ``deactivate``)."""

    # -- the lease -------------------------------------------------------------------------

    @abstractmethod
    def assigned(self, held: Callable[[], bool]) -> bool:
        """Whether the subscriber holds partitions now; ``held()`` serves the group and says."""

    @abstractmethod
    def joined(self, lease: Lease) -> bool:
        """Whether the group has given this subscriber an assignment (maybe empty) yet."""

    # -- what is allowed -------------------------------------------------------------------

    @abstractmethod
    def needs_group(self, message: str, stream: str | None = None) -> None:
        """Refuse an operation only a group's member has (the lease, the group's offsets).

        Raises:
            IllegalSubscriberStateError: Without a group, with ``message``.
        """

    @abstractmethod
    def needs_no_group(self, message: str, stream: str | None = None) -> None:
        """Refuse an operation the group's assignment would undo (``seek``).

        Raises:
            IllegalSubscriberStateError: In a group, with ``message``.
        """

    def label(self) -> str:
        """How ``repr`` names the membership: ``group='g'`` or ``ungrouped``."""
        return "ungrouped" if self.group is None else f"group={self.group!r}"


class GroupMember(Membership):
    """A member of consumer group ``group_id``."""

    auto_scheme = InitialOffsetScheme.EARLIEST
    commits = True
    may_share = False

    def __init__(self, group_id: str) -> None:
        super().__init__(group_id)
        self.group = group_id

    def settings(self, cluster: Cluster, config: SubscriberConfig) -> dict[str, Any]:
        lease = config.lease_timeout_ms
        own: dict[str, Any] = {"max.poll.interval.ms": lease}
        # The consumer protocol keeps the session on the broker
        # (group.consumer.session.timeout.ms): the lease bounds the polls only.
        protocol = protocol_of(cluster, config)
        if protocol == "consumer" and libversion()[1] < _KIP848_GA:
            raise ValueError(
                "group.protocol=consumer needs librdkafka 2.12 or later (confluent-kafka 2.12), "
                f"where Kafka 4's consumer group protocol is GA; this one is {libversion()[0]}"
            )
        if protocol != "consumer":
            own["session.timeout.ms"] = lease
            own["heartbeat.interval.ms"] = max(100, lease // 10)
        return own

    def partition_state(
        self, cluster: Cluster, config: SubscriberConfig, consumer: Consumer, partitions: int
    ) -> PartitionState:
        incremental = protocol_of(cluster, config) != "eager"
        return GroupState(consumer, config.single.name, incremental=incremental)

    def start(
        self, positions: Positions, confirms: Confirms, lease: Lease, partitions: int
    ) -> None:
        if positions.scheme is InitialOffsetScheme.NONE:
            positions.identify(confirms.identifier)  # else a member learns it on assignment
            every = range(partitions)
            stored = confirms.stored(every) if confirms.keeps_positions else None
            positions.require_confirmed(self.group_id, stored)
        lease.subscribe()

    def leave(self, lease: Lease, *, joining: bool) -> None:
        lease.leave(joining=joining)

    def assigned(self, held: Callable[[], bool]) -> bool:
        return held()

    def joined(self, lease: Lease) -> bool:
        return lease.rebalances > 0

    def needs_group(self, message: str, stream: str | None = None) -> None:
        return None

    def needs_no_group(self, message: str, stream: str | None = None) -> None:
        raise IllegalSubscriberStateError(message, stream=stream)


class NoGroup(Membership):
    """An ungrouped subscriber: every partition, no lease, no group offsets. A share group's
    member is no consumer group's either: it reports none and has no lease to give up."""

    group = None
    auto_scheme = InitialOffsetScheme.LATEST
    commits = False
    may_share = True

    def settings(self, cluster: Cluster, config: SubscriberConfig) -> dict[str, Any]:
        return {}  # no session and no poll deadline: nothing is leased

    def partition_state(
        self, cluster: Cluster, config: SubscriberConfig, consumer: Consumer, partitions: int
    ) -> PartitionState:
        return ManualState(consumer, config.single.name, partitions)

    def start(
        self, positions: Positions, confirms: Confirms, lease: Lease, partitions: int
    ) -> None:
        positions.identify(confirms.identifier)
        every = range(partitions)
        stored = confirms.stored(every, claim=True) if confirms.keeps_positions else {}
        positions.assign({p: positions.initial(p, stored.get(p)) for p in every})

    def leave(self, lease: Lease, *, joining: bool) -> None:
        return None  # never joined

    def assigned(self, held: Callable[[], bool]) -> bool:
        return True

    def joined(self, lease: Lease) -> bool:
        return True

    def needs_group(self, message: str, stream: str | None = None) -> None:
        raise IllegalSubscriberStateError(message, stream=stream)

    def needs_no_group(self, message: str, stream: str | None = None) -> None:
        return None


def membership_of(config: SubscriberConfig, group_id: str) -> Membership:
    """The one place a subscriber's membership is chosen: in group ``group_id`` when its
    config names a group (or a durable id), else none (``group_id`` is then throwaway)."""
    return GroupMember(group_id) if config.grouped else NoGroup(group_id)


def protocol_of(cluster: Cluster, config: SubscriberConfig) -> RebalanceProtocol:
    """How ``config``'s subscriber rebalances on ``cluster`` (its settings and the cluster's)."""
    return rebalance_protocol("Cluster settings", cluster.client_config(config.consumer_config))
