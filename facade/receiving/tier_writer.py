"""``TierWriter``: a receiver's writes to its retry tiers (and its dead-letter stream), each
round one Kafka transaction with the tiers' positions, sent with the group's metadata.

Kafka fences the writes this way (KIP-447): the transaction's offsets carry the member's
group generation, and a member whose generation is over (it lost its partitions and has not
heard yet) has them refused, so the transaction aborts and ``read_committed`` readers never
see its copies; its positions do not move. No question to the group about who owns what is
needed. A round commits every write queued since the last one, so a copy counts as written
(its record finished on the source, or moved on in the tiers) only once Kafka committed it.

A write refused for good (an ACL missing, the credentials refused, another running receiver
with the transactional id) is reported once and stops the receiver: retrying cannot help,
and the records behind it must not be confirmed past. A producer fenced by the coordinator
(a member paused past the transaction timeout), a commit whose outcome stayed unknown or a
fatal producer error builds the producer again, which finishes or aborts what the last one
left open. A refused generation holds the tiers' copies (``Fence``) and is tried again, as
is any retriable failure.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from bolide.facade.config import Cluster
from bolide.facade.errors import (
    AuthenticationError,
    AuthorizationError,
    ProducerFencedError,
    TransactionError,
    TransactionInDoubtError,
)
from bolide.facade.kafka import PRODUCER_DEFAULTS, new_client
from bolide.facade.producer.transactions import Transactions
from bolide.facade.receiving.fence import Fence
from bolide.facade.record import Record

__all__ = ["GROUP_REFUSALS", "Done", "Offsets", "TierWriter", "Write"]

log = logging.getLogger("bolide.facade.parallel")

#: ``done(error)``: the write committed (``None``), or was given up (the receiver stops).
Done = Callable[[BaseException | None], None]

#: ``fn(partitions written, proof)``: the offsets to send with a round and what to call once
#: it commits; ``proof`` asks for offsets even when none moved (the fence needs one).
Offsets = Callable[[set[int], bool], tuple[list[TopicPartition], Callable[[], None]]]

#: Answers to a transaction's offsets that say the member's generation is over (or moving).
GROUP_REFUSALS = frozenset(
    {
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.FENCED_INSTANCE_ID,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.STALE_MEMBER_EPOCH,
        KafkaError.FENCED_MEMBER_EPOCH,
    }
)
_BACKOFF_S = (0.1, 1.0)  # after a failed round: the first wait, the longest
_ROUND_MAX = 1_000  # writes in one transaction, at most (the producer's queue holds them)
_CONFIRM_S = 0.1  # a round of confirms alone starts no sooner than this after the last one
_RENEWALS, _RENEWAL_WINDOW_S = 5, 60.0  # producers built again within the window, at most


class _Unwritable(TransactionError):
    """A write the producer refuses by itself, whatever the broker says."""


class _Stuck(TransactionError):
    """The producer cannot begin a transaction (the abort of the last one timed out and
    librdkafka still runs it): a new producer with the id takes over."""

    retriable = True


@dataclass(slots=True, eq=False)
class Write:
    """One record to write: ``copy`` to ``topic``, on behalf of source ``partition``."""

    partition: int
    topic: str
    copy: Record
    done: Done


class TierWriter:
    """The transactional writes of one receiver's tiers; one thread runs the rounds.

    Args:
        cluster: Where the tiers live.
        transactional_id: The producer's ``transactional.id`` (one per receiver).
        group_metadata: The subscriber's consumer's group metadata, read as each round starts.
        offsets: What each round confirms (the tiers' positions).
        fence: Held by a refused generation, let go by a committed round.
        held: The source partitions whose tiers are read now (all of them wait when the
            group refuses).
        alive: Whether a source partition's writes may still go out (it is held and its
            tiers read): a revoked one's are dropped at the next round.
        report: The subscriber's error handler.
        halt: ``fn(summary, error)``: report a refusal for good and stop the receiver.
        timeout_s: How long one transactional call may take; the transaction timeout is
            twice that (a paused member's open transaction is aborted after it).
        streams: The streams written, for messages (an ACL refused names them).
    """

    def __init__(
        self,
        cluster: Cluster,
        transactional_id: str,
        *,
        group_metadata: Callable[[], Any],
        offsets: Offsets,
        fence: Fence,
        held: Callable[[], set[int]],
        alive: Callable[[int], bool],
        report: Callable[[str, BaseException | None], None],
        halt: Callable[[str, BaseException], None],
        timeout_s: float,
        streams: str,
    ) -> None:
        self.transactional_id = transactional_id
        self._group_metadata = group_metadata
        self._held = held
        self._alive = alive
        self._report = report
        self._offsets = offsets
        self._fence = fence
        self._halt = halt
        self._settings = cluster.client_config(
            PRODUCER_DEFAULTS,
            {
                "client.id": f"bolide-tiers-{transactional_id}",
                "transactional.id": transactional_id,
                "transaction.timeout.ms": int(2000 * timeout_s),
            },
        )
        self._streams = streams
        self._timeout_s = timeout_s
        self._renewals: list[float] = []  # monotonic times the producer was built again
        # Refusals of the transactional id (a missing ACL) are raised here, at attach.
        self._producer, self._txn = self._new_producer()
        self._cond = threading.Condition()
        self._pending: list[Write] = []
        self._wanted = False  # a round is asked for even without writes
        self._proof = False  # ... and it must carry offsets
        self._committed_at = 0.0  # monotonic start of the last round that committed
        self._round_at = 0.0  # monotonic start of the last round
        self._failures = 0  # failed rounds in a row
        self._ended = False  # refused for good, or closed
        self.rounds = 0  # transactions committed
        self.rounds_with_writes = 0  # ... that carried writes
        self._thread = threading.Thread(target=self._run, name="bolide-tier-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _new_producer(self) -> tuple[Producer, Transactions]:
        """A transactional producer with the id; its ``init_transactions`` fences an earlier
        one and finishes or aborts that one's open transaction.

        Raises:
            AuthorizationError: The user may not use the transactional id.
            TransactionError: Initialising failed.
        """
        producer = new_client(Producer, dict(self._settings), "retry tiers")
        txn = Transactions(
            producer,
            self.transactional_id,
            self._streams,
            timeout_s=self._timeout_s,
            transaction_timeout_s=2 * self._timeout_s,
            # A member started again with its id (static, or named after its slot) waits for
            # the coordinator to end its predecessor's open round: within that round's
            # transaction timeout, or once the brokers that hold its partitions answer.
            init_within_s=4 * self._timeout_s,
        )
        return producer, txn

    # -- asked by the tiers ------------------------------------------------------------------

    def write(self, write: Write) -> None:
        """Queue ``write`` for the next round (``write.done`` once it committed)."""
        with self._cond:
            if self._ended:
                ended = True
            else:
                ended = False
                self._pending.append(write)
                self._cond.notify()
        if ended:
            write.done(TransactionError("the retry tiers' writer stopped", stream=write.topic))

    def want(self, *, proof: bool = False) -> None:
        """Ask for a round soon: confirms moved, or (``proof``) the fence waits for one."""
        with self._cond:
            self._wanted = True
            self._proof = self._proof or proof
            self._cond.notify()

    def flush(self, partitions: Iterable[int], deadline: float) -> bool:
        """Wait, until the monotonic ``deadline``, for a round begun after this call to
        commit with no write of ``partitions`` left; ``False`` if none did in time."""
        parts = set(partitions)
        asked = time.monotonic()
        self.want()
        with self._cond:
            return self._cond.wait_for(
                lambda: (
                    self._ended
                    or (
                        self._committed_at > asked
                        and not any(w.partition in parts for w in self._pending)
                    )
                ),
                max(0.0, deadline - time.monotonic()),
            )

    def drop(self, partitions: Iterable[int]) -> None:
        """Forget the writes of revoked ``partitions`` not committed yet: the next owner
        reads their records again (their ``done`` is never called)."""
        gone = set(partitions)
        with self._cond:
            self._pending = [w for w in self._pending if w.partition not in gone]

    # -- the rounds --------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._ended or self._pending or self._wanted, 0.5)
                if self._ended:
                    return
                alive = self._alive
                self._pending = [w for w in self._pending if alive(w.partition)]
                batch, proof = self._pending[:_ROUND_MAX], self._proof
                if not batch and not self._wanted:
                    continue
                left = self._round_at + _CONFIRM_S - time.monotonic()
                if not batch and not proof and left > 0:
                    # Confirms alone wait a little for writes to go with them: a round that
                    # carries none would hold up the writes queued while it runs.
                    self._cond.wait_for(
                        lambda: self._ended or bool(self._pending) or self._proof, left
                    )
                    continue
                self._wanted = self._proof = False
                self._round_at = time.monotonic()
            try:
                self._round(batch, proof)
            except Exception as exc:
                self._failed(exc)

    def _round(self, batch: list[Write], proof: bool) -> None:
        started = time.monotonic()
        # The generation first, then the offsets: offsets computed under an assignment that
        # a rebalance has replaced meanwhile go out with the generation before it, which the
        # group refuses (read after them, a revoke and re-assignment during the round would
        # let them pass, behind the next load's lookups).
        metadata = self._group_metadata()
        offsets, after = self._offsets({w.partition for w in batch}, proof or bool(batch))
        if not offsets:
            if batch:  # no offset to fence them by: their partitions went meanwhile
                self._cond_wait(0.1)
            return
        mark = self._fence.mark()
        txn = self._txn
        try:
            txn.begin()
        except TransactionError as exc:  # an abort that timed out still runs: start over
            raise _Stuck(f"retry tiers could not begin a transaction: {exc}") from exc
        try:
            for write in batch:
                self._produce(write)
            txn.confirm(lambda: (offsets, metadata, after))
        except BaseException as exc:
            try:
                txn.abort()
            except Exception as failed:  # the first error tells what happened
                log.debug("retry tiers: abort after %r failed: %r", exc, failed)
            raise
        txn.commit()
        with self._cond:
            done = {id(w) for w in batch}
            self._pending = [w for w in self._pending if id(w) not in done]
            self._committed_at = started
            self._failures = 0
            self.rounds += 1
            self.rounds_with_writes += bool(batch)
            self._cond.notify_all()
        self._fence.proven(mark)
        for write in batch:
            write.done(None)

    def _produce(self, write: Write) -> None:
        """Hand ``write`` to the producer; one the producer refuses by itself (a record too
        large for the broker) can never be written: the receiver stops."""
        copy = write.copy
        try:
            self._producer.produce(
                write.topic,
                value=copy.data,
                key=copy.key,
                headers=list[tuple[str, str | bytes | None]](copy.headers),
                partition=copy.partition if copy.partition is not None else -1,
            )
        except BufferError:
            raise
        except KafkaException as exc:
            raise _Unwritable(f"{write.topic} refuses the copy of {write.copy!r}: {exc}") from exc

    def _cond_wait(self, timeout_s: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._ended, timeout_s)

    def _failed(self, error: Exception) -> None:
        """A round failed: stop for good (an ACL, the credentials), build the producer again
        (it was fenced, its commit stayed in doubt, or it hit a fatal error: a member paused
        past the transaction timeout has its transaction aborted and its producer fenced by
        the coordinator), hold the tiers for a refused generation, or try again after a
        backoff (reported when the failures in a row reach a power of two). The writes of
        the failed round stay queued for the next."""
        if isinstance(error, (AuthorizationError, AuthenticationError, _Unwritable)):
            self._end(error)
            return
        cause = getattr(error, "cause", None)
        code = cause.code() if isinstance(cause, KafkaError) else None
        self._failures += 1
        n = self._failures
        ended = isinstance(error, TransactionError) and (
            isinstance(error, (ProducerFencedError, TransactionInDoubtError, _Stuck))
            or not error.retriable
        )
        if ended or (isinstance(cause, KafkaError) and cause.fatal()):
            self._renew(error)
        elif code in GROUP_REFUSALS:
            log.info("retry tiers: the group refused a transaction (%s): copies held", cause)
            self._fence.suspect(self._held())
        elif n & (n - 1) == 0:
            times = "" if n == 1 else f" ({n} times in a row)"
            self._report(f"retry tiers: a write failed{times}; trying again", error)
        wait = min(_BACKOFF_S[1], _BACKOFF_S[0] * 2.0 ** min(n - 1, 16))
        with self._cond:
            self._wanted = True
            self._cond.wait_for(lambda: self._ended, wait)

    def _renew(self, error: Exception) -> None:
        """Build the producer again after ``error`` ended it; stop for good when that keeps
        happening (``_RENEWALS`` times within ``_RENEWAL_WINDOW_S``: another running
        receiver uses the transactional id, each fencing the other)."""
        now = time.monotonic()
        self._renewals = [t for t in self._renewals if now - t < _RENEWAL_WINDOW_S]
        if len(self._renewals) >= _RENEWALS:
            self._end(error)
            return
        log.warning("retry tiers: their producer ended (%s); building it again", error)
        try:
            self._txn.close()
        except Exception as exc:
            log.debug("retry tiers: closing the ended producer failed: %r", exc)
        try:
            self._producer, self._txn = self._new_producer()
            self._renewals.append(now)  # counted once built: a broker away costs nothing
        except (AuthorizationError, AuthenticationError) as exc:
            self._end(exc)
        except Exception as exc:  # the broker away: tried again on the next failed round
            self._report("retry tiers: building their producer again failed", exc)

    def _end(self, error: BaseException) -> None:
        with self._cond:
            if self._ended:
                return
            self._ended = True
            pending, self._pending = self._pending, []
            self._cond.notify_all()
        self._halt(
            "retry tiers: the broker refuses their writes for good; the receiver stops "
            "(records not written are not confirmed)",
            error,
        )
        for write in pending:
            write.done(error)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the rounds (after the one running) and close the producer; writes not
        committed are dropped (their records are not confirmed: read again)."""
        with self._cond:
            self._ended = True
            self._pending = []
            self._cond.notify_all()
        if self._thread.ident is not None:
            self._thread.join(timeout_s)
        try:
            self._txn.close()  # an open transaction is aborted
        except Exception as exc:
            log.debug("retry tiers: closing the transactions failed: %r", exc)
        self._producer.flush(0)
