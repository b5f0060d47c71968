"""A publisher's outstanding deliveries: what resolves each record's future and callback
from its delivery report (``Delivery``, ``FutureDelivery``; ``Batch`` for ``publish_many``,
sent in one ``produce_batch`` call where it can be), the errors a failed delivery becomes, and
failing what is left when the publisher closes."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from typing import Any, TypeAlias

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from bolide.facade.errors import BolideError, PublishError, TransactionError
from bolide.facade.kafka.fatal import Scope, fatal_error
from bolide.facade.ports import PublishCallback
from bolide.facade.producer._delivery_cy import Delivery, FutureDelivery, call_back
from bolide.facade.producer.transactions import Transactions
from bolide.facade.record import Record, headers_or_none

__all__ = [
    "PARTITION_UNASSIGNED",
    "REFUSED",
    "Batch",
    "Delivery",
    "FutureDelivery",
    "Outstanding",
    "PublishCallback",
    "batch_messages",
    "call_back",
    "send_batch",
    "served",
]

#: What a publisher awaits a report for: a record with a callback, with a future, or a batch.
Pending: TypeAlias = "Delivery | FutureDelivery | Batch"

#: Delivery errors of records that ``close`` purged from the producer.
_PURGED = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})

#: The answer for a record refused because the publisher closed while it waited for room.
REFUSED = object()

#: librdkafka's RD_KAFKA_PARTITION_UA: let the partitioner choose from the key.
PARTITION_UNASSIGNED = -1


def served(producer: Producer, err: KafkaError) -> KafkaError:
    """``err``, the producer's refusal of a record; a producer failed for good has its
    ``error_cb`` served first, so that the record's answer names the cause (a missing ACL,
    through ``Outstanding.refused``), not "Fatal error"."""
    if err.code() == KafkaError._FATAL:
        producer.poll(0)
    return err


class Outstanding:
    """The deliveries whose reports have not come yet, of one publisher's ``topic``.

    Args:
        topic: The publisher's stream (for errors).
        transactions: A transactional publisher's transactions, else ``None``.

    Attributes:
        add: ``add(delivery)``: a delivery sent; its report is awaited.
        remove: ``remove(delivery)``: its report came; ``KeyError`` if ``fail_all`` took it
            first.
        discard: ``discard(delivery)``: it was never sent.
    """

    def __init__(
        self, topic: str, transactions: Transactions | None, transactional_id: str | None = None
    ) -> None:
        self._topic = topic
        self._txn = transactions
        self._scope = Scope("publisher", topic, transactional_id=transactional_id)
        #: A broker answer retrying cannot fix, that the producer's records were purged for.
        self.refused: KafkaError | None = None
        self._pending: set[Pending] = set()
        # The set's own methods: called twice per record, they cost no Python call.
        self.add = self._pending.add
        self.remove = self._pending.remove
        self.discard = self._pending.discard

    def error(self, rec: Record, err: Any) -> BolideError:
        """The error for a record the broker (or ``close``) did not accept: a
        ``PublishError``, or the typed error of an answer retrying cannot fix
        (``AuthorizationError``, ``AuthenticationError``, ``IncompatibleBrokerError``)."""
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
        if isinstance(err, KafkaError):
            fatal = self._fatal_for(rec, err)
            if fatal is not None:
                return fatal
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

    def _fatal_for(self, rec: Record, err: KafkaError) -> BolideError | None:
        """The typed error of a record refused for good: by its own delivery report, or
        purged from the queue (or refused by a producer failed for good) after the
        producer's ``error_cb`` got such an answer."""
        refused = self.refused
        if err.code() in (KafkaError._PURGE_QUEUE, KafkaError._FATAL) and refused is not None:
            err = refused
        return fatal_error(err, self._scope, rec)

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


class Batch:
    """Resolves the one future of ``publish_many`` once every record has its answer.

    An answer is a delivery report, or a refusal when the record was never accepted
    (``reject``). Reports come through ``report`` (per-record callbacks that carry the index)
    or ``report_next`` (one callback for a batch sent to one partition, whose reports come in
    the order produced); ``lock`` serializes them, as reports may be served on two threads at
    once. Whoever sends the batch holds ``lock`` while a run of records enters the producer
    and its refusals are marked, so no report is matched before then.
    """

    __slots__ = (
        "answered",
        "cursor",
        "error",
        "future",
        "lock",
        "offsets",
        "outstanding",
        "records",
        "remaining",
    )

    def __init__(
        self, outstanding: Outstanding, records: list[Record], future: Future[list[int]]
    ) -> None:
        self.outstanding = outstanding
        self.records = records
        self.future = future
        self.offsets = [-1] * len(records)
        self.answered = bytearray(len(records))  # 1 once a record has its answer
        self.cursor = 0  # every record below it has its answer
        self.remaining = len(records)
        self.error: BolideError | None = None
        self.lock = threading.Lock()

    def report(self, index: int, err: Any, msg: Message | None) -> None:
        """The delivery report of record ``index``."""
        with self.lock:
            last = self._answer(index, err, msg)
        if last:
            self.done()

    def report_next(self, err: Any, msg: Message | None) -> None:
        """A delivery report of a batch sent to one partition.

        Reports of one partition come in the order produced, so this is the first record
        without an answer, unless it differs from the message (a refusal reported out of
        order, such as records purged by ``close`` before those in flight): then the first
        record without an answer whose payload and key are the message's.
        """
        with self.lock:
            last = self._answer(self._match(msg), err, msg)
        if last:
            self.done()

    def reject(self, index: int, err: Any) -> bool:
        """Record ``index`` was refused before it reached the producer (its caller holds
        ``lock``); true when that was the last answer: the caller then calls ``done``."""
        return self._answer(index, err, None)

    def _match(self, msg: Message | None) -> int:
        answered, records = self.answered, self.records
        first = answered.find(0, self.cursor)
        self.cursor = first
        if msg is None:
            return first
        value, key = msg.value(), msg.key()
        candidate = first
        while candidate >= 0:
            record = records[candidate]
            if record.data == value and record.key == key:
                return candidate
            candidate = answered.find(0, candidate + 1)
        return first  # nothing alike (cannot happen): the first without an answer

    def _answer(self, index: int, err: Any, msg: Message | None) -> bool:
        self.answered[index] = 1
        rec = self.records[index]
        if err is None and msg is not None:
            offset: int = msg.offset()  # type: ignore[assignment]
            rec.offset = self.offsets[index] = offset
            rec.partition = msg.partition()
            rec.timestamp_ms = msg.timestamp()[1]
        elif self.error is None:
            self.error = self.outstanding.error(rec, err)
        self.remaining -= 1
        return not self.remaining

    def done(self) -> None:
        """Resolve the future: the last answer came (called with ``lock`` let go)."""
        try:
            self.outstanding.remove(self)
        except KeyError:
            return  # already failed by close
        self._finish()

    def resolve(self, err: Any, msg: Message | None) -> None:
        """Fail what is left of the batch (``close`` found its reports missing)."""
        with self.lock:
            if self.error is None:
                first = max(self.answered.find(0), 0)
                self.error = self.outstanding.error(self.records[first], err)
        self._finish()

    def _finish(self) -> None:
        if self.error is not None:
            self.future.set_exception(self.error)
        else:
            self.future.set_result(self.offsets)


# -- sending a batch in one call -----------------------------------------------------------


def batch_messages(
    batch: Batch, topic: str, default_key: bytes | None, partition: int
) -> list[dict[str, Any]] | None:
    """``Producer.produce_batch``'s messages for ``batch``, its records stamped with ``topic``.

    ``None`` when a record needs what a batch cannot carry: headers (``produce_batch`` drops
    them, so a message group's header too) or a partition of its own (it takes one partition
    for the whole batch); such a batch goes record by record. On one ``partition`` the reports
    come in the order produced and one callback serves them all (``Batch.report_next``);
    otherwise (``PARTITION_UNASSIGNED``: the key picks) each message carries its own.
    """
    ordered = partition != PARTITION_UNASSIGNED
    messages: list[dict[str, Any]] = []
    append = messages.append
    for index, rec in enumerate(batch.records):
        if (
            headers_or_none(rec)
            or rec.group is not None
            or (rec.partition is not None and rec.offset is None)
        ):
            return None
        rec.stream = topic
        key = rec.key if rec.key is not None else default_key
        if ordered:
            append({"value": rec.data, "key": key})
        else:
            append({"value": rec.data, "key": key, "callback": partial(batch.report, index)})
    return messages


def send_batch(
    producer: Producer,
    topic: str,
    partition: int,
    messages: list[dict[str, Any]],
    batch: Batch,
    closing: Callable[[], bool],
) -> None:
    """Hand ``messages`` to ``producer`` in one call per run that finds room in its queue.

    ``produce_batch`` marks each message it refused with ``_error``: a full queue refuses the
    rest of the run, offered again in order once there is room (or refused once ``closing()``
    says so, as a record offered after close is); any other refusal is that record's answer.
    ``batch.lock`` is held while a run enters the producer, so its reports wait until its
    refusals are marked.
    """
    report = batch.report_next if partition != PARTITION_UNASSIGNED else None
    first = 0
    while True:
        run = messages[first:] if first else messages
        with batch.lock:
            full, last = _enqueue(producer, topic, partition, run, first, batch, report)
        if last:
            batch.done()
        if full is None:
            return
        if closing():
            with batch.lock:
                last = any([batch.reject(i, REFUSED) for i in range(full, len(messages))])
            if last:
                batch.done()
            return
        producer.poll(0.01)  # room comes as reports are served
        first = full


def _enqueue(
    producer: Producer,
    topic: str,
    partition: int,
    run: list[dict[str, Any]],
    first: int,
    batch: Batch,
    report: Callable[[Any, Message | None], None] | None,
) -> tuple[int | None, bool]:
    """One ``produce_batch`` of ``run`` (the batch's records from ``first`` on): where a full
    queue stopped it (``None``: all taken), and whether a refusal was the batch's last answer."""
    try:
        taken = producer.produce_batch(topic, run, partition=partition, on_delivery=report)
    except BufferError:
        return first, False
    except KafkaException as exc:  # nothing of the run was taken
        err = served(producer, exc.args[0])
        return None, any([batch.reject(first + i, err) for i in range(len(run))])
    if taken == len(run):
        return None, False
    last = False
    for i, message in enumerate(run):
        err = message.pop("_error", None)
        if err is None:
            continue
        if err.code() == KafkaError._QUEUE_FULL:  # this one and every one after it
            for rest in run[i + 1 :]:
                rest.pop("_error", None)
            return first + i, last
        last = batch.reject(first + i, err) or last
    return None, last
