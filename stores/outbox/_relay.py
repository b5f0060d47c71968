"""The outbox relay: a thread that publishes committed outbox rows to Kafka and marks them sent
(``Outbox.relay``; ``bolide outbox relay``), and its asyncio face.

Failures the relay outlives (the database or Kafka away, a broker refusing for a while) are
retried with backoff and counted in ``stats.retries``; failures that no retry cures (a stream
that does not exist, a record Kafka refuses, a relay fenced by a newer one) stop it, reach the
``error_handler``, and are raised again by ``close()``. See docs/outbox.md.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any

from confluent_kafka import KafkaException

from bolide.facade.cluster import check_settings
from bolide.facade.config import Cluster, ErrorHandler
from bolide.facade.errors import (
    BrokerError,
    ProducerFencedError,
    PublishError,
    StoreError,
)
from bolide.facade.support import Closing
from bolide.facade.validate import check_int, check_seconds
from bolide.stores.outbox._claims import pending_count, pending_streams
from bolide.stores.outbox._kafka import Marker, Publishers, final
from bolide.stores.outbox._rounds import AtLeastOnce, Done, ExactlyOnce
from bolide.stores.store import SqlStore

__all__ = ["AsyncOutboxRelay", "OutboxRelay", "RelayConfig", "RelayStats"]

log = logging.getLogger("bolide.stores.outbox")


@dataclass(frozen=True, kw_only=True)
class RelayConfig:
    """How a relay publishes.

    Args:
        transactional_id: Publish each batch in a Kafka transaction, exactly once for
            ``read_committed`` readers (docs/outbox.md); keep the id across restarts, one per
            running relay. ``None`` (default): idempotent publishers, at least once.
        batch_size: Most rows claimed per round.
        poll_interval_s: How long an idle relay waits before it looks for new rows.
        max_backoff_s: Longest wait between retries after a failure it outlives.
        progress_interval_s: Seconds between progress lines (logged at INFO, ``-v``).
        producer_config: librdkafka producer settings, passed through.
        error_handler: ``fn(summary, error)`` for the failure that stops the relay; logs if
            unset.
    """

    transactional_id: str | None = None
    batch_size: int = 500
    poll_interval_s: float = 0.1
    max_backoff_s: float = 5.0
    progress_interval_s: float = 10.0
    producer_config: Mapping[str, Any] = field(default_factory=dict)
    error_handler: ErrorHandler | None = None

    def __post_init__(self) -> None:
        tid = self.transactional_id
        if tid is not None and (not isinstance(tid, str) or not tid or len(tid) > 200):
            raise ValueError("transactional_id must be a non-empty string of at most 200 chars")
        check_int("batch_size", self.batch_size, minimum=1, maximum=5_000)
        check_seconds("poll_interval_s", self.poll_interval_s)
        check_seconds("max_backoff_s", self.max_backoff_s)
        check_seconds("progress_interval_s", self.progress_interval_s)
        settings = check_settings("producer_config", self.producer_config)
        if "transactional.id" in settings:
            raise ValueError("producer_config: pass transactional.id as transactional_id=...")
        object.__setattr__(self, "producer_config", settings)
        if self.error_handler is not None and not callable(self.error_handler):
            raise TypeError("error_handler must be callable")


@dataclass(frozen=True)
class RelayStats:
    """A relay's progress since it started.

    Attributes:
        published: Rows published and marked sent.
        batches: Rounds that published something.
        retries: Failures retried (the database or Kafka away for a while).
        recovered: Rows a previous transactional relay had committed in Kafka but not marked
            sent; marked at the start, not published again.
        released: Rows claimed for a Kafka transaction that did not commit; handed back.
        pending: Rows not yet sent, at the last progress report (``None`` before it).
        elapsed_s: Seconds since the start.
        records_per_s: Rows published per second since the previous progress report.
    """

    published: int = 0
    batches: int = 0
    retries: int = 0
    recovered: int = 0
    released: int = 0
    pending: int | None = None
    elapsed_s: float = 0.0
    records_per_s: float = 0.0


def check_store(store: object) -> SqlStore:
    """``store`` if an outbox can live there.

    Raises:
        TypeError: It is not a ``SqlStore``.
        ValueError: It is an in-memory SQLite database: its one connection serves every user,
            so the relay's transactions would mix with the application's.
    """
    if not isinstance(store, SqlStore):
        raise TypeError(f"store must be a SqlStore, not {type(store).__name__}")
    if store.sql_dialect.one_connection(store.engine.url):
        raise ValueError(
            "store: an in-memory SQLite database has one connection for every user, so the "
            "relay's transactions would mix with the application's; use a file"
        )
    return store


def _transient(error: BaseException) -> bool:
    """Whether the relay may retry after ``error`` (else it stops)."""
    if isinstance(error, ProducerFencedError):
        return False
    if isinstance(error, StoreError):
        return error.retriable
    if isinstance(error, PublishError):
        return not final(error)
    if isinstance(error, KafkaException):
        return not error.args[0].fatal()
    return isinstance(error, BrokerError)


class OutboxRelay(Closing):
    """Publishes an outbox's committed rows in a background thread (``Outbox.relay``).

    It starts in the constructor: a stream with pending rows that does not exist, a second
    relay on a SQLite database, or a schema behind raise there, before the thread starts.

    Args:
        store: The outbox's store.
        cluster: Where the streams live.
        config: How it publishes (``RelayConfig()``: at least once, defaults).

    Raises:
        TypeError: An argument of the wrong type.
        ValueError: ``store`` is an in-memory SQLite database, or librdkafka refuses a
            ``producer_config`` setting.
        PublishError: A stream with pending rows does not exist (``retriable`` false), or a
            transactional publisher could not start.
        StoreError: The database failed, its schema is behind, or (SQLite) another relay runs
            on the same file, whatever path it was given (docs/outbox.md).
    """

    def __init__(
        self, store: SqlStore, cluster: Cluster, config: RelayConfig | None = None
    ) -> None:
        check_store(store)
        if not isinstance(cluster, Cluster):
            raise TypeError(f"cluster must be a Cluster, not {type(cluster).__name__}")
        config = RelayConfig() if config is None else config
        if not isinstance(config, RelayConfig):
            raise TypeError(f"config must be a RelayConfig, not {type(config).__name__}")
        self.store, self.cluster, self.config = store, cluster, config
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._started = time.monotonic()
        self.stats = RelayStats()
        store.check_schema()  # first: a database never upgraded (or no file) is told so
        self._guard = store.sql_dialect.relay_guard(store.engine.url)
        if not self._guard.acquire():
            raise StoreError(
                f"another outbox relay runs on {store.url}: SQLite takes one relay at a time "
                "(on PostgreSQL relays share the work)"
            )
        try:
            self._rounds = self._begin()
        except BaseException:
            self._guard.release()
            raise
        self._thread = threading.Thread(target=self._serve, name="bolide-outbox-relay", daemon=True)
        self._thread.start()

    def _begin(self) -> AtLeastOnce | ExactlyOnce:
        """Check the streams, build the rounds, recover (transactional)."""
        store, config = self.store, self.config
        tid = config.transactional_id
        publishers = Publishers(self.cluster, config.producer_config, tid)
        rounds: AtLeastOnce | ExactlyOnce | None = None
        try:
            waiting = store.guarded("outbox streams", lambda: _read(store, pending_streams))
            publishers.require(waiting, waiting)
            if tid is None:
                rounds = AtLeastOnce(store, publishers, config.batch_size, self._stop)
            else:
                marker = Marker(self.cluster, tid)
                rounds = ExactlyOnce(store, publishers, marker, tid, config.batch_size)
            done = store.guarded("start the outbox relay", rounds.start)
            for stream in waiting:  # built now: a producer setting librdkafka refuses fails here
                publishers.get(stream)
        except BaseException:
            if rounds is not None:
                rounds.close()
            publishers.close()
            raise
        self.stats = replace(self.stats, recovered=done.recovered, released=done.released)
        mode = "at least once" if tid is None else f"exactly once as {tid!r}"
        log.info("outbox relay started on %s (%s)", store.url, mode)
        return rounds

    # -- the thread -----------------------------------------------------------------------

    def _serve(self) -> None:
        delay = 0.1
        meter = _Meter(self._started)
        try:
            while not self._stop.is_set():
                try:
                    done = self.store.guarded("relay outbox rows", self._rounds.round)
                except Exception as exc:
                    if not _transient(exc):
                        raise
                    self.stats = replace(self.stats, retries=self.stats.retries + 1)
                    log.warning("outbox relay: %s; retrying in %.1fs", exc, delay)
                    self._stop.wait(delay)
                    delay = min(delay * 2, self.config.max_backoff_s)
                    continue
                delay = 0.1
                self._count(done, meter)
                if not done.busy:
                    self._stop.wait(self.config.poll_interval_s)
        except BaseException as exc:
            self._error = exc
            self._report(exc)
        finally:
            self._rounds.close()
            self._guard.release()
            self._progress(meter, force=True)

    def _count(self, done: Done, meter: _Meter) -> None:
        if done.published or done.released:
            stats = self.stats
            self.stats = replace(
                stats,
                published=stats.published + done.published,
                batches=stats.batches + (1 if done.published else 0),
                released=stats.released + done.released,
            )
            meter.count += done.published
            log.debug("outbox relay: batch of %d rows published", done.published)
        self._progress(meter)

    def _progress(self, meter: _Meter, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - meter.last < self.config.progress_interval_s:
            return
        try:
            pending: int | None = self.store.guarded("outbox pending", self._pending)
        except StoreError:
            pending = None
        rate = meter.rate(now)
        self.stats = replace(
            self.stats, pending=pending, elapsed_s=now - self._started, records_per_s=rate
        )
        log.info(
            "outbox relay: %d rows published in %d batches (%.0f/s), %s pending, %d retries",
            self.stats.published,
            self.stats.batches,
            rate,
            "?" if pending is None else pending,
            self.stats.retries,
        )

    def _pending(self) -> int:
        return int(_read(self.store, pending_count))

    def _report(self, error: BaseException) -> None:
        summary = f"the outbox relay stopped: {error}"
        handler = self.config.error_handler
        if handler is None:
            log.error("%s", summary)
            return
        try:
            handler(summary, error)
        except Exception:
            log.exception("outbox relay error handler raised")

    # -- lifetime -------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether the thread still relays (it stops on ``close`` or a failure it cannot
        outlive: ``error``)."""
        return self._thread.is_alive()

    @property
    def error(self) -> BaseException | None:
        """The failure that stopped the relay, if one did."""
        return self._error

    def close(self, timeout_s: float = 30.0) -> RelayStats:
        """Stop after the round in hand; re-raise what stopped the relay, if anything.

        Rows published and not yet marked are published again by the next relay (at least
        once), or settled from the marker by the next start (transactional).

        Raises:
            TimeoutError: The round in hand did not end within ``timeout_s``.
        """
        self._stop.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"the outbox relay did not stop within {timeout_s}s")
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return self.stats

    def __repr__(self) -> str:
        mode = self.config.transactional_id
        return f"OutboxRelay({self.store.url!r}, transactional_id={mode!r})"


def _read(store: SqlStore, query: Any) -> Any:
    with store.engine.connect() as conn:
        return query(conn)


class _Meter:
    """Rows per second between progress reports."""

    def __init__(self, started: float) -> None:
        self.last = started
        self.count = 0

    def rate(self, now: float) -> float:
        rate = self.count / max(now - self.last, 1e-6)
        self.count, self.last = 0, now
        return rate


class AsyncOutboxRelay:
    """An ``OutboxRelay`` for asyncio services (``await Outbox.relay_async(cluster)``): its
    start and ``close`` run on a worker thread, so the event loop never waits on them."""

    def __init__(self, relay: OutboxRelay) -> None:
        self.relay = relay

    @property
    def stats(self) -> RelayStats:
        """The relay's progress (``OutboxRelay.stats``)."""
        return self.relay.stats

    @property
    def running(self) -> bool:
        """Whether the relay still runs."""
        return self.relay.running

    @property
    def error(self) -> BaseException | None:
        """The failure that stopped the relay, if one did."""
        return self.relay.error

    async def close(self, timeout_s: float = 30.0) -> RelayStats:
        """``OutboxRelay.close`` without blocking the loop."""
        return await asyncio.to_thread(self.relay.close, timeout_s)

    async def __aenter__(self) -> AsyncOutboxRelay:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
