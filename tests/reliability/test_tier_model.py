"""Model-based test of the parallel receiver with retry tiers (docs/retries.md).

Hypothesis drives a parallel receiver with ``Retry(attempts=1 or 2, tiers=[two short
tiers])`` and a dead-letter function on one two-partition stream with a few keys: every
handler call succeeds or fails as drawn per (record, call); rules publish more records, wait
until records are parked or everything is finished, close the receiver (at once, or waiting
for its calls) and attach another, and close and reopen the subscriber (a restart: its
partitions go back to the group). What the docs promise, checked after every step:

- key order: a record is never called while an earlier record of its key is unfinished
  (neither succeeded nor dead-lettered, at any time before): its key is parked behind it;
- the handler sees the original record (its key, no ``bolide.retry.*`` header);
- a record is dead-lettered only after a failed call before the tiers and one in each tier
  (``STRICT``, on unless ``BOLIDE_TIER_MODEL_STRICT=0``);
- the group's committed offsets never pass an unfinished record: every record below the
  source's committed offset (or in the finished set committed with it) is finished, or has a
  copy in a tier at or past that tier's committed offset and not in the finished set
  committed with it (a restart reads it again);
- after a restart, no record the group committed as finished (on the source, and every copy
  of it below its tier's committed offset or in its finished set) is called again;

and at the end, once every call succeeds and a last receiver ran to quiescence (the source
and the tiers confirmed to their ends, nothing parked): every record finished at least once,
nothing is lost, a restart then calls no record committed as finished, and a record called
again after it finished (at least once) was followed by every later record of its key that
had finished before that call ("a record that runs again is followed by every later record
of its key that had run"; ``STRICT``).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from bolide.facade import (
    InitialOffsetScheme,
    Publisher,
    PublisherConfig,
    Record,
    Retry,
    RetryTier,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.consumer.ledger import decode_finished
from bolide.facade.kafka import probe_consumer
from bolide.facade.receiver import Receiver
from bolide.facade.retry import ATTEMPTS_HEADER, ORIGIN_HEADER
from tests.conftest import eventually

pytestmark = [pytest.mark.kafka, pytest.mark.reliability, pytest.mark.slow]

LEASE_MS = 4_000
PARTITIONS = 2
KEYS = [b"k0", b"k1", b"k2"]  # k0 and k2 share partition 0, k1 has partition 1
TIERS = [RetryTier(delay_s=0.2), RetryTier(delay_s=0.4)]
WAIT_S = 120.0  # for states the receiver reaches on its own: generous, never a measure
SLOW_S = 0.3  # a slow call: long enough that a close at once abandons it now and then
#: Per record, what its calls do, from its first: succeed, fail, or succeed slowly; later
#: calls succeed.
CALLS = st.lists(st.sampled_from(["ok", "fail", "fail", "slow"]), max_size=5)
BATCH = st.lists(st.tuples(st.sampled_from(KEYS), CALLS), min_size=1, max_size=6)
#: Also check the promises that defects broke once each (docs/retries.md): that a record is
#: dead-lettered only after a failed call in each tier (seen: after two failures, before
#: ``Shelf.arrived`` ranked a record's copies by attempts, tests/parallel/test_tier_copy_rank.py),
#: and that a record run again is followed by its key's later records that had run (seen once,
#: before tier confirms carried their finished copies). ``BOLIDE_TIER_MODEL_STRICT=0`` leaves
#: them out.
STRICT = os.environ.get("BOLIDE_TIER_MODEL_STRICT", "1") != "0"

Place = tuple[int, int]  # (partition, offset) on the source stream
Point = tuple[int, set[int]]  # a committed offset and the finished set committed with it


class Bad(Exception):
    """What a handler raises on purpose; names its record."""

    def __init__(self, place: Place) -> None:
        super().__init__(f"record {place} fails this call")


class Truth:
    """What the handlers and the dead letter did, from any thread, and the checks made as
    they did it (a call is checked when it starts)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: dict[Place, tuple[bytes, list[str]]] = {}  # key, what its calls do
        self.by_key: dict[bytes, list[Place]] = {k: [] for k in KEYS}
        self.calls: Counter[Place] = Counter()
        self.failed: Counter[Place] = Counter()
        self.letters: Counter[Place] = Counter()
        self.finished: set[Place] = set()  # succeeded or dead-lettered, at least once
        self.log: list[tuple[int, Place, str]] = []  # (generation, record, "ok"/"fail"/"letter")
        self.healed = False  # from the end phase on, every call succeeds
        self.known: dict[int, set[Place]] = {0: set()}  # committed as finished at a restart
        self.broken: list[str] = []  # promises seen broken while handling
        self.tolerated: list[str] = []  # what the known defects break, unless STRICT

    def call(self, record: Record, generation: int) -> None:
        """One handler call: checked, logged, failed or not as drawn."""
        place = (record.partition or 0, record.offset or 0)
        with self.lock:
            key, calls = self.records[place]
            self._check_call(record, place, key, generation)
            n = self.calls[place]
            self.calls[place] += 1
            does = calls[n] if n < len(calls) and not self.healed else "ok"
            fail = does == "fail"
            self.log.append((generation, place, "fail" if fail else "ok"))
            if fail:
                self.failed[place] += 1
            else:
                self.finished.add(place)
        if does == "slow":
            time.sleep(SLOW_S)
        if fail:
            raise Bad(place)

    def _check_call(self, record: Record, place: Place, key: bytes, generation: int) -> None:
        waiting = [p for p in self.by_key[key] if p < place and p not in self.finished]
        if waiting:
            self.broken.append(f"{place} of {key!r} called while {waiting} were unfinished")
        if place in self.known[generation]:
            self.broken.append(f"{place} called after a restart that found it committed")
        if record.key != key or any(h.startswith("bolide.retry.") for h, _ in record.headers):
            self.broken.append(f"{place} called with {record.key!r}, {record.headers}")

    def letter(self, record: Record, error: BaseException) -> None:
        """The dead letter: the record gave up after the last tier."""
        place = (record.partition or 0, record.offset or 0)
        with self.lock:
            if self.failed[place] < 1 + len(TIERS):
                (self.broken if STRICT else self.tolerated).append(
                    f"{place} dead-lettered after {self.failed[place]} failures"
                )
            self.letters[place] += 1
            self.finished.add(place)
            self.log.append((-1, place, "letter"))

    def snapshot(self) -> tuple[set[Place], list[Place]]:
        """The finished records and every record published so far."""
        with self.lock:
            return set(self.finished), list(self.records)

    def unfinished(self) -> list[Place]:
        with self.lock:
            return sorted(p for p in self.records if p not in self.finished)

    def reruns_out_of_order(self) -> list[str]:
        """Calls of a finished record not followed by a call of every later record of its
        key that had finished before it."""
        out: list[str] = []
        done: set[Place] = set()
        with self.lock:
            log = list(self.log)
            key_of = {p: k for p, (k, _) in self.records.items()}
        for index, (_, place, what) in enumerate(log):
            if what != "letter" and place in done:
                later = {p for p in self.by_key[key_of[place]] if p > place and p in done}
                called = {p for _, p, w in log[index + 1 :] if w != "letter"}
                if later - called:
                    out.append(f"{place} ran again, {sorted(later - called)} not after it")
            if what != "fail":
                done.add(place)
        return out


class Kafka:
    """The group's committed offsets and the copies in the tiers, as Kafka holds them."""

    def __init__(self, cluster: Any, stream: str, group: str) -> None:
        self.stream = stream
        self.tiers = [t.stream_for(stream) for t in TIERS]
        self._probe = probe_consumer(cluster, **{"group.id": group})
        # The tiers' copies are written in transactions: an aborted one is not a copy.
        self._reader = probe_consumer(cluster, **{"isolation.level": "read_committed"})
        self._tps = [
            TopicPartition(t, p, OFFSET_BEGINNING) for t in self.tiers for p in range(PARTITIONS)
        ]
        self._assigned = False
        self.copies: dict[Place, list[tuple[int, int]]] = {}  # record -> (tier, tier offset)

    def committed(self) -> tuple[dict[int, Point], dict[tuple[int, int], Point]]:
        """Per source partition and per (tier, partition): the committed offset (0 when
        none) and the finished set committed with it."""
        tps = [TopicPartition(self.stream, p) for p in range(PARTITIONS)]
        tps += [TopicPartition(t, p) for t in self.tiers for p in range(PARTITIONS)]
        source: dict[int, Point] = {}
        tiers: dict[tuple[int, int], Point] = {}
        for tp in self._probe.committed(tps, timeout=30):
            assert tp.error is None, tp.error
            at = max(tp.offset, 0)
            point = (at, decode_finished(at, tp.metadata, where="model"))
            if tp.topic == self.stream:
                source[tp.partition] = point
            else:
                tiers[(self.tiers.index(tp.topic), tp.partition)] = point
        return source, tiers

    def read_copies(self) -> dict[Place, list[tuple[int, int]]]:
        """Every copy in the tiers up to their ends now, per record it is a copy of."""
        if not self._assigned:
            self._reader.assign(self._tps)
            self._assigned = True
        ends = {(tp.topic, tp.partition): self._end(tp) for tp in self._tps}
        ends = {k: end for k, end in ends.items() if end > 0}  # an empty one has no position

        def read() -> bool:
            for msg in self._reader.consume(500, timeout=0.2):
                if msg.error() is None:
                    self._arrived(msg)
            at = self._reader.position([TopicPartition(t, p) for t, p in ends])
            return all(tp.offset >= ends[(tp.topic, tp.partition)] for tp in at)

        if ends:
            eventually(read, WAIT_S, 0)
        return self.copies

    def ends(self) -> tuple[dict[int, int], dict[tuple[int, int], int]]:
        """The source's and the tiers' end offsets."""
        source = {p: self._end(TopicPartition(self.stream, p)) for p in range(PARTITIONS)}
        tiers = {(self.tiers.index(tp.topic), tp.partition): self._end(tp) for tp in self._tps}
        return source, tiers

    def _end(self, tp: TopicPartition) -> int:
        return int(self._reader.get_watermark_offsets(tp, timeout=30)[1])

    def _arrived(self, msg: Any) -> None:
        headers = dict(msg.headers() or [])
        stream, partition, offset = headers[ORIGIN_HEADER].decode().rsplit("/", 2)
        assert stream == self.stream and ATTEMPTS_HEADER in headers, headers
        tier = self.tiers.index(msg.topic())
        self.copies.setdefault((int(partition), int(offset)), []).append((tier, msg.offset()))

    def close(self) -> None:
        self._probe.close()
        self._reader.close()


class TierMachine(RuleBasedStateMachine):
    """One stream, one publisher, one subscriber of one group at a time, its receiver."""

    def __init__(self, cluster: Any, make_stream: Callable[..., StreamConfig]) -> None:
        super().__init__()
        self.cluster, self.make_stream = cluster, make_stream
        self.truth = Truth()
        self.pub: Publisher | None = None
        self.sub: Subscriber | None = None
        self.receiver: Receiver | None = None
        self.kafka: Kafka | None = None
        self.generation = 0  # one per subscriber opened
        self.reports: list[str] = []

    @initialize(
        attempts=st.sampled_from([1, 2]),
        ordering=st.sampled_from(["key", "partition"]),
        concurrency=st.sampled_from([1, 3]),
        batch=BATCH,
    )
    def start(self, attempts: int, ordering: str, concurrency: int, batch: list[Any]) -> None:
        self.retry = Retry(attempts=attempts, backoff_s=0, tiers=TIERS)
        self.ordering, self.concurrency = ordering, concurrency
        self.stream = self.make_stream(partitions=PARTITIONS, global_order=False)
        self.group = f"tm-{uuid.uuid4().hex[:10]}"
        self.pub = Publisher(self.cluster, PublisherConfig(stream=self.stream))
        self._open()  # creates the tier streams
        self.kafka = Kafka(self.cluster, self.stream.name, self.group)
        self.publish(batch)

    # -- the system under test -------------------------------------------------------------

    def _open(self) -> None:
        config = SubscriberConfig(
            stream=self.stream,
            group=self.group,
            lease_timeout_ms=LEASE_MS,
            initial_offset_scheme=InitialOffsetScheme.EARLIEST,
            error_handler=lambda summary, error: self.reports.append(f"{summary}: {error!r}"),
        )
        self.sub = Subscriber(self.cluster, config)
        self._attach()

    def _attach(self) -> None:
        assert self.sub is not None
        generation, truth = self.generation, self.truth
        self.receiver = self.sub.attach_receiver(
            lambda record: truth.call(record, generation),
            concurrency=self.concurrency,
            ordering=self.ordering,  # type: ignore[arg-type]  # drawn from the two orderings
            retry=self.retry,
            dead_letter=truth.letter,
        )

    def _close_receiver(self, at_once: bool) -> None:
        """Close the receiver: at once (what runs is abandoned) or waiting for its calls."""
        if self.receiver is not None:
            self.receiver.close(timeout_s=0 if at_once else WAIT_S)
            self.receiver = None

    # -- rules -------------------------------------------------------------------------------

    @rule(batch=BATCH)
    def publish(self, batch: list[tuple[bytes, list[str]]]) -> None:
        """Publish records of the drawn keys, each with the calls of it that fail. Handlers
        wait for the lock meanwhile, so none runs on a record the model does not know yet."""
        assert self.pub is not None
        truth = self.truth
        with truth.lock:
            futures = [
                self.pub.publish_async(Record(b"x", key=key, partition=_partition(key)))
                for key, _ in batch
            ]
            for (key, calls), future in zip(batch, futures, strict=True):
                place = (_partition(key), future.result(60))
                truth.records[place] = (key, calls)
                truth.by_key[key].append(place)
                truth.by_key[key].sort()

    @rule()
    def until_parked(self) -> None:
        """Let the receiver run until some record waits in a tier (or none is unfinished)."""
        receiver = self.receiver
        assert receiver is not None
        self._wait(lambda: receiver.metrics().parked > 0 or not self.truth.unfinished(), "parked")

    @rule()
    def until_finished(self) -> None:
        self._wait(lambda: not self.truth.unfinished(), "every record finished")

    @rule(at_once=st.booleans())
    def reattach(self, at_once: bool) -> None:
        """Close the receiver and attach another to the same subscriber."""
        self._close_receiver(at_once)
        self._attach()

    @rule(at_once=st.booleans())
    def restart(self, at_once: bool) -> None:
        """Close the receiver and the subscriber, open a new subscriber of the group."""
        self._close_receiver(at_once)
        assert self.sub is not None
        self.sub.close()
        self.sub = None
        self._note_committed()
        self._open()

    def _note_committed(self) -> None:
        """The records the group committed as finished: none of them may run again."""
        assert self.kafka is not None
        source, tiers = self.kafka.committed()
        finished, places = self.truth.snapshot()
        copies = self.kafka.read_copies()
        known = {
            place
            for place in places
            if _passed(place, source)
            and place in finished
            and not any(_read_again(at, tiers[(t, place[0])]) for t, at in copies.get(place, []))
        }
        with self.truth.lock:
            self.generation += 1
            self.truth.known[self.generation] = known

    # -- what must hold ----------------------------------------------------------------------

    @invariant()
    def promises_kept_while_handling(self) -> None:
        with self.truth.lock:
            broken = list(self.truth.broken)
        assert not broken, broken

    @invariant()
    def commits_never_pass_unfinished_records(self) -> None:
        if self.kafka is None:
            return
        source, tiers = self.kafka.committed()  # first: what happens after it only widens
        finished, places = self.truth.snapshot()
        copies = self.kafka.read_copies()
        lost = [
            (place, copies.get(place, []))
            for place in places
            if _passed(place, source)
            and place not in finished
            and not any(_read_again(at, tiers[(t, place[0])]) for t, at in copies.get(place, []))
        ]
        assert not lost, f"committed {source} {tiers} pass unfinished records {lost}"

    def teardown(self) -> None:
        try:
            if self.kafka is None:
                return
            with self.truth.lock:
                self.truth.healed = True
            if self.receiver is None:
                self._attach()
            self._quiesce()
            self.restart(at_once=False)
            self.publish([(key, []) for key in KEYS])  # read past everything committed
            self._quiesce()
            self.promises_kept_while_handling()
            assert not self.truth.unfinished()
            out_of_order = self.truth.reruns_out_of_order()
            assert not (STRICT and out_of_order), out_of_order
        finally:
            self._close_receiver(at_once=True)
            for client in (self.sub, self.pub, self.kafka):
                if client is not None:
                    client.close()

    def _quiesce(self) -> None:
        """Wait until every record finished, nothing is parked and the source and the tiers
        are confirmed to their ends."""
        self._wait(lambda: not self.truth.unfinished(), "every record finished")
        self._wait(self._quiet, "the source and the tiers confirmed to their ends")

    def _quiet(self) -> bool:
        assert self.kafka is not None and self.receiver is not None
        source, tiers = self.kafka.committed()
        ends, tier_ends = self.kafka.ends()
        at = {p: s[0] for p, s in source.items()}
        confirmed = at == ends and {k: s[0] for k, s in tiers.items()} == tier_ends
        return confirmed and self.receiver.metrics().parked == 0

    def _wait(self, check: Callable[[], bool], what: str) -> None:
        try:
            eventually(check, WAIT_S)
        except AssertionError:
            assert self.kafka is not None
            state = {
                "unfinished": self.truth.unfinished(),
                "committed": self.kafka.committed(),
                "ends": self.kafka.ends(),
                "metrics": self.receiver and self.receiver.metrics(),
                "reports": self.reports[-5:],
            }
            raise AssertionError(f"{what}: not reached in {WAIT_S} s; {state}") from None


def _partition(key: bytes) -> int:
    return KEYS.index(key) % PARTITIONS


def _passed(place: Place, source: dict[int, Point]) -> bool:
    """Whether the source's committed offset (or its finished set) passes ``place``."""
    at, finished = source[place[0]]
    return place[1] < at or place[1] in finished


def _read_again(offset: int, tier: Point) -> bool:
    """Whether a restart reads the copy at ``offset`` of a tier partition committed at
    ``tier``: at or past its committed offset, and not in the finished set."""
    at, finished = tier
    return offset >= at and offset not in finished


MODEL = settings(
    max_examples=6,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.mark.timeout(900)
def test_the_parallel_receiver_with_retry_tiers_against_the_model(cluster, stream_factory):
    run_state_machine_as_test(lambda: TierMachine(cluster, stream_factory), settings=MODEL)
