"""Durable clients: GemFire's durable client/server messaging on a Kafka consumer group.

A durable client is a ``Subscriber`` with ``SubscriberConfig(durable_id=...)``. Its queue is
its own consumer group ``bolide-durable-<durable_id>`` (the committed offsets) plus a row in
the durable registry (``bolide.stores.SqlDurableRegistry``, in SQL): streams, last-seen time,
timeout, the marker of its latest connect and the claim that keeps one id connected once.

Lifecycle of one connection (``DurableSession``, owned by the subscriber, which it sees only
through the narrow ``DurableHost`` interface):

1. ``connect``: claim the id in the registry (``DurableClientBusyError`` when it is connected
   elsewhere). A client away past its timeout is expired: its position is dropped, a warning
   logged, ``on_expired(durable_id)`` called, and it starts as a new one. Then the marker is
   taken: the true end of every partition (``log_ends``), stored in the registry.
2. Every record below the marker is delivered with ``replayed=True`` (Kafka or, below Kafka's
   log start, the stream's SQL history). Records at or past the marker are live; they are
   held back, their partition paused, until every partition has reached its marker.
3. ``on_live()`` is called once, at the start of the poll after the last replayed record was
   returned (or at once when nothing is replayed), and live records follow unflagged.
4. Delivered positions are committed at the start of each poll (the application has had the
   previous batch), on ``confirm()``, and synchronously on ``close(keep_alive=True)``, which
   commits what the application had finished: what it had before its last poll, or what it
   confirmed beyond that. The last batch, unconfirmed, is delivered again on reconnect, as it
   is after a kill (at-least-once); leaving ``with Subscriber(...)`` by an exception commits
   nothing new. ``close(keep_alive=False)`` unregisters the id and drops its position.
   A client confirmed through Kafka transactions (``transactional=True``) commits none of
   what it delivered, from its first poll: only its transactions move its position.

While connected, a heartbeat thread renews the claim and the last-seen time every third of
``lease_timeout_ms``; a killed process's registry claim lapses after one such lease.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException

from bolide.facade.config import Cluster, SubscriberConfig
from bolide.facade.errors import DurableClientBusyError, StoreError, TopicRecreatedError
from bolide.facade.kafka import delete_group, log_ends, topic_identity
from bolide.facade.ports import (
    DURABLE_REGISTRIES,
    DurableRegistry,
    Incarnations,
    open_plugin,
)
from bolide.facade.record import Record

__all__ = [
    "DurableHost",
    "DurableSession",
    "drop_position",
    "durable_group_id",
    "resolve_registry",
]

log = logging.getLogger(__name__)


def durable_group_id(durable_id: str) -> str:
    """The consumer group that holds a durable client's position."""
    return f"bolide-durable-{durable_id}"


def resolve_registry(config: SubscriberConfig) -> tuple[DurableRegistry, bool]:
    """The registry for a durable subscriber, and whether the caller owns (must close) it.

    ``durable_registry`` (or, unset, the stream's store) is either a registry already, or a
    database URL or store that an installed implementation (``bolide.stores``) opens one in.

    Raises:
        ValueError: Neither ``durable_registry`` nor a SQL ``stream.store`` is set.
        TypeError: ``durable_registry`` is of an unusable type.
    """
    source: Any = config.durable_registry
    if isinstance(source, DurableRegistry):
        return source, False
    if source is not None:
        return open_plugin(DURABLE_REGISTRIES, source), True
    try:
        return open_plugin(DURABLE_REGISTRIES, config.single.store), True
    except TypeError:
        raise ValueError(
            f"durable_id={config.durable_id!r} needs a registry: set durable_registry to a "
            "SqlStore, a database URL or a DurableRegistry (such as "
            "bolide.stores.SqlDurableRegistry), or give the stream a SqlStore"
        ) from None


def drop_position(cluster: Cluster, group_id: str) -> bool:
    """Delete a consumer group's committed offsets; ``False`` when the broker refused.

    Kafka refuses while the group has members; callers that must not resume from the old
    offsets also ignore them (a durable client that is new or expired does).
    """
    try:
        delete_group(cluster, group_id, timeout_s=10)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError) and err.code() == KafkaError.GROUP_ID_NOT_FOUND:
            return True
        refused = (
            isinstance(err, KafkaError) and err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED
        )
        fix = f" (grant the user DELETE on group {group_id!r})" if refused else ""
        log.warning("could not delete the offsets of group %r: %s%s", group_id, exc, fix)
        return False
    return True


class DurableHost(Protocol):
    """The subscriber as its durable session sees it: the session's only way in.

    Partitions are the stream's; a position is the next offset to deliver. The session calls
    these while the subscriber holds its lock (from its hooks) or from its heartbeat thread
    (``report`` only).
    """

    def assigned(self) -> AbstractSet[int]:
        """The partitions the subscriber holds."""

    def positions(self) -> Mapping[int, int]:
        """The next offset to deliver, per partition."""

    def confirmed(self) -> Mapping[int, int]:
        """The highest position the application confirmed, per partition."""

    def idle(self, partition: int) -> bool:
        """True when nothing at all waits to be delivered, and ``partition`` neither reads
        history nor has a skipped fetch being read again."""

    def read_positions(self, partitions: list[int]) -> dict[int, int]:
        """Kafka's read position per partition (past records and transaction markers alike).

        Raises:
            KafkaException: The consumer could not tell.
        """

    def pause(self, partitions: list[int]) -> None:
        """Stop fetching ``partitions`` until ``resume``."""

    def resume(self, partitions: list[int]) -> None:
        """Fetch ``partitions`` again."""

    def requeue(self, records: list[Record]) -> None:
        """Deliver ``records``, in order, before anything already waiting."""

    def commit(self, positions: dict[int, int], *, asynchronous: bool) -> None:
        """Commit ``positions`` to the client's group.

        Raises:
            KafkaException: A synchronous commit failed.
        """

    def report(self, summary: str, error: BaseException | None) -> None:
        """Tell the subscriber's error handler (or the log)."""

    def call_later(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` (user code) once the subscriber lets go of its lock."""


class DurableSession:
    """One connection of a durable client; the subscriber calls it at its hook points.

    Args:
        host: The subscriber, seen through ``DurableHost``.
        cluster: Where the stream lives.
        config: The subscriber's settings; ``durable_id`` is set.
        partitions: The stream's partition count.

    Attributes:
        durable_id: The client's durable id.
        group_id: Its consumer group (``durable_group_id``).
        registry: Where the client is registered.
        owner: This connection's claim token.
        state: ``"new"``, ``"resumed"`` or ``"expired"`` (then started as new).
        marker: End offset per partition at connect: records below it are replayed.
        marker_ms: Wall-clock time (epoch ms) the marker was taken.
        live: ``on_live`` has been called; records are live from here on.
    """

    def __init__(
        self, host: DurableHost, cluster: Cluster, config: SubscriberConfig, partitions: int
    ) -> None:
        assert config.durable_id is not None
        self._host = host
        self._cluster = cluster
        self._config = config
        self._topic = config.single.name
        self._partitions = partitions
        self.durable_id: str = config.durable_id
        self.group_id = durable_group_id(config.durable_id)
        self.registry, self._owns_registry = resolve_registry(config)
        self.owner = uuid.uuid4().hex
        self.state = "new"
        self.marker: dict[int, int] = {}
        self.marker_ms: int | None = None
        self.live = False
        self._lease_ms = config.lease_timeout_ms
        self._fresh: set[int] = set()  # partitions whose old committed offsets are ignored
        self._committed: dict[int, int] = {}  # what this connection knows Kafka holds
        self._reached: set[int] = set()  # partitions whose position reached the marker
        self._held: list[Record] = []  # live records read before the replay ended
        self._paused: set[int] = set()
        #: Its confirms go through Kafka transactions (``SubscriberConfig.transactional``,
        #: fixed when it is built): nothing it delivered is committed outside them, from the
        #: first poll of the connection on.
        self.transactional = config.transactional
        #: A parallel receiver runs: it confirms what is finished, the polls commit nothing.
        self.receiving = False
        self._replayed_in_poll = 0
        self._handled: dict[int, int] = {}  # positions the application had at the last poll
        self._started: dict[int, int] = {}  # where delivery began on each assigned partition
        self._claim_lost = False
        self._connected = False
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    @property
    def commit_delivered(self) -> bool:
        """Commit what the last poll delivered at the start of the next one (the application
        has had it): unless transactions or a parallel receiver confirm what is finished."""
        return not (self.transactional or self.receiving)

    # -- connect ---------------------------------------------------------------------------

    def connect(self) -> None:
        """Claim the id, expire it if it was away too long, take and store the marker."""
        claim = self.registry.register(
            self.durable_id,
            group_id=self.group_id,
            stream=self._topic,
            timeout_s=float(self._config.durable_timeout_s),
            owner=self.owner,
            lease_ms=self._lease_ms,
        )
        self._connected = True
        self.state = claim.state
        if claim.state != "resumed":
            # A new or expired client starts from the initial offset scheme, whatever offsets
            # its group may still hold (the registry, not Kafka, says who is known).
            self._fresh = set(range(self._partitions))
            drop_position(self._cluster, self.group_id)
        if claim.state == "expired" and claim.previous is not None:
            log.warning(
                "durable client %r was away %.1fs, past its timeout of %.1fs: its queue was "
                "dropped and it starts as a new client",
                self.durable_id,
                claim.previous.away_s(claim.client.last_seen_ms),
                claim.previous.timeout_s,
            )
            hook = self._config.on_expired
            if hook is not None:
                try:
                    hook(self.durable_id)
                except Exception as exc:
                    self._host.report("on_expired raised", exc)
        key = self._incarnation(claim.state)
        self.marker = log_ends(
            self._cluster, self._topic, range(self._partitions), isolation=self._config.isolation
        )
        self.marker_ms = int(time.time() * 1000)
        self.registry.mark(self.durable_id, key, self.marker)
        log.info(
            "durable client %r connected (%s), marker %s", self.durable_id, self.state, self.marker
        )
        self._heartbeat = threading.Thread(
            target=self._beat, name=f"bolide-durable-{self.durable_id}", daemon=True
        )
        self._heartbeat.start()

    def _incarnation(self, state: str) -> str:
        """The key of the topic incarnation the stream is now, under which the marker is
        kept. A resumed client whose last marker was taken on a topic deleted since is told
        (``TopicRecreatedError``) and starts the new topic as a new client would: its queue
        was the old topic's, and nothing of it is replayed from the new one."""
        registry = self.registry
        marked_as = getattr(registry, "marked_as", None)
        if not isinstance(registry, Incarnations) or marked_as is None:
            return self._topic  # a registry that keeps markers by stream name only
        identity = topic_identity(self._cluster, self._topic)
        if identity is None:  # no topic id to tell incarnations apart
            return self._topic
        current, retired = registry.identify(self._topic, identity)
        before = marked_as(self.durable_id, self._topic)
        if before is None or before == current.stored_as:
            return current.stored_as
        self.registry.mark(self.durable_id, before, {})  # the old topic's: forgotten
        if state == "resumed":
            self._fresh = set(range(self._partitions))
            drop_position(self._cluster, self.group_id)
            self._host.report(
                f"durable client {self.durable_id!r}: {self._topic!r} was deleted and created "
                f"again since it last connected (topic id now {identity.topic_id}): its queue "
                "was the old topic's; it starts the new one by its initial offset scheme",
                TopicRecreatedError(
                    "topic recreated",
                    stream=self._topic,
                    old_topic_id=retired.topic_id
                    if retired is not None
                    else before.partition("@")[2] or "unknown",
                    topic_id=identity.topic_id,
                ),
            )
        return current.stored_as

    def _beat(self) -> None:
        interval = max(0.1, self._lease_ms / 3000)
        while not self._stop.wait(interval):
            try:
                held = self.registry.touch(self.durable_id, self.owner, self._lease_ms)
            except StoreError as exc:
                self._host.report(f"durable client {self.durable_id!r}: heartbeat failed", exc)
                continue
            if not held:
                self._claim_lost = True
                self._host.report(
                    f"durable client {self.durable_id!r} lost its claim to another connection",
                    DurableClientBusyError("claim lost", stream=self._topic),
                )
                return

    # -- hooks from the subscriber ---------------------------------------------------------

    def kept_positions(self, committed: dict[int, int]) -> dict[int, int]:
        """Committed offsets to resume from on assignment (none for a new or expired client)."""
        kept = {p: o for p, o in committed.items() if p not in self._fresh}
        self._committed.update({p: o for p, o in kept.items() if o >= 0})
        return kept

    def on_assigned(self, parts: list[int]) -> None:
        """After (re)assignment: forget held records, note reached partitions, maybe go live."""
        positions = self._host.positions()
        self._held = [r for r in self._held if r.partition not in parts]
        self._paused -= set(parts)  # a new assignment starts unpaused
        for p in parts:
            self._started[p] = positions.get(p, -1)
            if positions.get(p, -1) >= self.marker.get(p, 0):
                self._reached.add(p)
            else:
                self._reached.discard(p)
        if not self.live and self._complete() and self._replayed_in_poll == 0:
            self._go_live()

    def admit(self, record: Record) -> bool:
        """Flag a record replayed or live; ``False`` holds a live record until ``on_live``."""
        if self.live:
            return True
        p = record.partition if record.partition is not None else 0
        end = self.marker.get(p)
        if record.offset is None or end is None:
            return True
        if record.offset < end:
            record.replayed = True
            self.replayed_run(p, record.offset)
            return True
        self._reached.add(p)  # a record at or past the marker: the replay of p is over
        self._held.append(record)
        if self._complete() and self._replayed_in_poll == 0:
            self._go_live()  # releases the held records, this one last, through the pending list
            return False
        if p not in self._paused:
            self._host.pause([p])
            self._paused.add(p)
        return False

    def replay_end(self, partition: int) -> int | None:
        """The marker of ``partition`` while its replay runs: a reader may flag records below it
        replayed in bulk (``replayed_run``) and must ``admit`` any at or past it one by one.
        ``None`` when every record is admitted as it is (live, or no marker)."""
        return None if self.live else self.marker.get(partition)

    def replayed_run(self, partition: int, last: int) -> None:
        """Note a run of ``partition``'s records up to offset ``last``, all below the marker and
        flagged ``replayed`` by the reader: what ``admit`` does for each, once per run."""
        self._replayed_in_poll += 1  # only "none in this poll" matters: the replay goes on
        if last + 1 >= self.marker.get(partition, 0):
            self._reached.add(partition)

    def before_poll(self) -> None:
        """Commit what the last poll delivered; go live if the replay ended there.

        Raises:
            DurableClientBusyError: Another connection took this durable id over.
        """
        if self._claim_lost:
            raise DurableClientBusyError(
                f"durable client {self.durable_id!r} was taken over by another connection",
                stream=self._topic,
            )
        if self.commit_delivered:
            # The application has had the previous batch: that much is delivered.
            self._handled = self._delivered()
            self._commit(self._handled, asynchronous=True, force=False)
        self._replayed_in_poll = 0
        if not self.live and not self._complete():
            self._reach_by_position()
        if not self.live and self._complete():
            self._go_live()

    def before_close(self, keep_alive: bool, *, failed: bool = False) -> None:
        """Stop the heartbeat; with ``keep_alive``, commit what the application finished.

        That is what it had before its last poll, or confirmed beyond it; the batch of the
        last poll may be half handled. ``failed`` (leaving by an exception) commits only what
        the last poll already committed.
        """
        self._stop.set()
        if self._heartbeat is not None and self._heartbeat is not threading.current_thread():
            self._heartbeat.join(5)
        if keep_alive and not self._claim_lost:
            # Where delivery began is finished trivially: committing it keeps the queue's
            # place for a partition the application was handed nothing from.
            positions = {p: o for p, o in self._started.items() if o >= 0}
            positions.update(self._handled)
            if not failed:
                for p, o in self._host.confirmed().items():
                    positions[p] = max(o, positions.get(p, o))
            try:
                self._commit(positions, asynchronous=False, force=True)
            except KafkaException as exc:
                self._host.report(
                    f"durable client {self.durable_id!r}: final commit failed; the last records "
                    "will be delivered again",
                    exc,
                )

    def after_close(self, keep_alive: bool) -> None:
        """Release the claim (keep the queue) or unregister the client and drop its position."""
        try:
            if not self._connected or self._claim_lost:
                return
            if keep_alive:
                self.registry.release(self.durable_id, self.owner)
            elif self.registry.unregister(self.durable_id, self.owner) and not drop_position(
                self._cluster, self.group_id
            ):
                self._host.report(
                    f"durable client {self.durable_id!r} unregistered, but its group offsets "
                    "could not be deleted (ignored when the id connects again)",
                    None,
                )
        except StoreError as exc:
            self._host.report(f"durable client {self.durable_id!r}: registry update failed", exc)
        finally:
            self._connected = False
            if self._owns_registry:
                self.registry.close()

    def abort(self) -> None:
        """The subscriber failed to start: release the claim, keep the queue."""
        self.before_close(keep_alive=False)
        self.after_close(keep_alive=True)

    # -- internals -------------------------------------------------------------------------

    def _reach_by_position(self) -> None:
        """Note partitions whose read position passed the marker with nothing left to deliver.

        The last offsets below a marker may hold no record (transaction markers, compaction):
        no record then ends the replay, but Kafka's read position steps over them.
        """
        host = self._host
        assigned = host.assigned()
        waiting = [
            p for p in self.marker if p not in self._reached and p in assigned and host.idle(p)
        ]
        if not waiting:
            return
        try:
            positions = host.read_positions(waiting)
        except KafkaException as exc:
            log.debug("could not read positions: %s", exc)
            return
        for p, offset in positions.items():
            if offset >= self.marker[p]:
                self._reached.add(p)

    def _complete(self) -> bool:
        wanted = set(self.marker)
        return wanted <= self._reached and wanted <= self._host.assigned()

    def _go_live(self) -> None:
        host = self._host
        self.live = True
        held, self._held = self._held, []
        assigned = host.assigned()
        paused = [p for p in self._paused if p in assigned]
        self._paused.clear()
        hook = self._config.on_live
        if hook is not None:

            def call() -> None:
                try:
                    hook()
                except Exception as exc:
                    host.report("on_live raised", exc)

            host.call_later(call)  # user code: after the subscriber lets go of its lock
        log.info("durable client %r is live", self.durable_id)
        host.requeue(held)
        if paused:
            host.resume(paused)

    def _delivered(self) -> dict[int, int]:
        positions = self._host.positions()
        return {p: o for p in sorted(self._host.assigned()) if (o := positions.get(p, -1)) >= 0}

    def _commit(self, positions: dict[int, int], *, asynchronous: bool, force: bool) -> None:
        assigned = self._host.assigned()
        changed = {
            p: o
            for p, o in positions.items()
            if p in assigned and (force or self._committed.get(p) != o)
        }
        if not changed:
            return
        self._host.commit(changed, asynchronous=asynchronous)
        for p, o in changed.items():
            self._committed[p] = o
            self._fresh.discard(p)
