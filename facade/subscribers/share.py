"""ShareSubscriber: a stream read as a queue, in a Kafka share group (KIP-932, Apache Kafka 4.1+).

``ShareSubscriber(cluster, SubscriberConfig(stream=s, share_group="workers"))`` builds one, as do
``new_subscriber`` and ``Subscriber(...)`` given that config. Unlike a
consumer group, where a partition feeds one member, every member of a share group acquires
records of every partition, so a one-partition stream feeds as many workers as join. Each
record polled is *acquired* by this member until it is settled: ``ack`` (done, never delivered
again), ``release`` (delivered again at once, maybe to another member) or ``reject`` (never
delivered again; dead-lettered when ``SubscriberConfig(dead_letter=...)`` is set). A member
that dies or stops polling holds its records only until their lock expires (the group's
``share.record.lock.duration.ms``); then other members get them, with ``delivery_count`` one
higher. There is no key order across members (docs/queues.md).

The records of one poll must all be settled before the next poll (Kafka's explicit
acknowledgement); ``confirm()`` acks every one not settled yet.

A share group member is not a consumer group member: it has no position of its own, so it has
no ``seek``, ``pause``, ``committed``, ``deactivate`` or transactions. Code written for a
``Subscriber`` that calls one gets ``NotForThisKindError`` (an ``IllegalSubscriberStateError``
and an ``AttributeError``) saying why.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, NoReturn, Unpack, cast

from confluent_kafka import (
    AcknowledgeType,
    IllegalStateException,
    KafkaError,
    KafkaException,
    Message,
    ShareConsumer,
)

from bolide.facade.config import Cluster, SubscriberConfig
from bolide.facade.consumer.client import error_reporter
from bolide.facade.consumer.decoding import Decoder
from bolide.facade.consumer.lifecycle import Lifecycle
from bolide.facade.consumer.membership import NoGroup
from bolide.facade.consumer.share_group import configure_group, require_share_groups
from bolide.facade.deadletter import LetterBox, Reason
from bolide.facade.errors import (
    BrokerError,
    IllegalSubscriberStateError,
    NotForThisKindError,
)
from bolide.facade.health import Health, measure
from bolide.facade.kafka import CONSUMER_DEFAULTS, ensure_topic, new_client
from bolide.facade.receiver import AsyncRecordHandler, Receiver, RecordHandler
from bolide.facade.receiving.parallel import ReceiverOptions
from bolide.facade.receiving.share import ShareReceiver
from bolide.facade.record import Record, RecordBatch, record_from_message
from bolide.facade.support import HookLock
from bolide.facade.telemetry import TELEMETRY
from bolide.facade.validate import check_int

__all__ = ["ShareSubscriber"]

_SLICE_S = 0.1  # longest wait of one consumer poll while holding the lock
#: Consumer defaults a share consumer refuses ("not applicable for share consumer").
_GROUP_ONLY = ("enable.auto.commit", "enable.auto.offset.store", "fetch.queue.backoff.ms")
_Key = tuple[str, int, int]
_NO_POSITION = (
    "records are acquired and acknowledged one by one, with no position of this member's own"
)
#: What a consumer group subscriber has and a share group member has not, and why.
_NOT_HERE = {
    "seek": _NO_POSITION,
    "seek_to_time": _NO_POSITION,
    "committed": "no position per member",
    "deactivate": "close to leave",
    "reactivate": "close to leave, and build a new member to join again",
    "pause": "stop polling instead",
    "resume": "stop polling instead",
    "paused": "stop polling instead",
    "transaction_sources": "acknowledgements are not part of Kafka transactions",
    "durable": "a share group member is not a durable client",
    "marker": "a share group member is not a durable client",
}


class ShareSubscriber(Lifecycle):
    """Reads one stream as a queue in a share group (see the module docstring).

    Args:
        cluster: Where the stream lives.
        config: The stream, ``share_group`` and the other settings.

    Raises:
        TypeError: The config names no share group.
        BrokerError: The cluster has no share groups (the message says what is missing).
        ValueError: A ``share_group_config`` setting the broker refused.
    """

    def __init__(self, cluster: Cluster, config: SubscriberConfig) -> None:
        super().__init__(cluster, config)
        if config.share_group is None:
            raise TypeError("config must be a SubscriberConfig with share_group")
        self.stream = config.single
        self.topic = self.stream.name
        # Not in a consumer group: nothing is assigned, nothing committed, none reported.
        self.membership = NoGroup(config.share_group)
        self.share_group = self.group_id = config.share_group
        self._share_lock = threading.Lock()  # a share consumer takes one call at a time
        # Reports run at once: a share subscriber calls no user code under its own lock.
        self._report = error_reporter(config.error_handler, HookLock())
        self._queue: deque[Record] = deque()  # acquired, not yet returned by poll
        self._held: dict[_Key, Record] = {}  # returned by poll, not yet settled
        self._last_poll_ms: int | None = None
        letters = config.dead_letter
        self._letters = None if letters is None else LetterBox(cluster, letters)
        require_share_groups(cluster)
        self.partitions = ensure_topic(cluster, self.stream)
        #: The group's delivery limit and record lock, as the broker has them.
        self.group_settings = configure_group(cluster, config)
        self._decoder = Decoder(cluster, config) if config.serde is not None else None
        self._share = new_client(ShareConsumer, self._settings(), "consumer_config")
        try:
            self._share.set_acknowledgement_commit_callback(self._on_acknowledged)
            self._share.subscribe([self.topic])
        except BaseException:
            self._share.close()
            raise
        if TELEMETRY is not None:
            TELEMETRY.watch(self)

    def _settings(self) -> dict[str, Any]:
        defaults = {k: v for k, v in CONSUMER_DEFAULTS.items() if k not in _GROUP_ONLY}
        own = {
            "group.id": self.share_group,
            "client.id": f"bolide-share-{self.topic}",
            "share.acknowledgement.mode": "explicit",
            # Records acquired per fetch: what one member holds at a time, so that the others
            # get the rest.
            "max.poll.records": self.config.max_batch,
        }
        return self.cluster.client_config(defaults, own, self.config.consumer_config)

    # -- reading -------------------------------------------------------------------------

    def poll(self, timeout_ms: int) -> RecordBatch:
        """Acquire the next records, waiting at most ``timeout_ms`` for the first one; up to
        ``max_batch`` records.

        Raises:
            IllegalSubscriberStateError: Records of the previous poll are not settled yet, or
                the subscriber is closed.
            SerializationError: A record the serde cannot decode, with no dead letter stream
                (the record is released: delivered again until the group's delivery limit);
                or a retriable failure (the registry unreachable): the record stays acquired
                here and the next poll decodes it again. Either way the records decoded
                before it come with the next poll.
            PublishError: The dead letter of an undecodable record was not published: it
                stays acquired here, and the next poll tries again.
        """
        check_int("timeout_ms", timeout_ms)
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            with self._share_lock:
                self._check_open()
                if not self._queue:
                    if self._held:
                        raise IllegalSubscriberStateError(
                            f"{len(self._held)} records of the previous poll are not settled: "
                            "ack, release or reject each (or confirm()) before polling again",
                            stream=self.topic,
                        )
                    wait = max(0.0, min(deadline - time.monotonic(), _SLICE_S))
                    self._fetch(wait)
                batch = self._take()
            if batch or time.monotonic() >= deadline:
                if batch and TELEMETRY is not None:
                    TELEMETRY.delivered(self, batch)
                return batch

    def _fetch(self, timeout_s: float) -> None:
        # The stubs say Message | None; a share consumer's poll returns a list of them.
        messages = cast(list[Message], self._share.poll(timeout_s))
        self._last_poll_ms = int(time.time() * 1000)
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                if err.fatal():
                    raise BrokerError(f"share consumer failed: {err.str()}", stream=self.topic)
                self._report(f"share consumer on {self.topic}: {err.str()}", None)
                continue
            record = record_from_message(msg, self.topic)
            record.delivery_count = msg.delivery_count()
            self._queue.append(record)

    def _take(self) -> RecordBatch:
        """Up to ``max_batch`` queued records, decoded, now held by the application.

        A failure leaves every record not settled acquired and queued, in order: the records
        decoded before it and the one that failed come back with the next poll.
        """
        out: list[Record] = []
        try:
            while self._queue and len(out) < self.config.max_batch:
                record = self._queue[0]
                if self._decoder is None or self._decoded(record):
                    out.append(self._queue.popleft())
        except BaseException:
            self._queue.extendleft(reversed(out))
            raise
        for record in out:
            self._held[_key(record)] = record
        return RecordBatch(out)

    def _decoded(self, record: Record) -> bool:
        """Decode ``record``, the first queued; ``False`` when it could not be and went to
        the dead letter stream (rejected). Without one it is released and its error raised.

        A retriable failure (the registry unreachable) and a dead letter that was not
        published raise with ``record`` still queued and acquired: the next poll tries it
        again, its ``delivery_count`` unchanged.
        """
        assert self._decoder is not None
        failure = self._decoder.decode(record)
        if failure is None:
            return True
        if self.config.dead_letter is not None:
            self._dead_letter(record, Reason.UNDECODABLE, str(failure))
        self._queue.popleft()
        if self.config.dead_letter is None:
            self._settle(_key(record), AcknowledgeType.RELEASE)
            raise failure
        self._settle(_key(record), AcknowledgeType.REJECT)
        return False

    # -- settling ----------------------------------------------------------------------

    def ack(self, record: Record) -> None:
        """Done with ``record``: it is never delivered again.

        Raises:
            IllegalSubscriberStateError: ``record`` is not held by this subscriber (never
                polled here, settled already, or the subscriber is closed).
        """
        self._settle_one(record, AcknowledgeType.ACCEPT)

    def release(self, record: Record) -> None:
        """Give ``record`` back now: it is delivered again (maybe to another member), with a
        higher ``delivery_count``, until the group's ``share.delivery.count.limit``.

        Raises:
            IllegalSubscriberStateError: ``record`` is not held by this subscriber.
        """
        self._settle_one(record, AcknowledgeType.RELEASE)

    def reject(self, record: Record, detail: str = "rejected by the application") -> None:
        """``record`` cannot be processed: it is never delivered again. With
        ``SubscriberConfig(dead_letter=...)`` it goes there first, with ``bolide.reason``
        ``rejected``, ``detail`` and its source.

        Raises:
            IllegalSubscriberStateError: ``record`` is not held by this subscriber.
            PublishError: The dead letter was not published (the record stays held).
        """
        self._check_held(record)
        if self.config.dead_letter is not None:
            self._dead_letter(record, Reason.REJECTED, detail)
        self._settle_one(record, AcknowledgeType.REJECT)

    def confirm(self, *args: Any, **kwargs: Any) -> None:
        """Ack every record polled and not settled yet, and wait until the broker has them.

        Raises:
            IllegalSubscriberStateError: The subscriber is closed, or arguments were given (a
                share group confirms records, not offsets: ``ack`` one by one).
        """
        if args or kwargs:
            raise IllegalSubscriberStateError(
                "a share group confirms records, not offsets: use ack(record)", stream=self.topic
            )
        with self._share_lock:
            self._check_open()
            for key in list(self._held):
                self._settle(key, AcknowledgeType.ACCEPT)
            self._commit_sync()

    def _check_held(self, record: Record) -> _Key:
        if not isinstance(record, Record):
            raise TypeError(f"record must be a Record, not {type(record).__name__}")
        key = _key(record)
        if key not in self._held:
            raise IllegalSubscriberStateError(
                f"{record!r} is not held by this subscriber (never polled here, or settled)",
                stream=self.topic,
            )
        return key

    def _settle_one(self, record: Record, kind: AcknowledgeType) -> None:
        with self._share_lock:
            self._check_open()
            self._settle(self._check_held(record), kind)

    def _settle(self, key: _Key, kind: AcknowledgeType) -> None:
        """Acknowledge one acquired record (under the lock), held by the application or
        still queued; it is held no more. The acknowledgements go to the broker with the
        next poll (which asks for the next records in the same request), with
        ``confirm()``, or on ``close()``."""
        stream, partition, offset = key
        try:
            self._share.acknowledge_offset(stream, partition, offset, kind)
        except IllegalStateException as exc:
            self._held.pop(key, None)
            raise IllegalSubscriberStateError(
                f"{stream}[{partition}] offset {offset} is no longer acquired here (its lock "
                f"expired: another member may have it): {exc}",
                stream=stream,
            ) from exc
        self._held.pop(key, None)

    def _commit_sync(self) -> None:
        try:
            self._share.commit_sync(30.0)
        except KafkaException as exc:
            self._report(f"acknowledging records of {self.topic} failed", exc)

    def _on_acknowledged(self, offsets: Any, error: KafkaException | None) -> None:
        if error is not None:
            self._report(f"acknowledging records of {self.topic} failed", error)

    def _dead_letter(self, record: Record, reason: Reason, detail: str) -> None:
        """Publish ``record``'s dead letter (undecodable or rejected records alike) to the
        ``dead_letter`` stream."""
        assert self._letters is not None
        self._letters.post(record, reason, detail)

    # -- what does not apply to a queue ----------------------------------------------

    if not TYPE_CHECKING:  # to a type checker these names simply do not exist here

        def __getattr__(self, name: str) -> NoReturn:
            why = _NOT_HERE.get(name)
            if why is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            what = "Publisher.confirm(subscriber)" if name == "transaction_sources" else name
            raise NotForThisKindError(
                f"{what} does not apply to a share group: {why}", stream=self.topic
            )

    # -- receiver, state, lifecycle --------------------------------------------------

    def attach_receiver(
        self,
        handler: RecordHandler | AsyncRecordHandler,
        poll_timeout_ms: int = 100,
        **options: Unpack[ReceiverOptions],
    ) -> Receiver:
        """Start a ``ShareReceiver``: ``concurrency`` handler calls at once, each record
        acked when its handler returns; ``retry`` and ``dead_letter`` as for any receiver (a
        record given up is rejected after its dead letter, else released). ``ordering`` can
        only be ``"unordered"``; ``resequencer`` does not apply.

        Raises:
            ReceiverAlreadyAttachedError: A receiver is already attached.
        """
        with self._share_lock:
            self._check_no_receiver()
            receiver = ShareReceiver(self, handler, poll_timeout_ms, **options)
            self._receiver = receiver
            receiver.start()
        return receiver

    def report(self, summary: str, error: BaseException | None) -> None:
        """Tell the error handler (or the log)."""
        self._report(summary, error)

    def is_assigned(self) -> bool:
        """True while open: every member of a share group reads every partition."""
        return not self._closed

    @property
    def joined(self) -> bool:
        """True while open."""
        return not self._closed

    @property
    def held(self) -> int:
        """Records this subscriber holds: polled and not settled, or acquired and queued."""
        return len(self._held) + len(self._queue)

    def health(self, *, lag: bool = True) -> Health:
        """Open or closed, and the last poll (a share group has no per-member lag)."""
        return measure(self.cluster, "share subscriber", self.share_group, (self.topic,), {},
                       closed=self._closed, last_poll_ms=self._last_poll_ms, lag=False)  # fmt: skip

    @property
    def streams(self) -> tuple[str, ...]:
        """The name of the stream read, as ``Subscriber.streams`` gives it."""
        return (self.topic,)

    def close(self, keep_alive: bool = True) -> None:
        """Stop the receiver, release every record still held (other members get them at
        once, not after their lock) and leave the share group."""
        self._stop_receiver()
        with self._share_lock:
            if self._closed:
                return
            self._closed = True
            try:
                for record in [*self._held.values(), *self._queue]:
                    with contextlib.suppress(IllegalSubscriberStateError):  # its lock expired
                        self._settle(_key(record), AcknowledgeType.RELEASE)
                self._queue.clear()
            finally:
                try:
                    self._share.close()
                finally:
                    if self._decoder is not None:
                        self._decoder.close()
                    if self._letters is not None:
                        self._letters.close()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ShareSubscriber(stream={self.topic!r}, share_group={self.share_group!r})"


def _key(record: Record) -> _Key:
    return (str(record.stream), int(record.partition or 0), int(record.offset or 0))
