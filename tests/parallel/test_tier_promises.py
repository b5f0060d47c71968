"""What a parallel receiver's retry tiers promise at their edges: a tier call running when its
partition is revoked gracefully is waited for (up to half the lease, as the workers' calls
are) and confirmed while the partition is still owned, so the next owner neither runs the
record again nor the key's later records before that call ended; and a copy the broker
refuses for good (no ``WRITE`` on the tier stream) is reported once and stops the receiver,
the source not confirmed past the record, instead of "trying again" every few seconds."""

from __future__ import annotations

import threading
import uuid
from collections import Counter

import pytest
from confluent_kafka.admin import AclOperation, ResourceType

from bolide.facade import (
    AuthorizationError,
    EmbeddedBroker,
    Publisher,
    PublisherConfig,
    Record,
    Retry,
    RetryTier,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.receiver import RecordHandler
from tests.conftest import eventually
from tests.parallel.conftest import fresh_group
from tests.parallel.test_retry_tiers import committed, grouped, high_watermark
from tests.security.conftest import (
    LEASE_MS,
    UserFactory,
    needs_kafka,
    new_stream,
    secured,  # noqa: F401  (the secured broker, for the refused copy)
    user_factory,  # noqa: F401
)

pytestmark = [pytest.mark.kafka]

#: The first member's lease: a graceful revoke waits up to half of it (10 s) for running calls.
REVOKE_LEASE_MS = 20_000
#: Longest wait of the first member's tier call: well within the revoke's wait. It ends
#: sooner when the next owner reaches the key's last record meanwhile (the defect), so the
#: log shows every call the next owner made while it ran.
CALL_S = 8.0


class Calls:
    """Both members' handler calls, in one log of starts and ends: ``(member, what, offset,
    call)``, ``call`` counting the calls of that offset across members. Record 0's first
    call fails (in the first member's worker: it goes to the tier); its second (the tier's)
    waits until member B starts a call of record 2 (the key's last), or ``CALL_S``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.log: list[tuple[str, str, int, int]] = []
        self.calls: Counter[int] = Counter()
        self.tier_call = threading.Event()  # record 0's tier call runs
        self.b_at_last = threading.Event()  # B started a call of the key's last record

    def handler(self, member: str) -> RecordHandler:
        def handle(record: Record) -> None:
            offset = record.offset or 0
            with self.lock:
                self.calls[offset] += 1
                call = self.calls[offset]
                self.log.append((member, "start", offset, call))
            if member == "B" and offset == 2:
                self.b_at_last.set()
            try:
                if offset == 0 and call == 1:
                    raise RuntimeError("the first call fails")
                if offset == 0 and call == 2:
                    self.tier_call.set()
                    self.b_at_last.wait(CALL_S)
            finally:
                with self.lock:
                    self.log.append((member, "end", offset, call))

        return handle

    def mark(self, what: str) -> None:
        with self.lock:
            self.log.append(("test", what, -1, 0))

    def entries(self) -> list[tuple[str, str, int, int]]:
        with self.lock:
            return list(self.log)

    def ended(self, member: str) -> set[int]:
        return {o for m, what, o, _ in self.entries() if m == member and what == "end"}


def test_a_tier_call_running_at_a_graceful_revoke_is_waited_for(cluster, stream_factory):
    """Key k's record 0 fails in member A's worker and goes to the tier; 1 and 2 are parked
    behind it (their copies in the tier too). While A's tier call of 0 runs, A gives the
    partition up (``deactivate``: a revoke while it is still owned) and B takes it over. The
    revoke waits for the call and confirms it: B runs neither 0 again nor 1 and 2 before A's
    call of 0 ended."""
    stream = stream_factory()
    tier = f"{stream.name}.tier"
    group = fresh_group()
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(3):
            pub.publish_async(Record(b"%d" % i, key=b"k"))
        assert pub.flush(60) == 0
    retry = Retry(attempts=1, backoff_s=0, tiers=[RetryTier(delay_s=0.2, stream=tier)])
    calls = Calls()
    config = SubscriberConfig(stream=stream, group=group, lease_timeout_ms=REVOKE_LEASE_MS)
    a, b = Subscriber(cluster, config), None
    try:
        a.attach_receiver(calls.handler("A"), concurrency=2, retry=retry)
        eventually(calls.tier_call.is_set, 120)  # A's tier call of 0 runs
        # 1 and 2 are parked behind 0: their copies follow its copy in the tier.
        eventually(lambda: high_watermark(cluster, tier, 0) >= 3, 60)
        a.deactivate()  # revokes the partition while A still owns it
        calls.mark("revoked")
        at_revoke = committed(cluster, group, tier)
        b = grouped(cluster, stream, group)
        b.attach_receiver(calls.handler("B"), concurrency=2, retry=retry)
        eventually(lambda: {1, 2} <= calls.ended("B"), 120)
        eventually(lambda: ("A", "end", 0, 2) in calls.entries(), 60)
    finally:
        if b is not None:
            b.close()
        a.close()
    log = calls.entries()
    a_ended = log.index(("A", "end", 0, 2))
    b_starts = [(i, o) for i, (m, what, o, _) in enumerate(log) if (m, what) == ("B", "start")]
    early = [offset for i, offset in b_starts if i < a_ended]
    assert 0 not in early, f"B ran record 0 again while A's call of it still ran: {log}"
    assert not early, f"B ran k's records {early} while A's call of 0 still ran: {log}"
    assert log.index(("test", "revoked", -1, 0)) > a_ended, (
        f"the revoke returned while A's tier call of 0 still ran: {log}"
    )
    assert at_revoke[0] >= 1, f"A's finished call of 0 was not confirmed at the revoke: {at_revoke}"


@needs_kafka
def test_retry_tiers_without_their_transactional_id_acl_are_refused_at_attach(
    secured: EmbeddedBroker,  # noqa: F811
    user_factory: UserFactory,  # noqa: F811
) -> None:
    """The tiers write in Kafka transactions: a user without WRITE on their transactional id
    learns it from ``attach_receiver``, with the ACL to grant, before anything is read."""
    name = f"orders-tier-no-txn-{uuid.uuid4().hex[:8]}"
    stream = new_stream(secured, name)
    tier = new_stream(secured, f"{name}.tier")
    group = f"tier-no-txn-{uuid.uuid4().hex[:8]}"
    user = user_factory(
        [
            (ResourceType.TOPIC, stream.name, AclOperation.READ),
            (ResourceType.GROUP, group, AclOperation.READ),
            (ResourceType.TOPIC, tier.name, AclOperation.READ),
            (ResourceType.TOPIC, tier.name, AclOperation.WRITE),
        ]
    )
    config = SubscriberConfig(stream=stream, group=group, lease_timeout_ms=LEASE_MS)
    retry = Retry(
        attempts=1,
        tiers=[RetryTier(delay_s=0.2, stream=tier.name)],
        transactional_id=f"{group}.tiers-txn",
    )
    with Subscriber(user, config) as sub:
        with pytest.raises(AuthorizationError, match="transactional id") as caught:
            sub.attach_receiver(lambda record: None, concurrency=2, retry=retry)
        assert caught.value.resource == f"{group}.tiers-txn"


@needs_kafka
def test_a_tier_copy_the_broker_refuses_is_reported_once_and_stops_the_receiver(
    secured: EmbeddedBroker,  # noqa: F811
    user_factory: UserFactory,  # noqa: F811
) -> None:
    """A user may read the source and the tier stream, and use the tiers' transactional id,
    but not write to the tier: record 1 fails in the worker and its copy is refused. That
    answer comes back the same on every try: it is reported once and the receiver stops, the
    source not confirmed past 1."""
    name = f"orders-tier-refused-{uuid.uuid4().hex[:8]}"
    stream = new_stream(secured, name)
    tier = new_stream(secured, f"{name}.tier")  # made by the super user: the user cannot
    group = f"tier-refused-{uuid.uuid4().hex[:8]}"
    transactional_id = f"{group}.tiers-txn"
    user = user_factory(
        [
            (ResourceType.TOPIC, stream.name, AclOperation.READ),
            (ResourceType.GROUP, group, AclOperation.READ),
            (ResourceType.TOPIC, tier.name, AclOperation.READ),  # READ only, no WRITE
            # The tiers' own reader (assigned by hand) looks up its group's coordinator.
            (ResourceType.GROUP, f"{group}.tiers", AclOperation.READ),
            (ResourceType.TRANSACTIONAL_ID, transactional_id, AclOperation.WRITE),
            (ResourceType.TRANSACTIONAL_ID, transactional_id, AclOperation.DESCRIBE),
        ]
    )
    with Publisher(secured.cluster(), PublisherConfig(stream=stream)) as pub:
        for i in range(3):
            pub.publish_async(Record(b"%d" % i, key=b"k%d" % i))
        assert pub.flush(60) == 0
    failing = 1
    lock = threading.Lock()
    handled: set[int] = set()
    reports: list[tuple[str, BaseException | None]] = []

    def handler(record: Record) -> None:
        if record.offset == failing:
            raise RuntimeError("fails")
        with lock:
            handled.add(record.offset or 0)

    def report(summary: str, error: BaseException | None) -> None:
        with lock:
            reports.append((summary, error))

    def refusals() -> list[str]:
        with lock:
            return [s for s, e in reports if isinstance(e, AuthorizationError)]

    config = SubscriberConfig(
        stream=stream, group=group, lease_timeout_ms=LEASE_MS, error_handler=report
    )
    retry = Retry(
        attempts=1,
        backoff_s=0,
        tiers=[RetryTier(delay_s=0.2, stream=tier.name)],
        transactional_id=transactional_id,
    )
    with Subscriber(user, config) as sub:
        receiver = sub.attach_receiver(handler, concurrency=2, retry=retry)
        eventually(lambda: handled == {0, 2}, 120)
        eventually(refusals, 120)
        # Stopped after one report, or (the defect) reported again a few seconds later.
        eventually(lambda: len(refusals()) >= 2 or not receiver.running, 120)
        assert len(refusals()) == 1, f"the refused copy was reported again: {refusals()}"
        assert not receiver.running, "the receiver goes on after a refusal for good"
    position = committed(secured.cluster(), group, stream.name)[0]
    assert position <= failing, f"the source was confirmed past the refused record: {position}"
