"""``Instrumentation``: bolide's OpenTelemetry metrics and spans (imported only with the API).

``bolide.facade.telemetry`` imports this module when ``opentelemetry-api`` is installed; the
publisher, subscriber, receiver and archiver call it through ``telemetry.TELEMETRY``. Names
follow the OpenTelemetry messaging semantic conventions; what they do not name is under
``bolide.*``.
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from opentelemetry import metrics, propagate, trace
from opentelemetry.context import Context
from opentelemetry.metrics import (
    Meter,
    MeterProvider,
)
from opentelemetry.trace import (
    Link,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    TracerProvider,
)

from bolide.facade.record import Headers, Record
from bolide.facade.telemetry._otel_parts import (
    DESTINATION,
    DURATION_BUCKETS,
    ERROR_TYPE,
    GETTER,
    GROUP,
    OFFSET,
    OPERATION,
    OPERATION_TYPE,
    PARTITION,
    SYSTEM,
    HealthSource,
    Reader,
    Report,
    Totals,
    Watched,
    group_of,
    guarded,
)

__all__ = ["Instrumentation"]

log = logging.getLogger("bolide.telemetry")


#: Seconds between looks at the global providers while none records.
_RECHECK_S = 1.0

#: The API packages, whose providers record nothing (their no-op and proxy placeholders, until
#: the application sets an SDK's or its own).
_API_PACKAGES = ("opentelemetry.trace", "opentelemetry.metrics")


def _placeholder(provider: object) -> bool:
    """Whether ``provider`` is one of the API's own providers, which record nothing."""
    module = type(provider).__module__
    return any(module == p or module.startswith(p + ".") for p in _API_PACKAGES)


def _version() -> str:
    try:
        return version("bolide")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0"


def _nothing() -> None:
    """No span to end."""


class Instrumentation:
    """Counters, histograms, gauges and spans of every bolide client in the process.

    Reports to the global tracer and meter providers until ``configure`` names others.
    """

    def __init__(self) -> None:
        self.watched = Watched()
        # Per subscriber: partition -> first offset delivered, and confirmed positions.
        self._first: weakref.WeakKeyDictionary[Any, dict[int, int]] = weakref.WeakKeyDictionary()
        self._confirmed: weakref.WeakKeyDictionary[Any, dict[int, int]] = (
            weakref.WeakKeyDictionary()
        )
        # Counted here, reported at each collection: kept across ``configure``.
        self.sent, self.consumed = Totals(), Totals()
        self.confirmed_messages, self.archived = Totals(), Totals()
        self.configure()

    # -- providers ---------------------------------------------------------------------------

    def configure(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        """Report to these providers (``None``: the global ones, as set by the application)."""
        name, ver = "bolide", _version()
        self._providers = (tracer_provider, meter_provider)
        self._live = False
        self._recheck = 0.0  # time.monotonic() of the next look at the global providers
        self.tracer: Tracer = (
            tracer_provider.get_tracer(name, ver)
            if tracer_provider is not None
            else trace.get_tracer(name, ver)
        )
        meter: Meter = (
            meter_provider.get_meter(name, ver)
            if meter_provider is not None
            else metrics.get_meter(name, ver)
        )
        self.send_duration = meter.create_histogram(
            "messaging.client.operation.duration",
            unit="s",
            description="Duration of messaging operation initiated by a producer or consumer "
            "client (send: until the broker acknowledged).",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
        )
        self.process_duration = meter.create_histogram(
            "messaging.process.duration",
            unit="s",
            description="Duration of processing operation (a receiver's handler).",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
        )
        self._observe(meter)
        self._propagator = propagate.get_global_textmap()

    def _observe(self, meter: Meter) -> None:
        """The counters and gauges read when the meter collects."""
        meter.create_observable_counter(
            "messaging.client.sent.messages",
            [self.sent.observe],
            unit="{message}",
            description="Number of messages producer attempted to send to the broker.",
        )
        meter.create_observable_counter(
            "messaging.client.consumed.messages",
            [self.consumed.observe],
            unit="{message}",
            description="Number of messages that were delivered to the application.",
        )
        meter.create_observable_counter(
            "bolide.consumer.confirmed.messages",
            [self.confirmed_messages.observe],
            unit="{message}",
            description="Records confirmed (committed) by a subscriber group member.",
        )
        meter.create_observable_counter(
            "bolide.archive.rows",
            [self.archived.observe],
            unit="{row}",
            description="Records written to the history store by the archiver.",
        )
        meter.create_observable_gauge(
            "bolide.consumer.lag",
            [self.watched.observe_lag("subscriber")],
            unit="{message}",
            description="Records between a subscriber's position and the end of the partition.",
        )
        meter.create_observable_gauge(
            "bolide.archive.lag",
            [self.watched.observe_lag("archiver")],
            unit="{message}",
            description="Records between the archiver's position and the end of the partition.",
        )
        meter.create_observable_gauge(
            "bolide.resequencer.held",
            [self.watched.observe_held],
            unit="{message}",
            description="Records a resequencer holds back, waiting for their sequence.",
        )
        meter.create_observable_gauge(
            "bolide.durable.backlog",
            [self.watched.observe_backlog],
            unit="{message}",
            description="Records waiting for a durable client (replayed when it reconnects).",
        )

    def live(self) -> bool:
        """True once a provider that records is in place (given, or set globally).

        Until then every hook returns at once: the API installed without an SDK costs a
        clock read per call, not a span and a counter per record. Providers set globally are
        noticed within a second.
        """
        if self._live:
            return True
        now = time.monotonic()
        if now < self._recheck:  # looking the providers up costs microseconds: once a second
            return False
        self._recheck = now + _RECHECK_S
        tracing, metering = self._providers
        tracing = tracing if tracing is not None else trace.get_tracer_provider()
        metering = metering if metering is not None else metrics.get_meter_provider()
        self._live = not (_placeholder(tracing) and _placeholder(metering))
        return self._live

    # -- what the gauges watch -----------------------------------------------------------------

    def watch(self, client: HealthSource) -> None:
        """Report ``client.health()`` lags (a subscriber or an archiver) while it lives."""
        self.watched.watch(client)

    def watch_resequencer(self, resequencer: Any) -> None:
        """Report how many records ``resequencer`` holds while it lives."""
        self.watched.watch_resequencer(resequencer)

    def watch_durable(self, cluster: Any, clients: Callable[[], Iterable[Any]]) -> None:
        """Report the backlog of every durable client ``clients()`` lists."""
        self.watched.watch_durable(cluster, clients)

    def unwatch_durable(self) -> None:
        """Stop reporting durable backlogs."""
        self.watched.unwatch_durable()

    # -- publishing ------------------------------------------------------------------------

    def send(
        self, topic: str, record: Record, headers: Headers | None, report: Report
    ) -> tuple[Headers | None, Report, Callable[[], None]]:
        """Start the ``send`` span of ``record``, put its context in the record's headers,
        and wrap ``report`` to count the outcome and end the span on the acknowledgement.

        ``record.headers`` gets the same trace headers as the message, so a published record
        equals the one read back. The third element ends the span when the client never took
        the record (its queue was full, or it refused the call): no span is left open.
        """
        if not self.live():
            return headers, report, _nothing
        try:
            attrs = {SYSTEM: "kafka", DESTINATION: topic, OPERATION: "send", OPERATION_TYPE: "send"}
            span = self.tracer.start_span(f"send {topic}", kind=SpanKind.PRODUCER, attributes=attrs)
            carrier: dict[str, str] = {}
            self._propagator.inject(carrier, context=trace.set_span_in_context(span))
            if carrier:
                names = set(carrier)
                added = [(k, v.encode("latin-1")) for k, v in carrier.items()]
                traced = [h for h in headers or () if h[0] not in names] + added
                record.headers = [h for h in record.headers if h[0] not in names] + added
                headers = traced
        except Exception:
            log.exception("telemetry: send failed")
            return headers, report, _nothing
        started = time.perf_counter()

        def reported(err: Any, msg: Any) -> None:
            self._sent(topic, span, started, err, msg)
            report(err, msg)

        def untaken() -> None:
            try:
                span.end()
            except Exception:
                log.exception("telemetry: ending a send span failed")

        return headers, reported, untaken

    @guarded
    def _sent(self, topic: str, span: Any, started: float, err: Any, msg: Any) -> None:
        attrs: dict[str, str] = {SYSTEM: "kafka", DESTINATION: topic, OPERATION: "send"}
        if msg is not None and err is None:
            partition = str(msg.partition())
            attrs[PARTITION] = partition
            span.set_attribute(PARTITION, partition)
            span.set_attribute(OFFSET, msg.offset())
        else:
            error = type(err).__name__ if not hasattr(err, "name") else err.name()
            attrs[ERROR_TYPE] = error
            span.set_attribute(ERROR_TYPE, error)
            span.set_status(Status(StatusCode.ERROR, str(err)))
        self.sent.add(1, attrs)
        self.send_duration.record(time.perf_counter() - started, attrs)
        span.end()

    # -- reading -----------------------------------------------------------------------------

    @guarded
    def delivered(self, reader: Reader, batch: Sequence[Record]) -> None:
        """Count a poll's records and give each traced record its ``poll`` span, a child of
        (and linked to) its producer's context."""
        if not self.live():
            return
        topic, group = reader.topic, group_of(reader)
        counts: dict[int, int] = {}
        first = self._first.setdefault(reader, {})
        for record in batch:
            partition = record.partition or 0
            counts[partition] = counts.get(partition, 0) + 1
            if partition not in first and record.offset is not None:
                first[partition] = record.offset
            if record.headers:
                span = self._span(f"poll {topic}", "poll", "receive", topic, group, record, True)
                if span is not None:
                    span.end()
        for partition, n in counts.items():
            attrs = {
                SYSTEM: "kafka",
                DESTINATION: topic,
                PARTITION: str(partition),
                OPERATION: "poll",
            }
            if group is not None:
                attrs[GROUP] = group
            self.consumed.add(n, attrs)

    @guarded
    def confirmed(self, reader: Reader, positions: Mapping[int, int]) -> None:
        """Count the records a confirm covers that this member had not confirmed yet."""
        if not self.live():
            return
        topic, group = reader.topic, reader.group_id
        first = self._first.get(reader, {})
        done = self._confirmed.setdefault(reader, {})
        for partition, position in positions.items():
            since = done.get(partition, first.get(partition, position))
            if position > since:
                attrs = {
                    SYSTEM: "kafka",
                    DESTINATION: topic,
                    PARTITION: str(partition),
                    GROUP: group,
                }
                self.confirmed_messages.add(position - since, attrs)
                done[partition] = position

    def handler(
        self, reader: Reader, handler: Callable[[Record], None]
    ) -> Callable[[Record], None]:
        """``handler`` inside a ``process`` span (current while it runs, so what it publishes
        continues the trace), timed into ``messaging.process.duration``. Telemetry never
        changes the outcome: a span that fails to start, record or end is logged, and the
        handler's own result (its return, or what it raised) is what the caller gets."""
        topic, group = reader.topic, group_of(reader)

        def process(record: Record) -> None:
            with self._processing(topic, group, record):
                handler(record)

        return process

    def async_handler(
        self, reader: Reader, handler: Callable[[Record], Awaitable[None]]
    ) -> Callable[[Record], Awaitable[None]]:
        """``handler`` (an ``async def``) in a ``process`` span, as ``handler`` does."""
        topic, group = reader.topic, group_of(reader)

        async def process(record: Record) -> None:
            with self._processing(topic, group, record):
                await handler(record)

        return process

    @contextlib.contextmanager
    def _processing(self, topic: str, group: str | None, record: Record) -> Iterator[None]:
        """One handler call in its ``process`` span, current while it runs."""
        span = self._process_span(topic, group, record) if self.live() else None
        if span is None:
            yield
            return
        attrs = self._process_attrs(topic, group, record)
        started = time.perf_counter()
        error: BaseException | None = None
        try:
            with trace.use_span(span, record_exception=False, set_status_on_exception=False):
                yield
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._ended(span, error, time.perf_counter() - started, attrs)

    def _process_span(self, topic: str, group: str | None, record: Record) -> Any:
        try:
            return self._span(f"process {topic}", "process", "process", topic, group, record)
        except Exception:
            log.exception("telemetry: process span failed")
            return None

    @staticmethod
    def _process_attrs(topic: str, group: str | None, record: Record) -> dict[str, str]:
        attrs = {SYSTEM: "kafka", DESTINATION: topic, OPERATION: "process"}
        if group is not None:
            attrs[GROUP] = group
        attrs[PARTITION] = str(record.partition or 0)
        return attrs

    def _ended(
        self, span: Any, error: BaseException | None, seconds: float, attrs: dict[str, str]
    ) -> None:
        """End a process span with the handler's outcome; never raises."""
        if error is not None:
            attrs[ERROR_TYPE] = type(error).__qualname__
        try:
            if error is not None:
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            span.end()
        except Exception:
            log.exception("telemetry: ending a process span failed")
        self._processed(seconds, attrs)

    @guarded
    def _processed(self, seconds: float, attrs: Mapping[str, str]) -> None:
        self.process_duration.record(seconds, attrs)

    # -- archiving ---------------------------------------------------------------------------

    @guarded
    def archive(self, group: str, records: Mapping[str, Sequence[Record]]) -> None:
        """Count archived records and give each traced one its ``archive`` span, a child of
        (and linked to) its producer's context."""
        if not self.live():
            return
        for stream, recs in records.items():
            counts: dict[int, int] = {}
            for record in recs:
                partition = record.partition or 0
                counts[partition] = counts.get(partition, 0) + 1
                if record.headers:
                    span = self._span(
                        f"archive {stream}", "archive", "process", stream, group, record, True
                    )
                    if span is not None:
                        span.end()
            for partition, n in counts.items():
                attrs = {
                    SYSTEM: "kafka",
                    DESTINATION: stream,
                    PARTITION: str(partition),
                    GROUP: group,
                }
                self.archived.add(n, attrs)

    # -- spans -------------------------------------------------------------------------------

    def _span(
        self,
        name: str,
        operation: str,
        operation_type: str,
        topic: str,
        group: str | None,
        record: Record,
        traced_only: bool = False,
    ) -> Any:
        """A consumer-side span for ``record``: a child of its producer's context (when the
        record carries one), with a link to it. With ``traced_only``: ``None`` for a record
        without a context or whose trace is not sampled (what a parent-based sampler, the
        default, would drop anyway, for the cost of a lookup instead of a span)."""
        parent: Context | None = None
        links: list[Link] = []
        if record.headers:
            parent = self._propagator.extract(record.headers, getter=GETTER)
            producer = trace.get_current_span(parent).get_span_context()
            if producer.is_valid:
                if traced_only and not producer.trace_flags.sampled:
                    return None  # the producer's trace is not recorded: neither is this part
                links.append(Link(producer))
            else:
                parent = None
        if traced_only and not links:
            return None
        attrs: dict[str, Any] = {
            SYSTEM: "kafka",
            DESTINATION: topic,
            OPERATION: operation,
            OPERATION_TYPE: operation_type,
            PARTITION: str(record.partition or 0),
        }
        if record.offset is not None:
            attrs[OFFSET] = record.offset
        if group is not None:
            attrs[GROUP] = group
        return self.tracer.start_span(
            name, context=parent, kind=SpanKind.CONSUMER, attributes=attrs, links=links
        )
