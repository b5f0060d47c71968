"""``ArchiveOffsets``: the archiver's side of Kafka, and the one owner of its consumer (one per
run: ``open`` to ``close``). Its consumer group's committed offsets are the archive's position:
read at the start, committed after each written batch (and synchronously on catching up and on
stop), stepped over transaction markers when idle, and used to trim streams with a capacity
down to the archived records."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from bolide.facade.compat import FetchGaps
from bolide.facade.config import Cluster, StreamConfig
from bolide.facade.errors import BrokerError
from bolide.facade.kafka import committed_offsets, log_ends, log_starts
from bolide.facade.kafka.deletion import trim

__all__ = ["TP", "ArchiveOffsets", "log_commit_errors", "reached"]

log = logging.getLogger("bolide.stores.archiver")

TP = tuple[str, int]


class ArchiveOffsets:
    """The committed offsets of one archiver's group, over its streams' ``partitions``, and
    the consumer of the run that reads them (``open``)."""

    def __init__(
        self,
        cluster: Cluster,
        streams: dict[str, StreamConfig],
        partitions: list[TP],
        trimmable: Callable[[dict[TP, int]], dict[TP, int]],
    ) -> None:
        self._cluster = cluster
        self._streams = streams
        self._partitions = partitions
        # What of the trims a capacity wants may go (the archive's frontier, the topic's id).
        self._trimmable = trimmable
        # The topic id of each stream as archived: every commit names it in its metadata.
        self._topic_ids: Mapping[str, str | None] = {}
        #: Streams whose committed offsets were made on another topic (``committed``).
        self.foreign: set[str] = set()
        #: Per topic, for the current consumer (``Cluster.fetch_gap_settle_ms``).
        self.gaps: dict[str, FetchGaps] = {}
        self._trimmed: dict[TP, int] = {}
        self._unsettled: dict[TP, int] = {}  # committed asynchronously since the last sync
        self._consumer: Consumer | None = None  # the run's (``open`` to ``close``)

    # -- the run's consumer ----------------------------------------------------------------

    def open(self, consumer: Consumer) -> None:
        """Own ``consumer``, a run's, until ``close``: every read and commit goes through it.

        Caller: ``Archiver`` at the start of a run. Affects: the consumer used below.
        """
        self._consumer = consumer

    @property
    def consumer(self) -> Consumer:
        """The run's consumer."""
        consumer = self._consumer
        assert consumer is not None, "the archiver's offsets are used within a run"
        return consumer

    def subscribe(
        self,
        topics: list[str],
        on_assign: Callable[[Consumer, list[TopicPartition]], None],
        on_revoke: Callable[[Consumer, list[TopicPartition]], None],
    ) -> None:
        """Join the group on ``topics``: the skipped-fetch checks start anew."""
        self.gaps.clear()
        self.consumer.subscribe(topics, on_assign=on_assign, on_revoke=on_revoke)

    def consume(self, count: int, timeout_s: float) -> list[Message]:
        """Up to ``count`` messages, waiting up to ``timeout_s`` for the first."""
        return self.consumer.consume(count, timeout=timeout_s)

    def refetch(self, msg: Message) -> bool:
        """Whether ``msg`` skipped ahead of its partition's position: read again from there
        (the rest of its partition's batch comes again, in order)."""
        return self.gaps_of(str(msg.topic())).refetch(self.consumer, msg)

    def close(self) -> None:
        """Commit what is archived (``settle``), then close the run's consumer.

        Caller: ``Archiver`` at the end of a run. Affects: the group's committed offsets; the
        consumer, closed and let go.
        """
        consumer = self.consumer
        try:
            self.settle()
        finally:
            self._consumer = None
            consumer.close()

    # -- the offsets -----------------------------------------------------------------------

    def gaps_of(self, topic: str) -> FetchGaps:
        """The skipped-fetch check of ``topic`` for the current consumer."""
        gaps = self.gaps.get(topic)
        if gaps is None:
            settle_s = self._cluster.fetch_gap_settle_ms / 1000
            gaps = self.gaps[topic] = FetchGaps(topic, settle_s)
        return gaps

    def archived(self, nexts: dict[TP, int]) -> None:
        """A batch is in the database: commit its offsets asynchronously (a crash before they
        land re-reads rows that are already stored, and inserts are idempotent), then trim.

        Caller: ``Archiver`` once a batch's transaction committed. Affects: the group's
        committed offsets, the offsets still to settle, the log trimmed under a capacity.
        """
        self.consumer.commit(offsets=self._topic_partitions(nexts))
        self._unsettled.update(nexts)
        self._trim(nexts)

    def forget(self, streams: list[str]) -> None:
        """``streams``' topics were replaced: nothing of the old ones is committed or kept.

        Caller: ``Archiver`` on a recreated topic, and ``restart``. Affects: the offsets to
        settle and the trimmed marks of those topics, dropped.
        """
        gone = set(streams)
        for table in (self._unsettled, self._trimmed):
            for tp in [tp for tp in table if tp[0] in gone]:
                del table[tp]

    def restart(self, streams: Iterable[str]) -> dict[TP, int]:
        """Commit the log starts of ``streams``' topics (recreated), so that the group reads
        the new topics from there whatever the old ones' members committed last (a commit of
        an old topic's offsets that landed after the recreation must not skip the new one's
        first records); return them.

        Caller: ``Archiver`` on a recreated topic. Affects: the group's committed offsets.
        """
        starts = self._starts(self._parts_of(streams))
        self.forget(sorted({t for t, _ in starts}))
        if starts:
            self._commit(starts)
        return starts

    def settle(self) -> None:
        """Commit the latest archived offsets synchronously (on catching up and on stop).

        Caller: ``Archiver`` (caught up, stopping, before a rebalance gives partitions up).
        Affects: the group's committed offsets; nothing is left to settle.
        """
        if self._unsettled:
            unsettled, self._unsettled = self._unsettled, {}
            self._commit(unsettled)

    def past_markers(self, positions: dict[TP, int]) -> dict[TP, int]:
        """Commit read positions that moved past offsets holding no record.

        Called when a read came back empty, so every record before the positions is archived;
        a position ahead of the committed offset only stepped over transaction markers or
        compacted offsets. Without this a transactional stream would never look caught up.
        """
        consumer = self.consumer
        try:
            current = consumer.position(consumer.assignment())
        except KafkaException as exc:
            log.debug("could not read positions: %s", exc)
            return {}
        ahead = {
            (tp.topic, tp.partition): tp.offset
            for tp in current
            if tp.offset >= 0
            and tp.offset > positions.get((tp.topic, tp.partition), 0)
            and not self._checking(tp.topic, tp.partition)
        }
        return self._commit(ahead) if ahead else {}

    def _topic_partitions(self, offsets: dict[TP, int]) -> list[TopicPartition]:
        """``offsets`` to commit, each naming its topic's id in its metadata."""
        ids = self._topic_ids
        return [TopicPartition(t, p, o, metadata=ids.get(t) or "") for (t, p), o in offsets.items()]

    def _checking(self, topic: str, partition: int) -> bool:
        gaps = self.gaps.get(topic)
        return gaps is not None and gaps.checking(partition)

    def _commit(self, nexts: dict[TP, int]) -> dict[TP, int]:
        """Commit synchronously; return what Kafka accepted (a lost partition is re-read)."""
        offsets = self._topic_partitions(nexts)
        for attempt in range(3):
            try:
                result = self.consumer.commit(offsets=offsets, asynchronous=False) or []
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                if err.retriable() and attempt < 2:
                    time.sleep(0.2)
                    continue
                log.warning("offset commit failed (the records will be re-read): %s", err.str())
                return {}
            accepted = {
                (tp.topic, tp.partition): int(tp.offset) for tp in result if tp.error is None
            }
            for tp, offset in accepted.items():
                if self._unsettled.get(tp, offset) <= offset:
                    self._unsettled.pop(tp, None)  # never commit an older offset after this one
            return accepted
        return {}

    def _trim(self, committed: dict[TP, int]) -> None:
        """Keep about ``capacity`` records per partition in Kafka; only archived ones go."""
        before: dict[TP, int] = {}
        for (topic, p), position in committed.items():
            capacity = self._streams[topic].capacity
            if capacity is None:
                continue
            high = self.consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)[1]
            end = max(int(high), position)
            cut = min(position, end - capacity)
            slack = max(1, capacity // 10)
            if cut - self._trimmed.get((topic, p), 0) >= slack:
                before[(topic, p)] = cut
        if before:
            self._trimmed.update(trim(self._cluster, self._trimmable(before)))

    def committed(
        self,
        topic_ids: Mapping[str, str | None] | None = None,
        timeout_s: float = 10.0,
    ) -> dict[TP, int]:
        """The group's committed offsets; the log start where nothing is committed. With
        ``topic_ids`` (the topics as they are now), a commit made on another topic of the same
        name (its metadata names the topic id) counts as none, its stream in ``foreign``.

        Raises:
            BrokerError: The group's coordinator did not answer (retriable).
        """
        asked = [TopicPartition(t, p) for t, p in self._partitions]
        out: dict[TP, int] = {}
        missing: dict[str, list[int]] = {}
        if topic_ids is not None:
            self._topic_ids, self.foreign = topic_ids, set()
        try:
            found = committed_offsets(self.consumer, asked, timeout_s)
        except KafkaException as exc:
            raise BrokerError(
                "the archive's position (its group's committed offsets) could not be read: "
                f"{exc.args[0]}",
                retriable=True,
            ) from exc
        for tp in found:
            if tp.metadata and tp.metadata != self._topic_ids.get(tp.topic, tp.metadata):
                self.foreign.add(tp.topic)
                missing.setdefault(tp.topic, []).append(tp.partition)
            elif tp.offset is not None and tp.offset >= 0:
                out[(tp.topic, tp.partition)] = int(tp.offset)
            else:
                missing.setdefault(tp.topic, []).append(tp.partition)
        out.update(self._starts(missing))
        return out

    def refresh(self) -> dict[TP, int]:
        """Committed offsets once this member holds partitions; nothing while it joins.

        A join in progress holds the coordinator connection (brokers answer one request per
        connection at a time), so asking then would only time out.
        """
        if not self.consumer.assignment():
            return {}
        try:
            return self.committed(timeout_s=2.0)
        except KafkaException as exc:
            log.debug("could not refresh committed offsets: %s", exc)
            return {}

    def ends(self) -> dict[TP, int]:
        return {
            (name, p): end
            for name, parts in self._parts_of(self._streams).items()
            for p, end in log_ends(self._cluster, name, parts).items()
        }

    def _parts_of(self, streams: Iterable[str]) -> dict[str, list[int]]:
        """The partitions of each of ``streams`` the archiver reads."""
        return {name: [p for topic, p in self._partitions if topic == name] for name in streams}

    def _starts(self, parts: Mapping[str, list[int]]) -> dict[TP, int]:
        """The log start of each of ``parts`` (per topic), through the run's consumer."""
        return {
            (topic, p): start
            for topic, wanted in parts.items()
            for p, start in log_starts(self.consumer, topic, wanted, cluster=self._cluster).items()
        }


def log_commit_errors(err: KafkaError | None, partitions: list[TopicPartition]) -> None:
    """Asynchronous commits that fail only cost a re-read of stored rows: log them."""
    failed = [f"{tp.topic}[{tp.partition}]" for tp in partitions if tp.error is not None]
    if err is not None or failed:
        reason = err.str() if err is not None else "partition errors"
        log.warning("offset commit failed for %s (re-read on restart): %s", failed, reason)


def reached(positions: dict[TP, int], target: dict[TP, int]) -> bool:
    return all(positions.get(tp, 0) >= end for tp, end in target.items())
