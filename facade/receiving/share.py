"""ShareReceiver: a share group's receiver. It polls the share subscriber and runs the handler on
up to ``concurrency`` records at once; each record is acknowledged on its own when its handler
returns, so a slow record holds only itself (other members, and this one's other workers, go
on). A failure is retried per ``Retry``; a record given up goes to the receiver's dead letter
and is rejected, or without one is released: the group delivers it again (maybe to another
member) until its ``share.delivery.count.limit``. Its last delivery, given up, goes to the
subscriber's ``dead_letter`` stream when it has one (rejected, with why), else the group
archives it.

Kafka's explicit acknowledgement wants every record of a poll settled before the next poll, so
the receiver polls again once the batch in hand is settled.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Protocol, cast

from bolide.facade.config import StreamConfig, SubscriberConfig
from bolide.facade.consumer.share_group import GroupSettings
from bolide.facade.deadletter import DeadLetterSink, DeadLetterTarget, Reason, check_dead_letter
from bolide.facade.errors import IllegalSubscriberStateError
from bolide.facade.receiver import (
    AsyncRecordHandler,
    Member,
    Receiver,
    ReceiverMetrics,
    RecordHandler,
)
from bolide.facade.record import Record, RecordBatch
from bolide.facade.retry import Retry
from bolide.facade.telemetry import TELEMETRY
from bolide.facade.validate import check_int

__all__ = ["ShareHost", "ShareReceiver"]

log = logging.getLogger("bolide.facade.share_receiver")

_STOP_CHECK_MS = 100


class ShareHost(Protocol):
    """What a share receiver sees of its subscriber (``ShareSubscriber``)."""

    topic: str
    stream: StreamConfig
    config: SubscriberConfig
    group_id: str
    group_settings: GroupSettings

    @property
    def membership(self) -> Member:
        """Not a consumer group's (telemetry reports no group)."""
        ...

    @property
    def closed(self) -> bool:
        """True once the subscriber is closed."""
        ...

    def poll(self, timeout_ms: int) -> RecordBatch:
        """Acquire records."""
        ...

    def ack(self, record: Record) -> None:
        """Done with ``record``."""
        ...

    def release(self, record: Record) -> None:
        """Deliver ``record`` again."""
        ...

    def reject(self, record: Record, detail: str = ...) -> None:
        """Never deliver ``record`` again."""
        ...

    def report(self, summary: str, error: BaseException | None) -> None:
        """Tell the error handler (or the log)."""
        ...


class ShareReceiver(Receiver):
    """Runs ``handler`` on a share group's records, ``concurrency`` at a time (see the module
    docstring). Built by ``ShareSubscriber.attach_receiver``.

    It has a ``Receiver``'s interface (``start``, ``running``, ``metrics``, ``close``) but not
    its seam: a share subscriber has no partitions held, positions or confirms to share.

    Raises:
        TypeError, ValueError: A bad option, or one that does not apply to a share group
            (``ordering`` other than ``"unordered"``, ``auto_confirm=False``, a
            ``resequencer``).
    """

    def __init__(
        self,
        host: ShareHost,
        handler: RecordHandler | AsyncRecordHandler,
        poll_timeout_ms: int,
        *,
        concurrency: int = 1,
        ordering: str = "unordered",
        retry: Retry | None = None,
        dead_letter: DeadLetterTarget | None = None,
        auto_confirm: bool = True,
        max_in_flight: int = 10_000,
        resequencer: object = None,
    ) -> None:
        _check(handler, concurrency, ordering, retry, dead_letter, auto_confirm, resequencer)
        check_int("poll_timeout_ms", poll_timeout_ms)
        check_int("max_in_flight", max_in_flight, minimum=1)
        self._share = host
        self._call = _caller(host, handler)
        self._poll_timeout_ms = poll_timeout_ms
        self._concurrency = concurrency
        self._retry = retry if retry is not None else Retry(attempts=1)
        self._dead_letter = None if dead_letter is None else DeadLetterSink(dead_letter)
        self._stop = threading.Event()
        self._deadline = math.inf  # of close: records not started by then are released
        self._counts_lock = threading.Lock()
        self._counts = {"in_flight": 0, "finished": 0, "retried": 0, "dead": 0, "failed": 0}
        name = f"bolide-share-receiver-{host.stream.name}"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        host = self._share
        name = f"bolide-share-worker-{host.stream.name}"
        pool = ThreadPoolExecutor(max_workers=self._concurrency, thread_name_prefix=name)
        try:
            while not self._stop.is_set():
                try:
                    batch = host.poll(min(self._poll_timeout_ms, _STOP_CHECK_MS))
                except Exception as exc:
                    if self._stop.is_set() or host.closed:
                        return
                    host.report("share receiver poll failed", exc)
                    self._stop.wait(max(self._poll_timeout_ms / 1000, 0.1))
                    continue
                if batch:
                    self._count("in_flight", len(batch))
                    self._settle_batch({pool.submit(self._handle, r): r for r in batch})
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _settle_batch(self, futures: dict[Future[None], Record]) -> None:
        """Wait for a batch's records; once closing is past its deadline, release those not
        started (a running handler cannot be stopped: its outcome still settles its record)."""
        pending = set(futures)
        while pending:
            _, pending = wait(pending, timeout=_STOP_CHECK_MS / 1000, return_when=FIRST_COMPLETED)
            if pending and self._stop.is_set() and time.monotonic() >= self._deadline:
                for future in pending:
                    if future.cancel():
                        self._count("in_flight", -1)
                        self._settle(self._share.release, futures[future])
                return

    def _handle(self, record: Record) -> None:
        attempt = 0
        try:
            while True:
                try:
                    self._call(record)
                except Exception as exc:
                    attempt += 1
                    if attempt < self._retry.attempts and not self._stop.is_set():
                        self._count("retried", 1)
                        self._stop.wait(self._retry.delay(attempt))
                        continue
                    self._give_up(record, exc)
                    return
                self._settle(self._share.ack, record)
                self._count("finished", 1)
                return
        except BaseException as exc:  # a handler's BaseException: give the record back
            self._settle(self._share.release, record)
            self._share.report(f"share receiver handler raised {type(exc).__name__}", exc)
            raise
        finally:
            self._count("in_flight", -1)

    def _give_up(self, record: Record, error: Exception) -> None:
        """The last attempt failed: dead letter and reject, or release without a dead letter."""
        host, sink = self._share, self._dead_letter
        detail = f"{type(error).__name__}: {error}"
        limit = host.group_settings.delivery_limit
        if sink is None and (record.delivery_count or 1) >= limit and host.config.dead_letter:
            # The group would archive it unseen: the subscriber's dead letter gets it instead.
            self._count("dead", 1)
            why = f"delivery {record.delivery_count} of {limit} failed: {detail}"
            self._settle(lambda r: host.reject(r, why), record)
            return
        if sink is None:
            self._count("failed", 1)
            log.warning("share receiver gave %r up: %s", record, detail)
            host.report(f"share receiver handler raised on {record!r}", error)
            self._settle(host.release, record)
            return
        source = f"{record.stream}/{record.partition}/{record.offset}"
        try:
            sink.send(record, error, reason=Reason.FAILED, detail=detail, source=source)
        except Exception as exc:
            self._count("failed", 1)
            host.report(f"dead letter of {record!r} failed; released", exc)
            self._settle(host.release, record)
            return
        self._count("dead", 1)
        self._settle(lambda r: host.reject(r, detail), record)

    def _settle(self, how: Callable[[Record], None], record: Record) -> None:
        try:
            how(record)
        except IllegalSubscriberStateError as exc:
            if not self._share.closed:
                self._share.report(f"settling {record!r} failed", exc)

    def _count(self, name: str, delta: int) -> None:
        with self._counts_lock:
            self._counts[name] += delta

    def metrics(self) -> ReceiverMetrics:
        """In flight, finished (acked), retried, dead-lettered, failed (released)."""
        with self._counts_lock:
            c = dict(self._counts)
        return ReceiverMetrics(
            in_flight=c["in_flight"],
            finished=c["finished"] + c["dead"] + c["failed"],
            retried=c["retried"],
            dead_lettered=c["dead"],
            failed=c["failed"],
        )

    def close(self, timeout_s: float | None = 30.0) -> None:
        """Stop polling; let running handlers finish until ``timeout_s`` (``None``: however
        long), release the records not started, and stop. Called from a handler, it does not
        wait."""
        if timeout_s is not None:
            timeout_s = max(0.0, float(timeout_s))
        self._deadline = math.inf if timeout_s is None else time.monotonic() + timeout_s
        self._stop.set()
        current = threading.current_thread()
        if current is self._thread or current.name.startswith("bolide-share-worker-"):
            return
        if self._thread.is_alive():
            self._thread.join(None if timeout_s is None else timeout_s + 5.0)

    def __repr__(self) -> str:
        return f"ShareReceiver(stream={self._share.topic!r}, running={self.running})"


def _check(
    handler: object,
    concurrency: object,
    ordering: object,
    retry: object,
    dead_letter: object,
    auto_confirm: object,
    resequencer: object,
) -> None:
    """Refuse bad options, and those that do not apply to a share group."""
    if not callable(handler):
        raise TypeError("handler must be callable")
    check_int("concurrency", concurrency, minimum=1, maximum=4_096)
    if ordering != "unordered":
        raise ValueError(
            f"ordering={ordering!r} does not apply to a share group: its records are spread "
            "over its members with no order (read in a consumer group to keep one)"
        )
    if retry is not None and not isinstance(retry, Retry):
        raise TypeError(f"retry must be a Retry or None, not {type(retry).__name__}")
    check_dead_letter(dead_letter)
    if auto_confirm is not True:
        raise ValueError("a share group receiver acks each record when its handler returns")
    if resequencer is not None:
        raise ValueError("a resequencer needs the order of a consumer group, not a share group")


def _caller(host: ShareHost, handler: RecordHandler | AsyncRecordHandler) -> RecordHandler:
    """``handler`` as a plain call: an ``async def`` runs on an event loop of the worker's own;
    either inside a process span when telemetry is on."""
    call = getattr(handler, "__call__", None)  # noqa: B004 (async __call__ of an object)
    if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call):
        coroutine = cast(AsyncRecordHandler, handler)
        if TELEMETRY is not None:
            coroutine = TELEMETRY.async_handler(host, coroutine)

        def run(record: Record) -> None:
            asyncio.run(cast(Any, coroutine(record)))

        return run
    plain = cast(RecordHandler, handler)
    return TELEMETRY.handler(host, plain) if TELEMETRY is not None else plain
