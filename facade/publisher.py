"""Publisher: places records into a stream through an idempotent Kafka producer, or a
transactional one (``PublisherConfig(transactional_id=...)``, docs/exactly-once.md)."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from bolide.facade.config import Cluster, PublisherConfig
from bolide.facade.errors import PublishError, TransactionError
from bolide.facade.kafka import PRODUCER_DEFAULTS, ensure_topic, new_client
from bolide.facade.kafka.fatal import FATAL_CODES
from bolide.facade.ports import FramedSerde
from bolide.facade.producer.deliveries import (
    PARTITION_UNASSIGNED,
    REFUSED,
    Batch,
    Delivery,
    FutureDelivery,
    Outstanding,
    PublishCallback,
    batch_messages,
    send_batch,
    served,
)
from bolide.facade.producer.transactions import Transactions, TransactionSource
from bolide.facade.record import (
    MESSAGE_GROUP_HEADER,
    Record,
    SharedRecord,
    headers_or_none,
    unshared,
)
from bolide.facade.support import Closing
from bolide.facade.telemetry import TELEMETRY

__all__ = ["PublishCallback", "Publisher"]

log = logging.getLogger(__name__)


class Publisher(Closing):
    """Publishes records to one stream; each publisher's order is kept across retries.

    Args:
        cluster: Where the stream lives.
        config: The stream and publisher settings.

    The topic is created on first use. Use as a context manager, or call ``close()``.
    """

    def __init__(self, cluster: Cluster, config: PublisherConfig) -> None:
        if not isinstance(cluster, Cluster):
            raise TypeError("cluster must be a Cluster")
        if not isinstance(config, PublisherConfig):
            raise TypeError("config must be a PublisherConfig")
        self.cluster = cluster
        self.config = config
        self.stream = config.stream
        settings = cluster.client_config(
            PRODUCER_DEFAULTS,
            {"client.id": f"bolide-pub-{self.stream.name}"},
            config.producer_config,
            {"transactional.id": config.transactional_id} if config.transactional_id else None,
            {"error_cb": self._on_client_error},
        )
        # Settings are checked when the client is built: a bad one fails before any topic work.
        self._producer = new_client(Producer, settings, "producer_config")
        self.partitions = ensure_topic(cluster, config.stream)
        self._txn = (
            Transactions(
                self._producer,
                config.transactional_id,
                self.stream.name,
                transaction_timeout_s=_transaction_timeout_s(settings),
            )
            if config.transactional_id
            else None
        )
        self.publisher_id = uuid.uuid4().hex
        group = config.group
        if config.auto_group:
            group = f"auto-{self.publisher_id}"
        self.group = group
        # Without a group, a multi-partition stream is keyed by publisher: its order holds.
        self._default_key = (
            group.encode()
            if group
            else (self.publisher_id.encode() if self.partitions > 1 else None)
        )
        self._group_key = group.encode() if group else None
        self._topic = self.stream.name
        # A serde that may put the schema id in a header makes whole records.
        self._framed = isinstance(config.serde, FramedSerde)
        # A single-partition stream names its partition; otherwise the key's partitioner picks.
        self._partition = 0 if self.partitions == 1 else PARTITION_UNASSIGNED
        self._closed = threading.Event()
        self._closing = False  # set once by close: records offered from then on are refused
        # Records handed to the producer and not yet resolved: close fails any left over.
        self._outstanding = Outstanding(self._topic, self._txn, config.transactional_id)
        # Held from a publish call's closing check until its records are in the producer; close
        # takes it once after setting ``_closing``, so each record is either refused or in the
        # producer before close flushes. Reentrant: a delivery callback served inside the
        # back-pressure wait may publish again. A lock costs a tenth of a condition and counter.
        self._gate = threading.RLock()
        self._close_once = threading.Lock()
        self._poller = threading.Thread(
            target=self._serve, name=f"bolide-pub-{self.stream.name}", daemon=True
        )
        self._poller.start()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                self._producer.poll(0.05)
            except KafkaException as exc:
                # A fatal error (a transactional publisher fenced, an idempotent one refused its
                # producer id): librdkafka fails what is queued, and every later call says why.
                err = exc.args[0]
                if self._txn is not None:
                    self._txn.error_for(err)
                self._on_client_error(err)

    def _on_client_error(self, err: KafkaError) -> None:
        """librdkafka's ``error_cb``: an answer retrying cannot fix (a missing ACL, refused
        credentials) fails the records still queued with its typed error, instead of leaving
        them to wait for an answer that never comes. Records already sent keep their own
        answers, so none accepted by the broker is reported lost."""
        if err.code() not in FATAL_CODES:
            # Others are retried by librdkafka, whose own log shows them.
            level = logging.ERROR if err.fatal() else logging.DEBUG
            log.log(level, "publisher for %r: %s", self._topic, err.str())
            return
        log.error("publisher for %r: %s", self._topic, err.str())
        self._outstanding.refused = err
        if not err.fatal():  # after a fatal error librdkafka fails the queue itself
            self._producer.purge(in_queue=True, in_flight=False, blocking=False)

    def to_record(self, item: Record | Any) -> Record:
        """The record ``publish_async(item)`` would send: its serde applied, a record shared
        by the process's subscribers copied (``PublisherLike``)."""
        if isinstance(item, Record):
            # Shared by the subscribers of the process: stamp a copy, not what they read.
            return unshared(item) if isinstance(item, SharedRecord) else item
        serde = self.config.serde
        if serde is None:
            if isinstance(item, bytes | bytearray | memoryview):
                return Record(bytes(item))
            raise TypeError(
                f"publish_async takes a Record (or bytes), not {type(item).__name__}; "
                "configure PublisherConfig(serde=...) to publish objects"
            )
        if self._framed:
            record: Record = serde.encode_record(item, stream=self.stream.name)
            return record
        return Record(serde.encode(item, stream=self.stream.name))

    def publish_async(
        self, record: Record | Any, callback: PublishCallback | None = None
    ) -> Future[int]:
        """Publish without blocking.

        Args:
            record: A ``Record``; bytes; or, with a serde, any object the serde encodes.
            callback: ``fn(offset, None)`` on success, ``fn(None, error)`` on failure.

        Returns:
            A future resolving to the record's offset, or failing with ``PublishError``.

        Raises:
            TypeError: ``record`` is neither a Record nor something the serde encodes.
            PublishError: The publisher is closed.
        """
        rec = record if type(record) is Record else self.to_record(record)
        # Already running (it cannot be cancelled), and its record's delivery report too.
        future = FutureDelivery(self._outstanding, rec, callback)
        with self._gate:
            if self._closing:
                raise self._refused(rec)
            # Tracked before produce: its report may be served on the poller thread at once.
            self._outstanding.add(future)
            self._send(rec, future)
        return future

    def produce(self, record: Record | Any, on_delivery: PublishCallback | None = None) -> None:
        """Publish without blocking and without a future: the cheapest path per record.

        Args:
            record: As for ``publish_async``.
            on_delivery: ``fn(offset, None)`` on success, ``fn(None, error)`` on failure
                (confluent-kafka's ``produce(..., on_delivery=...)``), called on the
                publisher's delivery thread; the record is stamped with its offset first.

        Raises:
            TypeError: ``record`` is neither a Record nor something the serde encodes.
            PublishError: The publisher is closed.
        """
        rec = record if type(record) is Record else self.to_record(record)
        with self._gate:
            if self._closing:
                raise self._refused(rec)
            delivery = Delivery(self._outstanding, rec, on_delivery)
            self._outstanding.add(delivery)
            self._send(rec, delivery)

    def offer(self, rec: Record, on_delivery: PublishCallback) -> bool:
        """``produce`` without waiting for room: ``False`` (nothing accepted) when the local
        queue is full, so that an asyncio caller waits for room on its loop instead
        (``PublisherLike``)."""
        with self._gate:
            if self._closing:
                raise self._refused(rec)
            delivery = Delivery(self._outstanding, rec, on_delivery)
            self._outstanding.add(delivery)
            if self._send(rec, delivery, wait=False):
                return True
            self._outstanding.discard(delivery)
            return False

    def publish_many(self, records: Iterable[Record | Any]) -> Future[list[int]]:
        """Publish a batch without blocking, with one future for the whole batch.

        Each record is stamped with its offset as its acknowledgement arrives. The future
        resolves to the offsets, in the order given, once every record is acknowledged; if any
        record fails, it fails with that record's ``PublishError`` once every record of the
        batch has its answer. Records keep their order, as with ``publish_async``.

        Raises:
            TypeError: A record is neither a Record nor something the serde encodes (nothing of
                the batch is published).
            PublishError: The publisher is closed (nothing of the batch is published).
        """
        recs = [r if type(r) is Record else self.to_record(r) for r in records]
        future: Future[list[int]] = Future()
        future.set_running_or_notify_cancel()  # running: it cannot be cancelled
        if not recs:
            future.set_result([])
            return future
        batch = Batch(self._outstanding, recs, future)
        with self._gate:
            if self._closing:
                raise self._refused(recs[0])
            self._outstanding.add(batch)
            # One produce_batch call where the batch allows it: no per-record Python call.
            messages = None
            spans = TELEMETRY is not None and TELEMETRY.live()
            if not spans and self.group is None:  # no send span, no group header
                messages = batch_messages(batch, self._topic, self._default_key, self._partition)
            if messages is None:
                for index, rec in enumerate(recs):
                    self._send(rec, partial(batch.report, index))
            else:
                send_batch(self._producer, self._topic, self._partition, messages, batch,
                           lambda: self._closing)  # fmt: skip
        return future

    def _refused(self, rec: Record) -> PublishError:
        """The error for a record offered once the publisher is closing."""
        return PublishError("publisher is closed", record=rec, stream=self._topic)

    def _send(
        self, rec: Record, report: Callable[[Any, Message | None], None], *, wait: bool = True
    ) -> bool:
        """Hand one record to the producer; ``report(err, msg)`` gets its answer (also a
        refusal: the record never reaches the producer). Without ``wait``, a full local queue
        returns ``False`` at once and the record is neither sent nor reported."""
        rec.stream = self._topic
        key = rec.key
        if key is None:
            key = self._default_key
        if rec.group is None and self.group is not None:
            rec.group = self.group
            key = self._group_key
        # Any: produce() types its headers as a list of (str, str | bytes | None) pairs.
        headers: Any = headers_or_none(rec)
        if rec.group is not None:
            # One group header, even for a record that was read and is published again.
            headers = [h for h in headers or () if h[0] != MESSAGE_GROUP_HEADER]
            headers.append((MESSAGE_GROUP_HEADER, rec.group.encode()))
        untaken: Callable[[], None] | None = None
        if TELEMETRY is not None and TELEMETRY.live():  # a send span; context in the headers
            headers, report, untaken = TELEMETRY.send(self._topic, rec, headers, report)
        partition = self._partition
        if rec.partition is not None and rec.offset is None:  # Record(..., partition=p)
            partition = rec.partition
            if partition >= self.partitions:
                report(f"partition {partition} does not exist ({self.partitions} partitions)", None)
                return True
        while True:
            try:
                self._producer.produce(
                    self._topic,
                    rec.data,
                    key,
                    partition=partition,
                    on_delivery=report,
                    headers=headers,
                )
                return True
            except BufferError:
                # Back-pressure: the local queue is full. Close ends the wait: the record was
                # never accepted, so it is refused like any record offered after close.
                if not wait:
                    if untaken is not None:
                        untaken()  # offered again later, in a span of its own
                    return False
                if self._closing:
                    report(REFUSED, None)
                    return True
                self._producer.poll(0.01)
            except KafkaException as exc:
                report(served(self._producer, exc.args[0]), None)
                return True
            except BaseException:
                if untaken is not None:
                    untaken()  # refused by the client (a bad argument): no span left open
                raise

    def publish(self, record: Record | Any, timeout_s: float | None = 30.0) -> int:
        """Publish and wait for the offset.

        Raises:
            PublishError: The broker did not accept the record.
            AuthorizationError: The user may not write the stream (the message names the ACL).
            AuthenticationError: The broker refused the cluster's credentials.
            TimeoutError: No answer within ``timeout_s``.
        """
        future = self.publish_async(record)
        self._producer.flush(0)
        return future.result(timeout_s)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """A Kafka transaction: begun on entry, committed on exit, aborted on an exception.

        What is published inside, and the positions ``confirm(sub)`` adds, become visible to
        ``read_committed`` subscribers together on commit, or never.

        Raises:
            TransactionError: The publisher is not transactional, a transaction is already
                open, or the commit failed (the transaction was aborted).
            TransactionInDoubtError: The commit got no answer within the transaction timeout
                (``transaction.timeout.ms``; a commit that timed out is asked again until
                then): it may have committed. Close the publisher.
            ProducerFencedError: A newer publisher with the same ``transactional_id`` started.
        """
        txn = self._transactions()
        txn.begin()
        try:
            yield
        except BaseException:
            try:
                txn.abort()
            except TransactionError as exc:
                log.warning("aborting the transaction on %r failed: %s", self._topic, exc)
            raise
        txn.commit()

    def confirm(self, subscriber: TransactionSource) -> None:
        """Send ``subscriber``'s delivered positions with the open transaction.

        They commit with it (Kafka's ``send_offsets_to_transaction``), so the input is
        confirmed exactly when the output becomes visible. A subscriber of several streams
        sends each stream's positions.

        Raises:
            TransactionError: No transaction is open, or the publisher is not transactional.
            IllegalSubscriberStateError: The subscriber is ungrouped, closed, or keeps its
                positions in the application's database.
            NotAssignedError: The subscriber lost a partition (a rebalance, or ``deactivate``)
                whose records it read and has not confirmed: their outputs in this transaction
                must not commit; let the block raise it, so the transaction aborts.
        """
        transactions = self._transactions()
        for source in subscriber.transaction_sources():
            transactions.confirm(source)

    def _transactions(self) -> Transactions:
        if self._txn is None:
            raise TransactionError(
                "publisher is not transactional: set PublisherConfig(transactional_id=...)",
                stream=self._topic,
            )
        return self._txn

    def flush(self, timeout_s: float = 10.0) -> int:
        """Wait until every record sent so far is acknowledged; return how many remain."""
        return int(self._producer.flush(timeout_s))

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush and stop; records still unacknowledged after ``timeout_s`` fail.

        When ``close`` returns, every future it accepted is resolved and every callback has
        been called once: a record the broker did not acknowledge within ``timeout_s`` is
        purged from the producer and fails with ``PublishError``. A ``publish_async`` racing
        ``close`` is either accepted before the flush or refused with ``PublishError``.
        """
        with self._close_once:
            if self._closing:
                return
            self._closing = True  # refuse new records first, so the flush below covers them all
        # Callers past the check are producing (or give up waiting for room): let them end.
        with self._gate:
            pass
        if self._txn is not None:
            self._txn.close()  # an open transaction is aborted: its records fail
        remaining = self._producer.flush(timeout_s)
        if remaining:
            log.warning(
                "publisher for %r closed with %d records unacknowledged; they fail",
                self.stream.name,
                remaining,
            )
            # Their delivery reports come with _PURGE_QUEUE or _PURGE_INFLIGHT.
            self._producer.purge(in_queue=True, in_flight=True, blocking=True)
        self._closed.set()
        self._poller.join()
        # Serve callbacks that arrived after the poller's last poll (the purged ones too).
        self._producer.poll(0)
        self._outstanding.fail_all()

    def __repr__(self) -> str:
        return f"Publisher(stream={self.stream.name!r}, group={self.group!r})"


def _transaction_timeout_s(settings: Mapping[str, Any]) -> float:
    """The producer's ``transaction.timeout.ms`` in seconds (librdkafka's default: 60 s)."""
    return int(settings.get("transaction.timeout.ms", 60_000)) / 1000
