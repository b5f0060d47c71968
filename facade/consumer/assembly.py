"""``assemble``: a subscriber's parts, built together because they share its partitions' state,
its queue, its lock and its error handler."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, Message, TopicPartition

from bolide.facade.config import Cluster, InitialOffsetScheme, SubscriberConfig
from bolide.facade.consumer.client import protocol_of
from bolide.facade.consumer.confirms import Confirms
from bolide.facade.consumer.fetch import Fetcher
from bolide.facade.consumer.host import ReceiverHooks, ReceiverSeat, SessionHost, SubscriberView
from bolide.facade.consumer.lease import Lease
from bolide.facade.consumer.positions import Positions, Report
from bolide.facade.consumer.state import GroupState, ManualState, PartitionState
from bolide.facade.durable import DurableSession
from bolide.facade.errors import IllegalSubscriberStateError
from bolide.facade.kafka.fatal import Refusals
from bolide.facade.record import Record
from bolide.facade.support import HookLock

__all__ = ["Parts", "assemble"]


@dataclass(slots=True, frozen=True)
class Parts:
    """What a subscriber is made of (see docs/architecture.md)."""

    consumer: Consumer
    #: The partitions' state (held, positions, read, confirmed, holds): its only writer.
    state: PartitionState
    positions: Positions
    confirms: Confirms
    #: Read, not yet delivered.
    pending: deque[Message | Record]
    #: A durable client's session (GemFire's durable client), else ``None``.
    durable: DurableSession | None
    fetcher: Fetcher
    lease: Lease
    #: A running parallel receiver's revoke listener and confirm limit.
    receiver_hooks: ReceiverHooks

    def start(self, config: SubscriberConfig, group_id: str, partitions: int) -> None:
        """Claim the durable id, then join the group or assign every partition (where each
        starts: its stored position, else the initial offset scheme). On failure the
        durable claim is given back and the consumer closed (never subscribed: nothing to
        revoke)."""
        try:
            if self.durable is not None:
                self.durable.connect()
            confirms, positions, every = self.confirms, self.positions, range(partitions)
            if not config.grouped or positions.scheme is InitialOffsetScheme.NONE:
                positions.identify(confirms.identifier)  # a member learns it on assignment
            if config.grouped:
                if positions.scheme is InitialOffsetScheme.NONE:
                    stored = confirms.stored(every) if confirms.keeps_positions else None
                    positions.require_confirmed(group_id, stored)
                self.lease.subscribe()
            else:
                stored = confirms.stored(every, claim=True) if confirms.keeps_positions else {}
                positions.assign({p: positions.initial(p, stored.get(p)) for p in every})
        except BaseException:
            try:
                if self.durable is not None:
                    self.durable.abort()
            finally:
                self.consumer.close()
            raise

    def for_transaction(self) -> tuple[list[TopicPartition], Any, Callable[[], None]]:
        """For ``Publisher.confirm``: the delivered positions, the group's metadata, and what
        to call once the transaction commits.

        Raises:
            IllegalSubscriberStateError: A durable client not built ``transactional``: its
                polls commit what they delivered, outside the transaction.
        """
        if self.durable is not None and not self.durable.transactional:
            raise IllegalSubscriberStateError(
                "a durable client confirmed through transactions must say so when it is "
                "built, SubscriberConfig(transactional=True): otherwise its polls commit what "
                "they delivered outside the transaction, and an abort loses it",
                stream=self.positions.topic,
            )
        return self.confirms.for_transaction(deactivated=self.fetcher.deactivated)

    def close(self, grouped: bool, keep_alive: bool, *, failed: bool) -> None:
        """Shut the parts down in order: the durable client's last commit, leaving the
        group, the consumer, then confirms, the durable registry and the dead letters."""
        durable = self.durable
        try:
            if durable is not None:
                durable.before_close(keep_alive, failed=failed)
        finally:
            try:
                if grouped:
                    # A deactivated subscriber has left already: no join is on its way.
                    self.lease.leave(joining=not self.fetcher.deactivated)
                self.consumer.close()
            finally:
                self.confirms.close()
                if durable is not None:
                    durable.after_close(keep_alive)
                self.fetcher.close()

    def seat(
        self,
        subscriber: SubscriberView,
        lock: HookLock,
        report: Report,
        confirm: Callable[[int, int], None],
        rewind: Callable[[Mapping[int, int]], None],
    ) -> ReceiverSeat:
        """The receivers' view of ``subscriber`` (``ReceiverHost``)."""
        return ReceiverSeat(
            subscriber,
            self.consumer,
            state=self.state,
            lock=lock,
            report=report,
            confirm=confirm,
            note_finished=self.confirms.note_finished,
            rewind=rewind,
            decode=self.fetcher.decode,
            hooks=self.receiver_hooks,
            durable=self.durable,
        )


def _partition_state(
    cluster: Cluster, config: SubscriberConfig, consumer: Consumer, partitions: int
) -> PartitionState:
    """A group member's partitions (moved one by one under an incremental protocol), else
    an ungrouped subscriber's: all ``partitions`` of its stream."""
    topic = config.single.name
    if not config.grouped:
        return ManualState(consumer, topic, partitions)
    return GroupState(consumer, topic, incremental=protocol_of(cluster, config) != "eager")


def assemble(
    cluster: Cluster,
    config: SubscriberConfig,
    consumer: Consumer,
    partitions: int,
    *,
    group_id: str,
    report: Report,
    lock: HookLock,
    closed: Callable[[], bool],
    refusals: Refusals,
) -> Parts:
    """Build the parts of a subscriber of ``config`` on ``consumer`` (a stream of
    ``partitions``). Nothing talks to Kafka until ``Parts.start``."""
    topic, grouped = config.single.name, config.grouped
    state = _partition_state(cluster, config, consumer, partitions)
    positions = Positions(cluster, config, consumer, state, partitions, report)
    confirms = Confirms(
        topic,
        consumer,
        positions,
        grouped=grouped,
        group_id=group_id,
        store=config.positions,
        report=report,
        lock=lock,
    )
    pending: deque[Message | Record] = deque()
    host = SessionHost(consumer, topic, positions, pending, report, lock)
    durable = DurableSession(host, cluster, config, partitions) if config.durable_id else None
    hooks = ReceiverHooks()
    fetcher = Fetcher(
        cluster,
        config,
        consumer,
        positions=positions,
        durable=durable,
        report=report,
        lease_expired=lambda: lease.expired(),  # the lease, built next, drops what is lost
        pending=pending,
        refusals=refusals,
        claim_again=lambda: lease.claim_again(),
    )
    lease = Lease(
        config,
        consumer,
        topic,
        group_id,
        state=state,
        positions=positions,
        confirms=confirms,
        fetcher=fetcher,
        hooks=hooks,
        durable=durable,
        report=report,
        lock=lock,
        closed=closed,
    )
    return Parts(consumer, state, positions, confirms, pending, durable, fetcher, lease, hooks)
