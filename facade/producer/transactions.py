"""``Transactions``: a transactional publisher's Kafka transactions (Kafka Streams' exactly-once).

One transaction at a time: ``begin``; the records published; ``confirm`` adds a subscriber's
delivered positions (``send_offsets_to_transaction``); ``commit`` makes all of it visible to
``read_committed`` readers at once, or ``abort`` drops all of it. librdkafka's rules for a
failed call are followed: a retriable error is retried, an abortable one aborts, a fatal one
(fencing among them) ends the publisher. A commit that timed out may still complete (librdkafka
goes on with it in the background), so it is asked again, never aborted, until the cluster
says how it ended. librdkafka can wait inside a transactional call long past its timeout (a
coordinator whose broker left its metadata); a call that overruns it by ``OVERRUN_GRACE_S`` is
left to librdkafka and ends the publisher, so its owner can start another with the id, which
fences this one and finishes or aborts its transaction.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from bolide.facade.errors import (
    ProducerFencedError,
    TransactionError,
    TransactionInDoubtError,
)
from bolide.facade.kafka.fatal import FATAL_CODES, Scope, fatal_error

__all__ = ["FENCED", "OVERRUN_GRACE_S", "OffsetSource", "TransactionSource", "Transactions"]

log = logging.getLogger(__name__)

#: Errors that say a newer producer with the same transactional id took over.
FENCED = frozenset(
    {KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH, KafkaError._FENCED}
)

#: How long past its own timeout a transactional call is waited for before it is left to
#: librdkafka and the publisher ends.
OVERRUN_GRACE_S = 10.0

#: Gives a consumer's delivered positions, its group's metadata (Kafka's
#: ``sendOffsetsToTransaction(positions, consumer.groupMetadata())``) and what to call once
#: the transaction commits.
OffsetSource = Callable[[], tuple[list[TopicPartition], Any, Callable[[], None]]]


_COMMIT = "commit transaction"


class TransactionSource(Protocol):
    """What ``Publisher.confirm`` takes: a subscriber, one ``OffsetSource`` per consumer."""

    def transaction_sources(self) -> list[OffsetSource]:
        """The subscriber's offset sources (one per stream it reads)."""
        ...


class Transactions:
    """The transactions of one publisher's producer.

    Args:
        producer: The publisher's producer, built with ``transactional.id``.
        transactional_id: Its transactional id (for messages).
        stream: The publisher's stream (for messages).
        timeout_s: How long each transactional call may take.
        transaction_timeout_s: The producer's ``transaction.timeout.ms``: how long a commit
            whose outcome is unknown is asked again (the coordinator ends every transaction
            within it).
        overrun_grace_s: How long past ``timeout_s`` a call is waited for before the
            publisher is left to it and ends.
        init_within_s: How long initialising is tried again while the broker answers that
            it cannot yet (an earlier producer's transaction with the id is still being
            ended); one call's timeout by default.

    Raises:
        ProducerFencedError: Initialising was refused for fencing.
        TransactionError: Initialising failed (the broker, or a setting).
    """

    def __init__(
        self,
        producer: Producer,
        transactional_id: str,
        stream: str,
        timeout_s: float = 30.0,
        transaction_timeout_s: float = 60.0,
        overrun_grace_s: float = OVERRUN_GRACE_S,
        init_within_s: float | None = None,
    ) -> None:
        self._producer = producer
        self.transactional_id = transactional_id
        self._stream = stream
        self._timeout_s = timeout_s
        self._transaction_timeout_s = transaction_timeout_s
        self._overrun_grace_s = overrun_grace_s
        self._lock = threading.Lock()
        self.open = False
        self._closed = False
        self._ended: TransactionError | None = None  # fenced, or a fatal error
        self._after_commit: list[Callable[[], None]] = []
        self._run(
            "initialise transactions",
            lambda: producer.init_transactions(timeout_s),
            within_s=init_within_s,
        )

    # -- state -------------------------------------------------------------------------------

    def error_for(self, err: Any) -> TransactionError | None:
        """The typed error for a failure that ends the publisher (else ``None``); it is
        remembered, so every later call, and every record failed after it, reports it."""
        if self._ended is not None:
            return self._ended
        if not isinstance(err, KafkaError):
            return None
        if err.code() in FENCED:
            return self._end(self._fenced(err.str()))
        if err.fatal():
            return self._end(self._fatal(err))
        return None

    def _fenced(self, reason: str) -> ProducerFencedError:
        return ProducerFencedError(
            f"publisher with transactional_id {self.transactional_id!r} was fenced: another "
            f"publisher with the same id started ({reason}); close this one",
            stream=self._stream,
        )

    def _fatal(self, err: KafkaError) -> TransactionError:
        return TransactionError(
            f"publisher with transactional_id {self.transactional_id!r} hit a fatal error "
            f"({err.str()}); close it",
            stream=self._stream,
            cause=err,
        )

    def _end(self, error: TransactionError) -> TransactionError:
        if self._ended is None:
            self._ended = error
        return error

    def _check(self) -> None:
        if self._ended is not None:
            raise type(self._ended)(str(self._ended), stream=self._stream)
        if self._closed:
            raise TransactionError("publisher is closed", stream=self._stream)

    def _run(self, what: str, call: Callable[[], object], within_s: float | None = None) -> None:
        """One transactional call, its errors typed (a retriable one is retried for
        ``within_s``, one call's timeout by default)."""
        deadline = time.monotonic() + (self._timeout_s if within_s is None else within_s)
        while True:
            try:
                self._bounded(what, call)
                return
            except KafkaException as exc:
                err = exc.args[0]
                if not isinstance(err, KafkaError):
                    raise TransactionError(f"{what} failed: {exc}", stream=self._stream) from exc
                if err.code() in FATAL_CODES:  # a missing ACL, say: named, not a generic end
                    scope = Scope("publisher", self._stream, transactional_id=self.transactional_id)
                    refusal = fatal_error(err, scope)
                    self._end(self._fatal(err))
                    raise refusal or self._fatal(err) from exc
                ended = self.error_for(err)
                if ended is not None:
                    raise ended from exc
                retry = err.retriable() and not err.txn_requires_abort()
                if retry and time.monotonic() < deadline:
                    continue
                raise TransactionError(
                    f"{what} failed for transactional_id {self.transactional_id!r}: {err.str()}",
                    stream=self._stream,
                    cause=err,
                    retriable=err.retriable() or err.txn_requires_abort(),
                ) from exc

    def _bounded(self, what: str, call: Callable[[], object]) -> None:
        """``call`` in a thread of its own, waited for one call's timeout plus the overrun
        grace; past that it is left running and the publisher ends.

        Raises:
            TransactionError: The call overran (``TransactionInDoubtError`` for a commit:
                it may still land).
        """
        outcome: list[BaseException | None] = []
        returned = threading.Event()

        def run() -> None:
            try:
                call()
                outcome.append(None)
            except BaseException as exc:  # handed to the caller
                outcome.append(exc)
            finally:
                returned.set()

        name = f"bolide-transaction-{self.transactional_id}"
        threading.Thread(target=run, name=name, daemon=True).start()
        if not returned.wait(self._timeout_s + self._overrun_grace_s):
            error = (TransactionInDoubtError if what == _COMMIT else TransactionError)(
                f"{what} for transactional_id {self.transactional_id!r} did not return "
                f"within its {self._timeout_s:g} s timeout (librdkafka still waits): close "
                "this publisher; the next one with the id fences it and finishes or aborts "
                "its transaction",
                stream=self._stream,
                retriable=True,
            )
            raise self._end(error)
        if outcome[0] is not None:
            raise outcome[0]

    # -- one transaction ---------------------------------------------------------------------

    def begin(self) -> None:
        """Begin a transaction.

        Raises:
            TransactionError: One is already open, or the publisher is closed or ended.
        """
        with self._lock:
            self._check()
            if self.open:
                raise TransactionError(
                    "a transaction is already open on this publisher (one at a time)",
                    stream=self._stream,
                )
            self._run("begin transaction", self._producer.begin_transaction)
            self.open = True

    def confirm(self, source: OffsetSource) -> None:
        """Send a subscriber's positions with the open transaction.

        Args:
            source: Gives the positions, the group's metadata, and what to call once the
                transaction commits (``Subscriber.transaction_sources``).

        Raises:
            TransactionError: No transaction is open, or the broker refused.
            NotAssignedError: The subscriber read records on a partition it no longer holds
                and has not confirmed them (``source`` raises it).
        """
        with self._lock:
            self._open_check()
        # The subscriber's part runs outside the lock: what it reports reaches the error
        # handler, which may publish or confirm on this publisher.
        offsets, metadata, after = source()
        with self._lock:
            self._open_check()
            if offsets:
                self._run(
                    "send the input positions",
                    lambda: self._producer.send_offsets_to_transaction(
                        offsets, metadata, self._timeout_s
                    ),
                )
            self._after_commit.append(after)

    def _open_check(self) -> None:
        self._check()
        if not self.open:
            raise TransactionError(
                "confirm(sub) belongs inside `with pub.transaction():`", stream=self._stream
            )

    def commit(self) -> None:
        """Commit the open transaction (it flushes what was published in it first).

        Raises:
            ProducerFencedError: Another publisher took the transactional id over.
            TransactionError: The commit failed; the transaction was aborted.
        """
        with self._lock:
            self._check()
            try:
                self._commit()
            except TransactionInDoubtError as exc:
                self._end(exc)  # neither committed nor aborted as far as anyone here knows
                raise
            except TransactionError:
                if self._ended is None:
                    self._abort_quietly()
                raise
            finally:
                self.open = False
                callbacks, self._after_commit = self._after_commit, []
            for callback in callbacks:  # committed: the positions sent with it hold
                callback()

    def _commit(self) -> None:
        """``commit_transaction``, asked again while its outcome is unknown, for the whole
        transaction timeout: a timeout (the coordinator paused, or moving) leaves the commit
        going on in the background, and an abort then would fail while the commit still lands.

        Raises:
            TransactionInDoubtError: Still unknown after the transaction timeout.
            TransactionError: The commit failed (abortable, fatal or fenced).
        """
        try:
            self._run(
                _COMMIT,
                lambda: self._producer.commit_transaction(self._timeout_s),
                within_s=self._transaction_timeout_s + self._timeout_s,
            )
        except TransactionError as exc:
            err = exc.cause
            # What ``_run`` retries: its last answer still left the outcome unknown.
            if isinstance(err, KafkaError) and err.retriable() and not err.txn_requires_abort():
                raise TransactionInDoubtError(
                    f"the commit of transactional_id {self.transactional_id!r} got no answer "
                    f"within the transaction timeout ({err.str()}): it may have committed; "
                    "close this publisher, and the next one with the id finishes or aborts it",
                    stream=self._stream,
                    cause=err,
                ) from exc
            raise

    def abort(self) -> None:
        """Abort the open transaction, if any: nothing of it is seen by ``read_committed``
        readers and the positions sent with it are dropped."""
        with self._lock:
            self._after_commit.clear()
            if not self.open:
                return
            self.open = False
            if self._ended is not None:
                return  # fenced: the newer publisher aborted it already
            self._run(
                "abort transaction", lambda: self._producer.abort_transaction(self._timeout_s)
            )

    def _abort_quietly(self) -> None:
        try:
            self._bounded(
                "abort transaction", lambda: self._producer.abort_transaction(self._timeout_s)
            )
        except (KafkaException, TransactionError) as exc:
            log.warning("aborting a failed transaction on %r failed: %s", self._stream, exc)

    def close(self) -> None:
        """Abort an open transaction (its records fail) and refuse further calls."""
        with self._lock:
            self._closed = True
            self._after_commit.clear()
            if self.open and self._ended is None:
                self._abort_quietly()
            self.open = False
