"""Replaying dead letters: claim, publish, record, and settling what a dead replay left in doubt.

Per batch of dead letters, one transaction claims them in ``bolide_dead_letter_replays``
(one row per dead letter and target stream, ``target_offset`` NULL, this run's ``owner``),
then they are published, then one transaction records the offsets the broker acknowledged.
A claim still NULL when a later replay starts is *in doubt*: its replay died, or runs, between
the two transactions. The later replay looks for it in the target stream (a record whose
``bolide.replayed.from`` is the dead letter's id, from the claim's time on) and records it
without publishing when it is there; it publishes it again only when it is not there and the
claim is older than ``claim_timeout_s`` (younger claims may belong to a replay still running).

A row names its dead letter by place, topic id and timestamp (``_books``): a dead letter
of a topic deleted and created again is a new dead letter, replayed even where the previous
incarnation's letter at the same place was.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from functools import partial

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from bolide.facade.config import Cluster, PublisherConfig, StreamConfig
from bolide.facade.deadletter import REPLAYED_FROM_HEADER, replayed
from bolide.facade.errors import PublishError
from bolide.facade.kafka import offsets_for_time
from bolide.facade.publisher import Publisher
from bolide.facade.record import Record
from bolide.stores.deadletters._books import Entry, Letter, Replayed, covering
from bolide.stores.deadletters._scan import kafka_bounds, read_kafka, reader
from bolide.stores.schema import REPLAYS
from bolide.stores.store import SqlStore

__all__ = ["Job", "Replay", "replay_targets"]

log = logging.getLogger(__name__)

#: Dead letters per claim transaction and publish round.
BATCH = 500
#: How far before a claim the target is searched: the broker's clock may differ from ours.
_CLOCK_SKEW_MS = 300_000
_ACK_TIMEOUT_S = 60.0

#: ``(topic id, partition, offset, target stream)``: one replay of one dead letter (its row).
Key = tuple[str, int, int, str]
#: ``(partition, offset, target stream)``: the replays of every letter that held a place.
Target = tuple[int, int, str]


@dataclass(frozen=True)
class Job:
    """A dead letter (a record of the dead-letter stream) and the stream to replay it to.

    Attributes:
        letter: The dead letter.
        target: The stream to publish it to.
        which: Which letter it is at its place (``_books``).
        topic_id: The ``topic_id`` of its row: ``which``'s, or that of the row found for it.
    """

    letter: Record
    target: str
    which: Letter
    topic_id: str

    @property
    def place(self) -> Target:
        return (self.letter.partition or 0, self.letter.offset or 0, self.target)

    @property
    def key(self) -> Key:
        return (self.topic_id, *self.place)

    @property
    def id(self) -> str:
        return f"{self.letter.stream}/{self.letter.partition}/{self.letter.offset}"


@dataclass(frozen=True)
class _Claim(Entry):
    owner: str
    done: bool


def replay_targets(conn: Connection, stream: str) -> dict[tuple[int, int], list[Replayed]]:
    """The acknowledged replays of ``stream``'s dead letters, by place, oldest first."""
    r = REPLAYS.c
    query = (
        sa.select(
            r.kafka_partition,
            r.kafka_offset,
            r.topic_id,
            r.timestamp_ms,
            r.claimed_ms,
            r.target_stream,
        )
        .where(r.stream == stream, r.target_offset.is_not(None))
        .order_by(r.replayed_ms, r.target_stream)
    )
    found: dict[tuple[int, int], list[Replayed]] = {}
    for partition, offset, topic, stamp, at, target in conn.execute(query):
        done = Replayed(str(topic), None if stamp is None else int(stamp), int(at), str(target))
        found.setdefault((int(partition), int(offset)), []).append(done)
    return found


def _now_ms() -> int:
    return int(time.time() * 1000)


class Replay:
    """One replay run over one dead-letter stream (its own ``owner`` token)."""

    def __init__(
        self,
        store: SqlStore,
        cluster: Cluster,
        stream: str,
        *,
        claim_timeout_s: float,
        progress: Callable[[int, int], object] | None,
    ) -> None:
        self.store, self.cluster, self.stream = store, cluster, stream
        self.owner = uuid.uuid4().hex
        self.claim_timeout_ms = int(claim_timeout_s * 1000)
        self.progress = progress
        self._publishers: dict[str, Publisher] = {}

    def run(self, jobs: list[Job]) -> int:
        """Replay ``jobs`` (skipping those done before); return how many were published now.

        Raises:
            PublishError: A record was not published: what was acknowledged is recorded,
                the failed ones are claimed no more (the next replay tries them again).
        """
        rows = self.store.guarded("replay state", self._claims, stream=self.stream)
        claims: dict[Key, _Claim] = {}
        fresh: list[Job] = []
        doubtful: list[Job] = []
        for job in jobs:
            claim = covering(rows.get(job.place, []), job.which)
            if claim is None:
                fresh.append(job)
            elif not claim.done:  # in doubt: settled under its own row's key
                doubtful.append(replace(job, topic_id=claim.topic_id))
                claims[doubtful[-1].key] = claim
        log.info(
            "%s: %d dead letters chosen, %d new to their target, %d left in doubt by a replay",
            self.stream,
            len(jobs),
            len(fresh),
            len(doubtful),
        )
        todo = sorted(fresh + self._settle(doubtful, claims), key=lambda j: j.key)
        published = 0
        try:
            for first in range(0, len(todo), BATCH):
                published += self._batch(todo[first : first + BATCH])
                if self.progress is not None:
                    self.progress(min(first + BATCH, len(todo)), len(todo))
        finally:
            for publisher in self._publishers.values():
                publisher.close()
        return published

    def _claims(self) -> dict[Target, list[_Claim]]:
        """Every replay row of the stream, by place and target."""
        r = REPLAYS.c
        query = sa.select(
            r.kafka_partition,
            r.kafka_offset,
            r.target_stream,
            r.topic_id,
            r.timestamp_ms,
            r.claimed_ms,
            r.owner,
            r.target_offset,
        ).where(r.stream == self.stream)
        found: dict[Target, list[_Claim]] = {}
        with self.store.engine.connect() as conn:
            for p, o, t, topic, stamp, at, owner, done in conn.execute(query):
                claim = _Claim(
                    str(topic),
                    None if stamp is None else int(stamp),
                    int(at),
                    str(owner),
                    done is not None,
                )
                found.setdefault((int(p), int(o), str(t)), []).append(claim)
        return found

    # -- claims in doubt --------------------------------------------------------------------

    def _settle(self, doubtful: list[Job], claims: dict[Key, _Claim]) -> list[Job]:
        """Record the doubtful replays found in their targets; return those to publish again
        (their claims taken over), leaving claims too young to judge alone."""
        again: list[Job] = []
        targets = sorted({j.target for j in doubtful})
        for target in targets:
            jobs = [j for j in doubtful if j.target == target]
            since = min(claims[j.key].written_ms for j in jobs) - _CLOCK_SKEW_MS
            found = self._published(target, {j.id for j in jobs}, since)
            self.store.guarded(
                "replay record", partial(self._record_found, jobs, found), stream=self.stream
            )
            now = _now_ms()
            young = [j for j in jobs if now - claims[j.key].written_ms < self.claim_timeout_ms]
            for job in jobs:
                if job.id not in found and job not in young:
                    take = partial(self._take_over, job, claims[job.key])
                    if self.store.guarded("replay claim", take, stream=self.stream):
                        again.append(job)
            young = [j for j in young if j.id not in found]
            if young:
                log.warning(
                    "%s: %d dead letters (first: %s) were claimed by another replay less than "
                    "%.0f s ago and are not in %s yet: left to it. If no other replay runs (one "
                    "died), replay again with claim_timeout_s=0",
                    self.stream,
                    len(young),
                    young[0].id,
                    self.claim_timeout_ms / 1000,
                    target,
                )
        return again

    def _published(self, target: str, ids: set[str], since_ms: int) -> dict[str, tuple[int, int]]:
        """Where records of ``target`` carrying ``bolide.replayed.from`` in ``ids`` are."""
        found: dict[str, tuple[int, int]] = {}
        consumer = reader(self.cluster)
        try:
            bounds = kafka_bounds(self.cluster, consumer, target)
            if not bounds:
                return found
            firsts = offsets_for_time(self.cluster, target, list(bounds), max(0, since_ms))
            for partition, (start, end) in bounds.items():
                begin = max(start, firsts.get(partition, start))
                for record in read_kafka(consumer, self.cluster, target, partition, begin, end):
                    origin = (record.header(REPLAYED_FROM_HEADER) or b"").decode(errors="replace")
                    if origin in ids:
                        found[origin] = (partition, record.offset or 0)
        finally:
            consumer.close()
        return found

    def _record_found(self, jobs: list[Job], found: dict[str, tuple[int, int]]) -> None:
        with self.store.engine.begin() as conn:
            for job in jobs:
                if job.id in found:
                    partition, offset = found[job.id]
                    conn.execute(self._complete(job, None), _done(partition, offset))

    def _take_over(self, job: Job, claim: _Claim) -> bool:
        r = REPLAYS.c
        with self.store.engine.begin() as conn:
            taken = conn.execute(
                sa.update(REPLAYS)
                .where(*self._where(job), r.owner == claim.owner, r.target_offset.is_(None))
                .values(owner=self.owner, claimed_ms=_now_ms())
            )
            return bool(taken.rowcount)

    # -- one batch ----------------------------------------------------------------------------

    def _batch(self, jobs: list[Job]) -> int:
        """Claim, publish, record ``jobs``; return how many were published."""
        for target in sorted({j.target for j in jobs}):
            self._publisher(target)  # a target that cannot be reached fails before any claim
        mine = self.store.guarded("replay claim", lambda: self._claim(jobs), stream=self.stream)
        sent: list[tuple[Job, Record, Future[int]]] = []
        refused: BaseException | None = None
        for job in jobs:
            if job.key not in mine:
                continue
            record = replayed(job.letter, job.id)
            try:
                sent.append((job, record, self._publisher(job.target).publish_async(record)))
            except Exception as exc:  # refused at once: this one and the rest are not sent
                refused = exc
                break
        unsent = [j for j in jobs if j.key in mine and j.key not in {s[0].key for s in sent}]
        done, failed = self._acknowledged(sent)
        failed += [(job, refused or RuntimeError("not sent")) for job in unsent]
        self.store.guarded("replay record", lambda: self._record(done, failed), stream=self.stream)
        if failed:
            job, error = failed[0]
            raise PublishError(
                f"{len(failed)} dead letters of {self.stream!r} were not replayed (first: "
                f"{job.id} to {job.target!r}: {error}); replay again to retry them",
                stream=job.target,
                cause=error,
            )
        return len(done)

    @staticmethod
    def _acknowledged(
        sent: list[tuple[Job, Record, Future[int]]],
    ) -> tuple[list[tuple[Job, int, int]], list[tuple[Job, BaseException]]]:
        """Wait for the broker's answers: ``(done, failed)``. A record with no answer in time
        is neither: its claim stays in doubt, for the next replay to settle."""
        done: list[tuple[Job, int, int]] = []
        failed: list[tuple[Job, BaseException]] = []
        for job, record, future in sent:
            try:
                offset = future.result(_ACK_TIMEOUT_S)
            except PublishError as exc:  # refused by the broker: the claim is dropped
                failed.append((job, exc))
            except TimeoutError:
                log.warning(
                    "%s: no acknowledgement in %.0f s, left in doubt", job.id, _ACK_TIMEOUT_S
                )
            else:
                done.append((job, record.partition or 0, offset))
        return done, failed

    def _claim(self, jobs: list[Job]) -> set[Key]:
        """Claim the unclaimed ``jobs`` for this run; return every key this run holds."""
        now = _now_ms()
        rows = [
            {
                "stream": self.stream,
                "topic_id": j.topic_id,
                "kafka_partition": j.place[0],
                "kafka_offset": j.place[1],
                "timestamp_ms": j.which.timestamp_ms,
                "target_stream": j.target,
                "owner": self.owner,
                "claimed_ms": now,
            }
            for j in jobs
        ]
        r = REPLAYS.c
        keys = [r.stream, r.topic_id, r.kafka_partition, r.kafka_offset, r.target_stream]
        with self.store.engine.begin() as conn:
            conn.execute(self.store.sql_dialect.insert_ignoring(REPLAYS, keys), rows)
            held = sa.select(r.topic_id, r.kafka_partition, r.kafka_offset, r.target_stream).where(
                r.stream == self.stream, r.owner == self.owner, r.target_offset.is_(None)
            )
            return {(str(i), int(p), int(o), str(t)) for i, p, o, t in conn.execute(held)}

    def _record(
        self, done: list[tuple[Job, int, int]], failed: list[tuple[Job, BaseException]]
    ) -> None:
        r = REPLAYS.c
        with self.store.engine.begin() as conn:
            for job, partition, offset in done:
                conn.execute(self._complete(job, self.owner), _done(partition, offset))
            for job, _ in failed:
                conn.execute(
                    sa.delete(REPLAYS).where(
                        *self._where(job), r.owner == self.owner, r.target_offset.is_(None)
                    )
                )

    def _where(self, job: Job) -> Iterable[sa.ColumnElement[bool]]:
        r = REPLAYS.c
        topic, partition, offset, target = job.key
        return (
            r.stream == self.stream,
            r.topic_id == topic,
            r.kafka_partition == partition,
            r.kafka_offset == offset,
            r.target_stream == target,
        )

    def _complete(self, job: Job, owner: str | None) -> sa.Update:
        r = REPLAYS.c
        mine = [r.owner == owner] if owner is not None else []
        return (
            sa.update(REPLAYS)
            .where(*self._where(job), *mine, r.target_offset.is_(None))
            .values(
                target_partition=sa.bindparam("p"),
                target_offset=sa.bindparam("o"),
                replayed_ms=sa.bindparam("at"),
            )
        )

    def _publisher(self, target: str) -> Publisher:
        publisher = self._publishers.get(target)
        if publisher is None:
            config = PublisherConfig(stream=StreamConfig(name=target))
            publisher = self._publishers[target] = Publisher(self.cluster, config)
        return publisher


def _done(partition: int, offset: int) -> dict[str, int]:
    return {"p": partition, "o": offset, "at": _now_ms()}
