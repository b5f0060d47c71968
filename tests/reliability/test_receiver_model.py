"""Model-based test of the parallel receiver: random handler outcomes, closes and restarts.

Hypothesis drives a parallel receiver on one stream: each record's handler succeeds, raises,
or blocks until released (so that a close past its deadline abandons it); receivers are
closed (at once, or after releasing what blocks) and attached again, the subscriber gives its
partition up and seeks it again (a revocation), and the subscriber is closed and opened again
(a restart: its partitions go back to the group). Positions are kept
either in the group's committed offsets (the receiver confirms by itself) or in SQL
(``SqlPositions``: each handler writes its row and confirms its own record in one
transaction). Checked after every step, for the partition:

- the committed position never passes a record that is not finished (handled, or failed and
  reported): position <= lowest unfinished offset;
- the stored position never moves back;
- with SQL: every record whose row is committed is below the stored position or in the
  finished set stored with it (the row and the confirm commit together);
- after a restart, no record the store holds as finished (below the position, or in the
  finished set above it) is handed to a handler again;

and at the end, once everything is released and a last receiver has run: every record was
finished at least once (nothing lost) and the position reaches the end.

A second machine drives partial revokes under an incremental protocol (cooperative-sticky or
KIP-848): a member that loses some partitions keeps confirming those it holds, whether a
parallel receiver or an ``async for`` loop drives it.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import TopicPartition
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from bolide.facade import (
    InitialOffsetScheme,
    Publisher,
    PublisherConfig,
    Record,
    Retry,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.consumer.ledger import decode_finished
from bolide.facade.kafka import probe_consumer
from bolide.facade.receiver import Receiver
from bolide.stores import SqlPositions, SqlStore
from bolide.stores.schema import POSITIONS
from tests.conftest import DATABASES, eventually, upgraded_db_url
from tests.pubsub.test_partial_revoke import Member

pytestmark = [pytest.mark.kafka, pytest.mark.reliability, pytest.mark.slow]

LEASE_MS = 4_000
RECORDS = 24
OUTCOMES = ["ok", "ok", "ok", "raise", "slow"]


class Bad(Exception):
    """What a handler raises on purpose; names its record."""

    def __init__(self, offset: int) -> None:
        super().__init__(f"record {offset} is bad")
        self.offset = offset


class ReceiverMachine(RuleBasedStateMachine):
    """One stream of ``RECORDS`` records, one subscriber at a time, its receivers, the model."""

    def __init__(self, cluster: Any, make_stream: Any, store: SqlStore | None) -> None:
        super().__init__()
        self.cluster, self.make_stream, self.store = cluster, make_stream, store
        self.sub: Subscriber | None = None
        self.receiver: Receiver | None = None
        self.lock = threading.Lock()
        self.finished: set[int] = set()  # handled, or failed and reported
        self.gates: list[threading.Event] = []  # one per receiver: slow handlers wait on it
        self.outcome: dict[int, str] = {}
        self.high = 0  # the highest stored position seen
        self.generation = 0  # one per subscriber opened
        self.known: dict[int, set[int]] = {0: set()}  # finished in store when it opened
        self.rehandled: list[tuple[int, int]] = []  # (generation, offset) handed again

    @initialize(
        outcomes=st.lists(st.sampled_from(OUTCOMES), min_size=RECORDS, max_size=RECORDS),
        concurrency=st.sampled_from([1, 4]),
        ordering=st.sampled_from(["key", "partition", "unordered"]),
    )
    def start(self, outcomes: list[str], concurrency: int, ordering: str) -> None:
        self.outcome = dict(enumerate(outcomes))
        self.concurrency, self.ordering = concurrency, ordering
        self.stream = self.make_stream()
        with Publisher(self.cluster, PublisherConfig(stream=self.stream)) as pub:
            for i in range(RECORDS):
                pub.publish_async(Record(b"%d" % i, key=b"k%d" % (i % 3)))
            assert pub.flush(60) == 0
        self.group = f"rm-{uuid.uuid4().hex[:10]}"
        self.positions: SqlPositions | None = None
        if self.store is not None:
            self.positions = SqlPositions(self.store)
            self.table = sa.Table(
                f"rows_{uuid.uuid4().hex[:8]}", sa.MetaData(), sa.Column("off", sa.BigInteger)
            )
            self.table.create(self.store.engine)
        self._open()

    # -- the system under test -------------------------------------------------------------

    def _open(self) -> None:
        config = SubscriberConfig(
            stream=self.stream,
            group=self.group,
            lease_timeout_ms=LEASE_MS,
            initial_offset_scheme=InitialOffsetScheme.EARLIEST,
            positions=self.positions,
            error_handler=self._reported,
        )
        self.sub = Subscriber(self.cluster, config)

    def _reported(self, summary: str, error: BaseException | None) -> None:
        if isinstance(error, Bad):
            with self.lock:
                self.finished.add(error.offset)

    def _handler(self, sub: Subscriber, gate: threading.Event) -> Any:
        store = self.store

        def handle(record: Record) -> None:
            offset = record.offset
            assert offset is not None
            with self.lock:
                if offset in self.known[self.generation]:
                    self.rehandled.append((self.generation, offset))
            outcome = self.outcome[offset]
            if outcome == "raise":
                raise Bad(offset)
            if outcome == "slow":
                gate.wait(120)
            if store is not None:
                with store.engine.begin() as conn:
                    conn.execute(self.table.insert().values(off=offset))
                    sub.confirm(offset, partition=record.partition, conn=conn)
            with self.lock:
                self.finished.add(offset)

        return handle

    # -- rules -------------------------------------------------------------------------------

    @precondition(lambda self: self.receiver is None)
    @rule()
    def attach(self) -> None:
        assert self.sub is not None
        gate = threading.Event()
        self.gates.append(gate)
        self.receiver = self.sub.attach_receiver(
            self._handler(self.sub, gate),
            concurrency=self.concurrency,
            ordering=self.ordering,
            retry=Retry(attempts=1),
        )

    @precondition(lambda self: self.receiver is not None)
    @rule()
    def release_and_finish(self) -> None:
        """Release what blocks and wait until every record is finished."""
        for gate in self.gates:
            gate.set()
        eventually(lambda: self._finished() == set(range(RECORDS)), 120)

    @precondition(lambda self: self.receiver is not None)
    @rule()
    def close_at_once(self) -> None:
        """Close past the deadline: what still runs (slow records) is abandoned."""
        receiver = self.receiver
        assert receiver is not None
        # Once it has work in hand (or nothing is left to do), so that a close abandons some.
        eventually(
            lambda: receiver.metrics().in_flight > 0 or self._finished() == set(range(RECORDS)),
            120,
        )
        receiver.close(timeout_s=0)
        self.receiver = None

    @precondition(lambda self: self.receiver is not None)
    @rule()
    def release_and_close(self) -> None:
        assert self.receiver is not None
        for gate in self.gates:
            gate.set()
        self.receiver.close()
        self.receiver = None

    @rule()
    def restart(self) -> None:
        """Close everything at once and open a new subscriber of the same group."""
        if self.receiver is not None:
            self.receiver.close(timeout_s=0)
            self.receiver = None
        assert self.sub is not None
        self.sub.close()
        self._handed_over()
        self._open()

    @precondition(lambda self: self.sub is not None)
    @rule()
    def revoke_and_regain(self) -> None:
        """Give the partition up (as a rebalance takes it away) and seek it again."""
        assert self.sub is not None
        self.sub.deactivate()
        self._handed_over()
        self.sub.reactivate()

    def _handed_over(self) -> None:
        """The partition changed hands: what the store holds as finished must not run again."""
        position, finished = self._stored()
        with self.lock:
            self.generation += 1
            self.known[self.generation] = set(range(position)) | finished

    # -- what must hold ----------------------------------------------------------------------

    def _finished(self) -> set[int]:
        with self.lock:
            return set(self.finished)

    def _stored(self) -> tuple[int, set[int]]:
        """The stored position of the partition and the finished set stored above it."""
        if self.store is not None:
            c = POSITIONS.c
            query = sa.select(c.next_offset, c.finished).where(
                c.group_id == self.group, c.stream == self.stream.name, c.kafka_partition == 0
            )
            with self.store.engine.connect() as conn:
                row = conn.execute(query).one_or_none()
            position, text = (-1, None) if row is None else (int(row[0]), row[1])
        else:
            probe = probe_consumer(self.cluster, **{"group.id": self.group})
            try:
                (tp,) = probe.committed([TopicPartition(self.stream.name, 0)], timeout=30)
            finally:
                probe.close()
            position, text = tp.offset, tp.metadata
        if position < 0:
            return 0, set()
        return position, decode_finished(position, text, where="model")

    def _rows(self) -> set[int]:
        assert self.store is not None
        with self.store.engine.connect() as conn:
            return {int(o) for (o,) in conn.execute(sa.select(self.table.c.off))}

    def _position(self) -> int:
        if self.positions is not None:
            return self.positions.positions(self.group, self.stream.name).get(0, 0)
        assert self.sub is not None
        return self.sub.committed().get(0) or 0

    @invariant()
    def never_past_unfinished_work(self) -> None:
        if self.sub is None:
            return
        position = self._position()  # first: what finishes after it only widens the check
        finished = self._finished()
        lowest = min((o for o in range(RECORDS) if o not in finished), default=RECORDS)
        assert position <= lowest, (
            f"the position {position} passes record {lowest}, which is not finished"
        )

    @invariant()
    def never_moves_back(self) -> None:
        if self.sub is None:
            return
        position = self._stored()[0]
        assert position >= self.high, f"the position moved back from {self.high} to {position}"
        self.high = position

    @invariant()
    def committed_rows_are_finished_in_the_store(self) -> None:
        if self.sub is None or self.store is None:
            return
        rows = self._rows()  # first: the store read next is at least as new
        position, finished = self._stored()
        lost = sorted(o for o in rows if o >= position and o not in finished)
        assert not lost, f"rows {lost} committed, but neither below {position} nor in {finished}"

    @invariant()
    def nothing_finished_is_handed_again(self) -> None:
        with self.lock:
            assert not self.rehandled, f"finished records handed again: {self.rehandled}"

    def teardown(self) -> None:
        try:
            for gate in self.gates:
                gate.set()
            if self.sub is None:
                return
            if self.receiver is None:
                self.attach()
                self.gates[-1].set()  # its slow records too
            eventually(lambda: self._finished() == set(range(RECORDS)), 120)
            assert self.receiver is not None
            self.receiver.close()
            self.receiver = None
            if self.store is not None:  # the tail: everything is finished now
                with self.store.engine.begin() as conn:
                    self.sub.confirm(conn=conn)
            eventually(lambda: self._position() == RECORDS, 60)
        finally:
            for gate in self.gates:
                gate.set()
            if self.receiver is not None:
                self.receiver.close(timeout_s=0)
            if self.sub is not None:
                self.sub.close()


MODEL = settings(
    max_examples=6,
    stateful_step_count=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def test_the_receiver_on_kafka_offsets_against_the_model(cluster, stream_factory):
    run_state_machine_as_test(
        lambda: ReceiverMachine(cluster, stream_factory, None), settings=MODEL
    )


@pytest.mark.parametrize("database", DATABASES)
def test_the_receiver_on_sql_positions_against_the_model(
    cluster, stream_factory, database, tmp_path, request
):
    with SqlStore(upgraded_db_url(database, tmp_path, request)) as store:
        run_state_machine_as_test(
            lambda: ReceiverMachine(cluster, stream_factory, store), settings=MODEL
        )


class PartialRevokeMachine(RuleBasedStateMachine):
    """Partial revokes under an incremental protocol: member A (a parallel receiver, or an
    ``async for`` loop) holds a stream's four partitions; a second member joins and takes some
    of them, then leaves and gives them back, while records keep coming. Checked after every
    step: neither member's confirm was refused but for records read on a partition revoked
    from it since, and (with SQL) no stored position moves back or passes a committed row;
    at the end, every record was handled (with SQL: its row written exactly once) and every
    position reaches the end."""

    def __init__(self, cluster: Any, make_stream: Any, store: SqlStore | None) -> None:
        super().__init__()
        self.cluster, self.make_stream, self.store = cluster, make_stream, store
        self.members: list[Member] = []
        self.published: set[tuple[int, int]] = set()
        self.high: dict[int, int] = {}

    @initialize(
        protocol=st.sampled_from(["cooperative", "consumer"]),
        driver=st.sampled_from(["receiver", "async"]),
    )
    def start(self, protocol: str, driver: str) -> None:
        self.protocol = protocol
        self.stream = self.make_stream(partitions=PARTIAL_PARTITIONS, global_order=False)
        self.group = f"pr-{uuid.uuid4().hex[:10]}"
        self.table: sa.Table | None = None
        if self.store is not None:
            self.table = sa.Table(
                f"effects_{uuid.uuid4().hex[:8]}",
                sa.MetaData(),
                sa.Column("part", sa.Integer),
                sa.Column("off", sa.BigInteger),
            )
            self.table.create(self.store.engine)
        self.publish(2)
        self.a = self._member(driver)
        eventually(lambda: self._handled() >= self.published, 120)

    def _member(self, driver: str) -> Member:
        member = Member(
            self.cluster,
            self.stream,
            self.group,
            self.protocol,
            store=self.store,
            table=self.table,
            driver=driver,
        )
        self.members.append(member)
        return member

    def _handled(self) -> set[tuple[int, int]]:
        return {r for m in self.members for r in list(m.handled)}

    def _live(self) -> list[Member]:
        return [m for m in self.members if not m.stopped]

    def _settled(self) -> bool:
        held = [m.holding() for m in self._live()]
        every = sorted(p for h in held for p in h) == list(range(PARTIAL_PARTITIONS))
        return all(held) and every

    @rule(per_partition=st.integers(1, 3))
    def publish(self, per_partition: int) -> None:
        with Publisher(self.cluster, PublisherConfig(stream=self.stream)) as pub:
            for i in range(per_partition):
                for p in range(PARTIAL_PARTITIONS):
                    self.published.add((p, pub.publish(Record(b"%d" % i, partition=p))))

    @precondition(lambda self: len(self._live()) == 1)
    @rule()
    def join(self) -> None:
        """A second member joins: A gives some partitions up and keeps the others."""
        self._member("sync")
        eventually(self._settled, 120)

    @precondition(lambda self: len(self._live()) == 2)
    @rule()
    def leave(self) -> None:
        """The second member leaves: A takes its partitions back."""
        self._live()[-1].stop()
        eventually(self._settled, 120)

    @invariant()
    def refused_only_for_revoked_partitions(self) -> None:
        wrong = [e for m in self.members for e in m.refusals_of_held()]
        assert not wrong, wrong

    @invariant()
    def positions_never_move_back_nor_pass_a_row(self) -> None:
        if self.store is None or self.table is None or not self.members:
            return
        with self.store.engine.connect() as conn:  # the rows first: the positions are newer
            rows = conn.execute(sa.select(self.table.c.part, self.table.c.off)).all()
        c = POSITIONS.c
        query = sa.select(c.kafka_partition, c.next_offset, c.finished).where(
            c.group_id == self.group, c.stream == self.stream.name
        )
        with self.store.engine.connect() as conn:
            stored = {int(p): (int(o), text) for p, o, text in conn.execute(query)}
        for p, (position, text) in stored.items():
            assert position >= self.high.get(p, 0), (p, self.high.get(p), position)
            self.high[p] = position
            finished = decode_finished(position, text, where="model")
            lost = sorted(o for q, o in rows if q == p and o >= position and o not in finished)
            assert not lost, f"rows {lost} of {p} committed above {position}"

    def teardown(self) -> None:
        try:
            if not self.members:
                return
            eventually(lambda: self._handled() >= self.published, 120)
            if self.store is not None and self.table is not None:
                with self.store.engine.connect() as conn:
                    rows = conn.execute(sa.select(self.table.c.part, self.table.c.off)).all()
                counts = Counter((int(p), int(o)) for p, o in rows)
                assert set(counts) == self.published
                assert max(counts.values()) == 1, [r for r, n in counts.items() if n > 1]
                ends = SqlPositions(self.store).positions
            else:
                ends = lambda group, stream: committed_positions(self.cluster, group, stream)  # noqa: E731
            last = {p: o + 1 for p, o in sorted(self.published)}
            eventually(lambda: ends(self.group, self.stream.name) == last, 60)
        finally:
            for member in self.members:
                member.stop()


#: The partial revoke model's stream.
PARTIAL_PARTITIONS = 4


def committed_positions(cluster: Any, group: str, stream: str) -> dict[int, int]:
    """The group's committed offsets of ``stream``'s partitions."""
    probe = probe_consumer(cluster, **{"group.id": group})
    try:
        found = probe.committed(
            [TopicPartition(stream, p) for p in range(PARTIAL_PARTITIONS)], timeout=30
        )
    finally:
        probe.close()
    return {tp.partition: tp.offset for tp in found if tp.offset >= 0}


PARTIAL = settings(
    max_examples=3,
    stateful_step_count=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def test_partial_revokes_on_kafka_offsets_against_the_model(cluster, stream_factory):
    run_state_machine_as_test(
        lambda: PartialRevokeMachine(cluster, stream_factory, None), settings=PARTIAL
    )


@pytest.mark.postgres
def test_partial_revokes_on_sql_positions_against_the_model(
    cluster, stream_factory, tmp_path, request
):
    with SqlStore(upgraded_db_url("postgresql", tmp_path, request)) as store:
        run_state_machine_as_test(
            lambda: PartialRevokeMachine(cluster, stream_factory, store), settings=PARTIAL
        )
