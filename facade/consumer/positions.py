"""``Positions``: where each partition of a subscriber reads next, and how it got there.

It resolves the initial offset scheme (LATEST is the end when the subscriber started),
assigns Kafka partitions at positions (splicing the stream's history below Kafka's log start,
else skipping to it with a warning: Meteor's stale read), positions a grouped member after a
rebalance (never below its own confirm), and keeps the per-partition bookkeeping the
subscriber moves only for records a poll returned.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from confluent_kafka import OFFSET_INVALID, Consumer, TopicPartition

from bolide.facade.config import Cluster, InitialOffsetScheme, SubscriberConfig
from bolide.facade.consumer.state import PartitionState
from bolide.facade.errors import (
    BrokerError,
    ClusterMismatchError,
    OffsetLoadError,
    OffsetOutOfRangeError,
    StoreError,
    TopicRecreatedError,
)
from bolide.facade.history import HistoryCursor
from bolide.facade.kafka import committed_offsets, log_ends, log_starts, topic_identity
from bolide.facade.kafka.compat import FetchGaps
from bolide.facade.ports import TopicIdentity

__all__ = ["EARLIEST", "Positions", "Report"]

EARLIEST = -2  # a symbolic position resolved per partition: the first record available

#: ``report(summary, error)``: the subscriber's error handler (or log).
Report = Callable[[str, BaseException | None], None]


class Positions:
    """Where a subscriber's partitions read, and how they get there; its caller holds the
    subscriber's lock. The positions themselves live in ``state``, which it tells.

    Attributes:
        scheme: The initial offset scheme, ``AUTO`` resolved.
        state: The subscriber's partitions (positions, what was read and confirmed, holds).
        history: The splice: history being read below Kafka's log start.
        gaps: Fetches that skipped ahead, being read again.
        holds: Which partitions are paused, and why (the history splice is one reason).
    """

    def __init__(
        self,
        cluster: Cluster,
        config: SubscriberConfig,
        consumer: Consumer,
        state: PartitionState,
        partitions: int,
        report: Report,
        *,
        auto: InitialOffsetScheme,
    ) -> None:
        self.topic = config.single.name
        self.state = state
        self._cluster = cluster
        self._consumer = consumer
        self._partitions = partitions
        self._report = report
        self._resume_at: dict[int, int] = {}  # where Kafka takes over from the history
        self.holds = state.holds
        self.gaps = FetchGaps(self.topic, cluster.fetch_gap_settle_ms / 1000)
        self.history = HistoryCursor(config.single)
        self._recreated: str | None = None  # the new topic id last reported
        scheme = config.initial_offset_scheme
        if scheme is InitialOffsetScheme.AUTO:
            scheme = auto
        self.scheme = scheme
        # LATEST means after the last record that existed when the subscriber started; for a
        # read_committed subscriber, from the last stable offset (what it reads next).
        self._latest = (
            log_ends(cluster, self.topic, range(partitions), isolation=config.isolation)
            if scheme is InitialOffsetScheme.LATEST
            else {}
        )

    # -- which topic ---------------------------------------------------------------------

    def identify(self, positions: Callable[[TopicIdentity], str | None] | None) -> None:
        """Learn which topic the stream is now, for the stores that keep what is read of it
        (the history spliced below Kafka, and ``positions``: the positions in the application's
        database, ``Confirms.identifier``). Each then reads that topic incarnation's rows only;
        a topic deleted and created again is reported once (``TopicRecreatedError``).

        A cluster that does not answer, or a store that cannot record the topic (one this
        user may only read), is reported, and the incarnation known is read.

        Raises:
            ClusterMismatchError: A store holds the stream of another cluster.
        """
        others = () if positions is None else (positions,)
        if self.history.store is None and not others:
            return
        try:
            identity = topic_identity(self._cluster, self.topic)
        except BrokerError as exc:  # positioning goes on with the incarnation known
            self._report(f"which topic {self.topic!r} is could not be asked; asked again", exc)
            return
        if identity is None:  # no topic id to tell incarnations apart
            return
        old = None
        for learn in (self.history.identify, *others):
            try:
                old = learn(identity) or old
            except ClusterMismatchError:
                raise  # refused: another cluster's offsets are never used
            except StoreError as exc:  # a store this user may only read, or one away
                self._report(f"which topic {self.topic!r} is could not be recorded", exc)
        if old is None or self._recreated == identity.topic_id:
            return
        self._recreated = identity.topic_id
        self._report(
            f"{self.topic!r} was deleted and created again (topic id {old} -> "
            f"{identity.topic_id}): what was stored of the old topic (history, positions) is "
            "not read for the new one, which starts by the initial offset scheme",
            TopicRecreatedError(
                "topic recreated", stream=self.topic, old_topic_id=old, topic_id=identity.topic_id
            ),
        )

    # -- where a partition starts --------------------------------------------------------

    def require_confirmed(self, group_id: str, stored: dict[int, int] | None = None) -> None:
        """Fail unless ``group_id`` confirmed something (the NONE scheme of a grouped member).

        Args:
            stored: The positions kept in the application's database, when it keeps them:
                they stand in for the group's committed offsets.

        Raises:
            OffsetLoadError: The group has no confirmed offset on the stream.
        """
        if stored is None:
            stored = self.committed(list(range(self._partitions)))
        if not any(offset >= 0 for offset in stored.values()):
            raise OffsetLoadError(
                f"group {group_id!r} has no confirmed offset on {self.topic!r} and the "
                "initial offset scheme is NONE",
                stream=self.topic,
            )

    def initial(self, partition: int, committed: int | None) -> int:
        """Resolve where a partition without a usable position starts."""
        if committed is not None and committed >= 0:
            return committed
        if self.scheme is InitialOffsetScheme.LATEST:
            return self._latest[partition]
        if self.scheme is InitialOffsetScheme.NONE:
            self._report(
                f"no confirmed offset for partition {partition}; starting at the earliest",
                OffsetLoadError("no confirmed offset", stream=self.topic, partition=partition),
            )
        return EARLIEST

    # -- assigning -------------------------------------------------------------------------

    def assign(self, positions: dict[int, int]) -> None:
        """Assign Kafka partitions at ``positions``, splicing history for what Kafka dropped."""
        starts = log_starts(self._consumer, self.topic, positions, cluster=self._cluster)
        assignment: list[TopicPartition] = []
        splicing: list[int] = []
        for partition, wanted in positions.items():
            start = starts[partition]
            offset = wanted
            if wanted == EARLIEST:
                first = self.history.first_offset(partition)
                offset = first if first is not None and first < start else start
            if offset < start:
                if self.history.covers(partition, offset, start):
                    self.history.open(partition, offset, start)
                else:
                    self._report(
                        f"position {offset} of {self.topic}[{partition}] is below the first "
                        f"available record {start}; skipping to it (stale read)",
                        OffsetOutOfRangeError(
                            "stale position",
                            stream=self.topic,
                            partition=partition,
                            offset=offset,
                        ),
                    )
                offset = start
            spliced = self.history.position(partition)
            self.state.delivered(partition, spliced if spliced is not None else offset)
            self.state.starts(partition, spliced if spliced is not None else offset)
            self.gaps.expected[partition] = offset
            tp = TopicPartition(self.topic, partition, offset)
            assignment.append(tp)
            if self.history.active(partition):
                splicing.append(partition)
                self._resume_at[partition] = offset
            else:
                self._resume_at.pop(partition, None)
        self.state.assign(assignment)
        # Kafka reads a partition once nothing holds it: not while its history is read.
        self.holds.reapply(positions)
        self.holds.hold(splicing, "history")
        self.holds.release(set(positions) - set(splicing), "history")

    def committed(self, parts: list[int]) -> dict[int, int]:
        """The group's committed offsets of ``parts`` (negative where it has none)."""
        return {p: o for p, (o, _) in self.committed_with_metadata(parts).items()}

    def committed_with_metadata(self, parts: list[int]) -> dict[int, tuple[int, str | None]]:
        """The group's committed offsets of ``parts`` (negative where it has none), each with
        its commit's metadata."""
        request = [TopicPartition(self.topic, p) for p in parts]
        found = committed_offsets(self._consumer, request)
        return {tp.partition: (tp.offset, tp.metadata) for tp in found}

    def resume(self, parts: list[int], committed: dict[int, int]) -> None:
        """Assign ``parts`` gained in a rebalance, from ``committed`` or the initial scheme."""
        self.assign(self.resume_targets(parts, committed))

    def resume_targets(self, parts: list[int], committed: dict[int, int]) -> dict[int, int]:
        """Where ``parts`` resume: ``committed`` (never below this member's own confirm), else
        the initial scheme; what this member read stays confirmable only where no other
        member confirmed beyond it."""
        state = self.state
        for p, mine in state.confirmed().items():
            # An asynchronous confirm may not have landed yet: never go back below it.
            if p in committed and mine > committed[p]:
                committed[p] = mine
        for p in parts:
            # What this member read stays confirmable unless another member confirmed beyond
            # it in the meantime (a routine rebalance hands the same partition straight back).
            last, done = state.last_read().get(p), committed.get(p)
            if last is not None and done is not None and done > last + 1:
                state.unread(p)
            self.history.close(p)
        return {p: self.initial(p, committed.get(p)) for p in parts}

    def fallback(self, parts: list[int], known: Mapping[int, int]) -> None:
        """Assign ``parts`` without the history or the initial offset scheme: from ``known``
        (the positions read before positioning failed, a position store's included), else
        from the group's committed offsets as Kafka looks them up. Never from below a known
        one: a member holding the claim of a position store would write again what is already
        written. Never from this member's own last confirm: another member may have held the
        partition since and confirmed beyond it, in a transaction still open (the lookup
        that failed waited for it), and going back there would process those records again;
        Kafka's own lookup waits until such a transaction ends."""
        assignment = []
        state = self.state
        for p in parts:
            self.history.close(p)
            self._resume_at.pop(p, None)
            if known.get(p, -1) >= 0:
                offset = self.gaps.expected[p] = known[p]
                state.delivered(p, offset)
            else:
                # Kafka resumes from the group's confirmed offset.
                offset = OFFSET_INVALID
                state.forget_next(p)
                self.gaps.expected.pop(p, None)
            assignment.append(TopicPartition(self.topic, p, offset))
        state.assign(assignment)
        self.holds.reapply(parts)
        self.holds.release(parts, "history")

    def move(self, assigned: Iterable[int], partition: int, offset: int) -> None:
        """Move ``partition`` to ``offset``; the other ``assigned`` partitions restart where
        delivery stands (the caller drops what it fetched but did not deliver)."""
        nexts = self.state.nexts()
        positions = {p: nexts.get(p, EARLIEST) for p in assigned}
        positions[partition] = offset
        for p in positions:
            self.history.close(p)
        self.assign(positions)

    def restart(self, partitions: Iterable[int]) -> None:
        """Kafka fetches ``partitions`` on from the next offset expected of it, after another
        source delivered them (the shared fetch's ring): the delivery position, or where Kafka
        takes over from the history spliced (read or queued). A paused partition stays paused
        and fetches from there once resumed (Kafka's own resume position is where this
        consumer last delivered, not where the subscriber stands)."""
        expected, nexts = self.gaps.expected, self.state.nexts()
        for p in partitions:
            self.state.seek(p, expected.get(p, nexts[p]))

    def rewind(self, partition: int, offset: int) -> None:
        """Read a held partition again from ``offset``, the lease kept (Kafka's ``seek``)."""
        self.state.delivered(partition, offset)
        self.gaps.expected[partition] = offset
        self.state.seek(partition, offset)

    def out_of_range(self, partition: int, offset: int | None) -> int:
        """Where a position Kafka calls out of range goes: below the log start it stays (the
        splice or a stale read follows); within the log it stays too (a leader that had not
        caught up yet answered: the fetch is tried again); past the end it is reported and
        moved to the end."""
        start = log_starts(self._consumer, self.topic, [partition], cluster=self._cluster)[
            partition
        ]
        position = offset if offset is not None and offset >= 0 else start
        if position < start:
            return position
        end = self._log_end(partition)
        if position <= end:
            return position
        self._past_end(f"offset {position}", partition, position, end)
        return end

    def seek_target(self, partition: int, offset: int) -> int:
        """Where ``seek(offset)`` goes: past the end is reported and moved to the end. What
        was read on the partition is no longer confirmable."""
        end = self._log_end(partition)
        if offset > end:
            self._past_end(f"seek to {offset}", partition, offset, end)
            offset = end
        self.state.unread(partition)
        return offset

    def _log_end(self, partition: int) -> int:
        """The end of the log, open transactions included: what lies below it exists."""
        return log_ends(self._cluster, self.topic, [partition], isolation="read_uncommitted")[
            partition
        ]

    def _past_end(self, what: str, partition: int, offset: int, end: int) -> None:
        self._report(
            f"{what} is past the end {end} of {self.topic}[{partition}]",
            OffsetOutOfRangeError(
                "offset out of range", stream=self.topic, partition=partition, offset=offset
            ),
        )

    # -- the splice ------------------------------------------------------------------------

    def history_read(self) -> None:
        """After a history read: report its gaps, hand finished partitions back to Kafka."""
        for partition, first, stop in self.history.gaps():
            self._report(
                f"offsets {first} to {stop - 1} of {self.topic}[{partition}] are neither in "
                "the history store nor in Kafka; skipping to what Kafka holds (stale read)",
                OffsetOutOfRangeError(
                    "gap in the history", stream=self.topic, partition=partition, offset=first
                ),
            )
        finished = self.history.finished()
        if finished:
            free = self.holds.release(finished, "history")
            for p in finished:
                offset = self._resume_at.pop(p)
                if p in free:
                    # A fresh fetch at once: a resumed partition otherwise waits out a backoff.
                    self.state.seek(p, offset)
