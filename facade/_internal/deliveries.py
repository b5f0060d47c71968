"""A publisher's outstanding deliveries: what resolves each record's future and callback
from its delivery report (``Delivery``; ``Batch`` for ``publish_many``), the errors a failed
delivery becomes, and failing what is left when the publisher closes."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from confluent_kafka import KafkaError, Message

from bolide.facade._internal.transactions import Transactions
from bolide.facade.errors import PublishError, TransactionError
from bolide.facade.record import Record

__all__ = ["REFUSED", "Batch", "Delivery", "Outstanding", "PublishCallback", "call_back"]

log = logging.getLogger("bolide.facade.publisher")

PublishCallback = Callable[[int | None, BaseException | None], None]

#: Delivery errors of records that ``close`` purged from the producer.
_PURGED = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})

#: The answer for a record refused because the publisher closed while it waited for room.
REFUSED = object()


def call_back(callback: PublishCallback, offset: int | None, error: BaseException | None) -> None:
    """Call a publish callback; what it raises is logged, never propagated."""
    try:
        callback(offset, error)
    except Exception:
        log.exception("publish callback raised")


class Outstanding:
    """The deliveries whose reports have not come yet, of one publisher's ``topic``.

    Args:
        topic: The publisher's stream (for errors).
        transactions: A transactional publisher's transactions, else ``None``.
    """

    def __init__(self, topic: str, transactions: Transactions | None) -> None:
        self._topic = topic
        self._txn = transactions
        self._pending: set[Delivery | Batch] = set()

    def add(self, delivery: Delivery | Batch) -> None:
        """A delivery sent; its report is awaited."""
        self._pending.add(delivery)

    def remove(self, delivery: Delivery | Batch) -> None:
        """Its report came. Raises ``KeyError`` if ``fail_all`` took it first."""
        self._pending.remove(delivery)

    def discard(self, delivery: Delivery | Batch) -> None:
        """It was never sent."""
        self._pending.discard(delivery)

    def error(self, rec: Record, err: Any) -> PublishError:
        """The ``PublishError`` for a record the broker (or ``close``) did not accept."""
        if self._txn is not None:
            ended = self._txn.error_for(err)
            if ended is not None:  # fenced: every later call says so too
                return type(ended)(str(ended), record=rec, cause=err, stream=self._topic)
            if isinstance(err, KafkaError) and err.code() == KafkaError._STATE:
                return TransactionError(
                    "a transactional publisher publishes inside `with pub.transaction():` "
                    f"({err.str()})",
                    record=rec,
                    cause=err,
                    stream=self._topic,
                )
        if err is REFUSED:
            return PublishError(
                "publisher is closed (it closed while the record waited for room in the local "
                "queue)",
                record=rec,
                stream=self._topic,
            )
        reason = err.str() if isinstance(err, KafkaError) else str(err)
        if isinstance(err, KafkaError) and err.code() in _PURGED:
            reason = f"the publisher closed before the broker acknowledged it ({reason})"
        retriable = err.retriable() if isinstance(err, KafkaError) else None
        return PublishError(
            f"publish to {self._topic!r} failed: {reason}",
            record=rec,
            cause=err,
            stream=self._topic,
            retriable=retriable,
        )

    def fail_all(self) -> None:
        """Fail any record whose report never came, so that no future waits forever."""
        while True:
            try:
                delivery = self._pending.pop()
            except KeyError:
                return
            delivery.resolve(
                KafkaError(KafkaError._PURGE_QUEUE, "no delivery report after close"), None
            )


class Delivery:
    """Resolves one record's future (if any) and callback from its delivery report."""

    __slots__ = ("callback", "future", "outstanding", "record")

    def __init__(
        self,
        outstanding: Outstanding,
        record: Record,
        future: Future[int] | None,
        callback: PublishCallback | None,
    ) -> None:
        self.outstanding = outstanding
        self.record = record
        self.future = future
        self.callback = callback

    def __call__(self, err: Any, msg: Message | None) -> None:
        try:
            self.outstanding.remove(self)
        except KeyError:
            return  # already failed by close
        self.resolve(err, msg)

    def resolve(self, err: Any, msg: Message | None) -> None:
        """Resolve the future and call the callback (once: the caller owns the delivery)."""
        rec = self.record
        if err is not None or msg is None:
            error = self.outstanding.error(rec, err)
            if self.future is not None:
                self.future.set_exception(error)
            if self.callback is not None:
                call_back(self.callback, None, error)
            return
        # A delivered message always has them; the stubs allow None (no cast: a call per record).
        offset: int = msg.offset()  # type: ignore[assignment]
        rec.offset = offset
        rec.partition = msg.partition()
        rec.timestamp_ms = msg.timestamp()[1]
        if self.future is not None:
            self.future.set_result(offset)
        if self.callback is not None:
            call_back(self.callback, offset, None)


class Batch:
    """Resolves the one future of ``publish_many`` once every record has its report."""

    __slots__ = ("error", "future", "lock", "offsets", "outstanding", "records", "remaining")

    def __init__(
        self, outstanding: Outstanding, records: list[Record], future: Future[list[int]]
    ) -> None:
        self.outstanding = outstanding
        self.records = records
        self.future = future
        self.offsets = [-1] * len(records)
        self.remaining = len(records)
        self.error: PublishError | None = None
        self.lock = threading.Lock()  # reports may be served on two threads at once

    def report(self, index: int, err: Any, msg: Message | None) -> None:
        """The delivery report of record ``index``."""
        rec = self.records[index]
        with self.lock:
            if err is None and msg is not None:
                offset: int = msg.offset()  # type: ignore[assignment]
                rec.offset = self.offsets[index] = offset
                rec.partition = msg.partition()
                rec.timestamp_ms = msg.timestamp()[1]
            elif self.error is None:
                self.error = self.outstanding.error(rec, err)
            self.remaining -= 1
            if self.remaining:
                return
        try:
            self.outstanding.remove(self)
        except KeyError:
            return  # already failed by close
        self._finish()

    def resolve(self, err: Any, msg: Message | None) -> None:
        """Fail what is left of the batch (``close`` found its reports missing)."""
        with self.lock:
            if self.error is None:
                first = next(i for i, o in enumerate(self.offsets) if o < 0)
                self.error = self.outstanding.error(self.records[first], err)
        self._finish()

    def _finish(self) -> None:
        if self.error is not None:
            self.future.set_exception(self.error)
        else:
            self.future.set_result(self.offsets)
