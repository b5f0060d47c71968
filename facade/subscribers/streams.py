"""StreamsSubscriber: one subscriber over several streams, named (``SubscriberConfig(streams=
[...])``) or matched by a pattern (``pattern=r"orders\\..*"``), as a Kafka consumer subscribes
to several topics.

``StreamsSubscriber(cluster, config)`` builds one, as do ``new_subscriber`` and
``Subscriber(...)`` given a config that names no single stream. It holds one
``OneStreamSubscriber`` (what ``Subscriber`` is for one stream) per stream, all with the same
settings (and, when grouped, in the same consumer group: each stream's partitions are spread
over the members that read it), so every guarantee of a one-stream subscriber (positions, the
splice, confirms, rebalance hooks) holds per stream. ``poll`` takes turns over the streams; a
record's ``stream`` names its source. Receivers run one per stream, with the options given
(``concurrency`` is per stream).
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NoReturn, Unpack

from bolide.facade.config import Cluster, StreamConfig, SubscriberConfig
from bolide.facade.consumer.client import error_reporter, group_id
from bolide.facade.consumer.lifecycle import Lifecycle
from bolide.facade.consumer.membership import membership_of
from bolide.facade.errors import IllegalSubscriberStateError
from bolide.facade.health import Health
from bolide.facade.kafka import partition_counts
from bolide.facade.producer.transactions import OffsetSource
from bolide.facade.receiver import (
    AsyncRecordHandler,
    Receiver,
    ReceiverMetrics,
    RecordHandler,
)
from bolide.facade.receiving.parallel import ReceiverOptions
from bolide.facade.record import RecordBatch
from bolide.facade.subscribers.one_stream import OneStreamSubscriber
from bolide.facade.support import HookLock
from bolide.facade.validate import check_int

__all__ = ["StreamReceivers", "StreamsSubscriber"]

#: Longest wait on one stream's consumer in a turn while another stream may have records.
_TURN_MS = 50
#: librdkafka's default ``topic.metadata.refresh.interval.ms``: how often a pattern looks again.
_REFRESH_MS = 300_000


def matching(pattern: str, topics: Iterable[str], *, exclude: Iterable[str] = ()) -> list[str]:
    """The topics whose whole name matches ``pattern``, sorted; internal ``__`` topics and
    ``exclude`` (a dead-letter stream) are left out."""
    regex, left_out = re.compile(pattern), set(exclude)
    return sorted(
        t for t in topics if not t.startswith("__") and t not in left_out and regex.fullmatch(t)
    )


class StreamsSubscriber(Lifecycle):
    """Reads several streams as one subscriber (see the module docstring).

    Methods that act on one stream (``seek``, ``confirm(offset, ...)``, ``committed``) take
    ``stream=``, which is required when more than one stream is read; partitions given to
    ``pause``/``resume`` are ``(stream, partition)`` pairs.

    Args:
        cluster: Where the streams live.
        config: ``streams=`` or ``pattern=``, and the settings every stream is read with.

    Raises:
        ValueError: The config names one stream (``stream=``): that is a ``Subscriber``.
        StreamConfigMismatchError: A named stream's topic contradicts its config.
    """

    def __init__(self, cluster: Cluster, config: SubscriberConfig) -> None:
        super().__init__(cluster, config)
        if config.stream is not None:
            raise ValueError("this config reads one stream (stream=): read it with Subscriber")
        # In a group or not, chosen here once (each stream's subscriber chooses the same).
        self.membership = membership_of(config, group_id(config))
        self.group_id = self.membership.group_id
        # No lock of this subscriber's is held while a handler runs: reports run at once.
        self._report = error_reporter(config.error_handler, HookLock())
        self._guard = threading.Lock()  # the streams, the receivers, closing
        self._parts: dict[str, OneStreamSubscriber] = {}
        self._next = 0  # whose turn poll starts with
        self._receivers: StreamReceivers | None = None
        self._attach: Callable[[OneStreamSubscriber], Receiver] | None = None
        self._stop = threading.Event()
        # Nothing is delivered until every stream's member has joined the group (or a lease
        # timeout has passed; without a group, at once), so the joins of the members after the
        # first do not take back partitions whose records were delivered already.
        self._settle_until = time.monotonic() + config.lease_timeout_ms / 1000
        self._refresher: threading.Thread | None = None
        try:
            if config.streams is not None:
                for stream in config.streams:
                    self._open(stream)
            else:
                self._discover()
                self._refresher = threading.Thread(
                    target=self._refresh, name=f"bolide-pattern-{config.pattern}", daemon=True
                )
                self._refresher.start()
        except BaseException:
            self.close()
            raise

    # -- the streams --------------------------------------------------------------------------

    def _open(self, stream: StreamConfig) -> None:
        config = self.config
        one = dataclasses.replace(
            config,
            stream=stream,
            streams=None,
            pattern=None,
            on_assign=_pairs(config.on_assign, stream.name),
            on_revoke=_pairs(config.on_revoke, stream.name),
        )
        sub = OneStreamSubscriber(self.cluster, one)
        with self._guard:
            if self._closed:
                sub.close()
                return
            self._parts[stream.name] = sub
            attach = self._attach
        if attach is not None and self._receivers is not None:
            self._receivers.add(stream.name, attach(sub))

    def _discover(self) -> None:
        """Open a subscriber for each topic matching the pattern that has none yet."""
        pattern = self.config.pattern
        assert pattern is not None
        dead = self.config.dead_letter
        topics = partition_counts(self.cluster)
        for name in matching(pattern, topics, exclude=[dead.name] if dead else []):
            if name not in self._parts and not self._closed:
                self._open(StreamConfig(name=name))

    def _refresh(self) -> None:
        setting = self.config.consumer_config.get("topic.metadata.refresh.interval.ms")
        interval_ms = int(setting) if setting is not None else _REFRESH_MS
        if interval_ms <= 0:
            return  # librdkafka's -1: never look again
        while not self._stop.wait(interval_ms / 1000):
            try:
                self._discover()
            except Exception as exc:
                self._report(f"looking for topics matching {self.config.pattern!r} failed", exc)

    def _inner(self, stream: str | None) -> OneStreamSubscriber:
        parts = self._parts
        if stream is None:
            if len(parts) == 1:
                return next(iter(parts.values()))
            raise ValueError(f"name the stream: this subscriber reads {sorted(parts)}")
        sub = parts.get(stream)
        if sub is None:
            raise ValueError(f"{stream!r} is not one of this subscriber's streams {sorted(parts)}")
        return sub

    def _all(self) -> list[OneStreamSubscriber]:
        with self._guard:
            return list(self._parts.values())

    @property
    def streams(self) -> tuple[str, ...]:
        """The names of the streams read (a pattern's grow as matching topics appear)."""
        return tuple(self._parts)

    if not TYPE_CHECKING:  # to a type checker these names simply do not exist here

        def __getattr__(self, name: str) -> NoReturn:
            if name in ("stream", "topic", "partitions"):
                raise AttributeError(
                    f"a subscriber of several streams has no single {name!r}: see .streams"
                )
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- reading ------------------------------------------------------------------------------

    def poll(self, timeout_ms: int) -> RecordBatch:
        """Read the next records of one stream, each stream in turn, waiting at most
        ``timeout_ms`` for the first one (up to ``max_batch`` records, all of one stream)."""
        check_int("timeout_ms", timeout_ms)
        self._check_open()
        deadline = time.monotonic() + timeout_ms / 1000
        if self._settle_until and not self._settle(deadline):
            return RecordBatch()
        wait_ms = 0  # the first turn takes what is there already
        while True:
            parts = self._all()
            n = len(parts)
            for i in range(n):
                if self._closed:
                    return RecordBatch()
                k = (self._next + i) % n
                left_ms = max(0, int((deadline - time.monotonic()) * 1000))
                try:
                    batch = parts[k].poll(min(wait_ms, left_ms))
                except IllegalSubscriberStateError:
                    if self._closed:
                        return RecordBatch()  # closed by another thread while waiting
                    raise
                if batch:
                    self._next = (k + 1) % n
                    return batch
            left_s = deadline - time.monotonic()
            if left_s <= 0 or self._closed:
                return RecordBatch()
            if not n:  # a pattern nothing matches yet
                self._stop.wait(min(left_s, _TURN_MS / 1000))
            wait_ms = max(1, _TURN_MS // max(n, 1))

    def _settle(self, deadline: float) -> bool:
        """Serve the members' joins until each has joined; False if ``deadline`` came first."""
        while True:
            parts = self._all()
            for sub in parts:
                sub.is_assigned()  # serves the join; what is read waits for the next poll
            now = time.monotonic()
            if all(sub.joined for sub in parts) or now >= self._settle_until:
                self._settle_until = 0.0
                return True
            if now >= deadline or self._closed:
                return False
            self._stop.wait(min(deadline - now, 0.02))

    def seek(self, offset: int, partition: int | None = None, stream: str | None = None) -> None:
        """Move to ``offset`` on ``partition`` of ``stream`` (ungrouped only)."""
        self._check_open()
        self._inner(stream).seek(offset, partition)

    def seek_to_time(
        self, timestamp_ms: int, partition: int | None = None, stream: str | None = None
    ) -> None:
        """Move to the first record at or after ``timestamp_ms`` (ungrouped only): on
        ``partition`` of ``stream``, on every partition of ``stream``, or of every stream."""
        self._check_open()
        self.membership.needs_no_group("seek_to_time is for ungrouped subscribers only")
        check_int("timestamp_ms", timestamp_ms)
        if stream is None and partition is None:
            for sub in self._all():
                sub.seek_to_time(timestamp_ms)
        else:
            self._inner(stream).seek_to_time(timestamp_ms, partition)

    def pause(self, partitions: Iterable[int | tuple[str, int]] | None = None) -> None:
        """Stop delivering ``partitions`` (``(stream, partition)`` pairs; every held one when
        ``None``) until ``resume``, keeping the lease."""
        self._check_open()
        for sub, parts in self._by_stream(partitions):
            sub.pause(parts)

    def resume(self, partitions: Iterable[int | tuple[str, int]] | None = None) -> None:
        """Deliver paused ``partitions`` (every paused one when ``None``) again."""
        self._check_open()
        for sub, parts in self._by_stream(partitions):
            sub.resume(parts)

    @property
    def paused(self) -> frozenset[tuple[str, int]]:
        """The paused partitions, as ``(stream, partition)`` pairs."""
        return frozenset().union(*(sub.paused for sub in self._all()))

    def _by_stream(
        self, partitions: Iterable[int | tuple[str, int]] | None
    ) -> list[tuple[OneStreamSubscriber, list[int] | None]]:
        if partitions is None:
            return [(sub, None) for sub in self._all()]
        if isinstance(partitions, int | tuple):
            raise TypeError("partitions must be an iterable of partitions (a list), or None")
        by_stream: dict[str, list[int]] = {}
        for item in partitions:
            if isinstance(item, tuple):
                stream, part = item
                sub = self._inner(stream)
            else:
                sub, part = self._inner(None), item  # one stream: a number will do
            by_stream.setdefault(sub.topic, []).append(part)
        return [(self._inner(name), parts) for name, parts in by_stream.items()]

    # -- confirms ------------------------------------------------------------------------------

    def confirm(
        self,
        offset: int | None = None,
        partition: int | None = None,
        *,
        stream: str | None = None,
        conn: Any = None,
    ) -> None:
        """Confirm what ``poll`` returned on every stream (``offset=None``), or on ``stream``,
        or up to ``offset`` on ``partition`` of ``stream``; see ``Subscriber.confirm``. With
        ``conn``, every stream's positions are written in that one transaction."""
        self._check_open()
        if offset is None and stream is None:
            if conn is None:
                self.membership.needs_group("confirm is for grouped subscribers only")
            for sub in self._all():
                sub.confirm(conn=conn)
        else:
            self._inner(stream).confirm(offset, partition, conn=conn)

    def committed(
        self, timeout_s: float = 10.0, *, stream: str | None = None
    ) -> dict[int, int | None]:
        """The group's confirmed positions per partition of ``stream``."""
        return self._inner(stream).committed(timeout_s)

    def transaction_sources(self) -> list[OffsetSource]:
        """Each stream's consumer's source (``Subscriber.transaction_sources``)."""
        return [source for sub in self._all() for source in sub.transaction_sources()]

    # -- the lease -----------------------------------------------------------------------------

    def is_assigned(self) -> bool:
        """True when this subscriber holds partitions of any of its streams (always true when
        ungrouped)."""
        # Each serves its group: every one is called.
        return self.membership.assigned(lambda: any([s.is_assigned() for s in self._all()]))

    def deactivate(self) -> None:
        """Give up the lease on every stream (grouped only)."""
        self.membership.needs_group("deactivate is for grouped subscribers only")
        for sub in self._all():
            sub.deactivate()

    def reactivate(self) -> None:
        """Seek the lease again on every stream (grouped only)."""
        self.membership.needs_group("reactivate is for grouped subscribers only")
        for sub in self._all():
            sub.reactivate()

    def health(self, *, lag: bool = True) -> Health:
        """One ``Health`` over every stream read."""
        each = [sub.health(lag=lag) for sub in self._all()]
        polls = [h.last_poll_ms for h in each if h.last_poll_ms is not None]
        return Health(
            kind="subscriber",
            group=self.membership.group,
            streams=self.streams,
            closed=self._closed,
            lease_held=any(h.lease_held for h in each),
            partitions=tuple(p for h in each for p in h.partitions),
            last_poll_ms=max(polls) if polls else None,
            checked_ms=max((h.checked_ms for h in each), default=int(time.time() * 1000)),
        )

    # -- receivers, errors, lifecycle ----------------------------------------------------------

    def attach_receiver(
        self,
        handler: RecordHandler | AsyncRecordHandler,
        poll_timeout_ms: int = 100,
        **options: Unpack[ReceiverOptions],
    ) -> Receiver:
        """Start one receiver per stream with these options (``concurrency``,
        ``max_in_flight`` are per stream), returned as one ``StreamReceivers``; a stream a
        pattern finds later gets its own too.

        Raises:
            ReceiverAlreadyAttachedError: A receiver is already attached.
            ValueError: A ``resequencer``: it orders one stream.
        """
        if options.get("resequencer") is not None:
            raise ValueError("a resequencer orders one stream: use one subscriber per stream")
        check_int("poll_timeout_ms", poll_timeout_ms)
        with self._guard:
            self._check_no_receiver()
            receiver = self._receiver = self._receivers = StreamReceivers()

            def attach(sub: OneStreamSubscriber) -> Receiver:
                return sub.attach_receiver(handler, poll_timeout_ms, **options)

            self._attach = attach
            parts = list(self._parts.items())
        try:
            for name, sub in parts:
                receiver.add(name, attach(sub))
        except BaseException:
            receiver.close()
            raise
        return receiver

    def close(self, keep_alive: bool = True) -> None:
        """Stop the receivers, stop looking for matching topics and close every stream's
        subscriber (``keep_alive`` as ``Subscriber.close`` takes it)."""
        with self._guard:
            if self._closed:
                return
            self._closed = True
            parts = list(self._parts.values())
        self._stop.set()
        refresher = self._refresher
        if refresher is not None and refresher is not threading.current_thread():
            refresher.join()
        first: BaseException | None = None
        for sub in parts:
            try:
                sub.close(keep_alive)
            except BaseException as exc:  # close the others, then say what went wrong
                first = first or exc
        if first is not None:
            raise first

    def __repr__(self) -> str:
        pattern = self.config.pattern
        source = f"pattern={pattern!r}" if pattern else f"streams={list(self._parts)}"
        return f"Subscriber({source}, {self.membership.label()})"


class StreamReceivers(Receiver):
    """The receivers of a ``StreamsSubscriber``, one per stream, as one ``Receiver``."""

    def __init__(self) -> None:  # no thread of its own: each stream's receiver has one
        self._lock = threading.Lock()
        self._each: dict[str, Receiver] = {}
        self._closing = False

    def add(self, stream: str, receiver: Receiver) -> None:
        """Hold ``stream``'s receiver (closed at once when this one is closing)."""
        with self._lock:
            self._each[stream] = receiver
            closing = self._closing
        if closing:
            receiver.close()

    @property
    def receivers(self) -> dict[str, Receiver]:
        """Each stream's receiver (its ``metrics()`` has the per-partition detail)."""
        with self._lock:
            return dict(self._each)

    def start(self) -> None:
        """Nothing to do: each stream's receiver started when it was attached."""

    @property
    def running(self) -> bool:
        """True while any stream's receiver runs."""
        return not self._closing and any(r.running for r in self.receivers.values())

    def metrics(self) -> ReceiverMetrics:
        """The counters summed over the streams (``confirmed`` and ``safe`` are per stream:
        see ``receivers``)."""
        each = [r.metrics() for r in self.receivers.values()]
        return ReceiverMetrics(
            in_flight=sum(m.in_flight for m in each),
            finished=sum(m.finished for m in each),
            retried=sum(m.retried for m in each),
            dead_lettered=sum(m.dead_lettered for m in each),
            failed=sum(m.failed for m in each),
            abandoned=sum(m.abandoned for m in each),
            paused=any(m.paused for m in each),
        )

    def close(self, timeout_s: float | None = None) -> None:
        """Close every stream's receiver, sharing ``timeout_s`` among them."""
        with self._lock:
            self._closing = True
            each = list(self._each.values())
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for receiver in each:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            receiver.close(left)


def _pairs(
    hook: Callable[[list[Any]], None] | None, stream: str
) -> Callable[[list[Any]], None] | None:
    """A rebalance hook of a several-stream config, given ``(stream, partition)`` pairs."""
    if hook is None:
        return None
    return lambda parts: hook([(stream, p) for p in parts])
