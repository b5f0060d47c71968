"""With OpenTelemetry, each record a parallel receiver handles runs in a ``process`` span."""

from __future__ import annotations

import threading

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor

from bolide.facade import InitialOffsetScheme, Record, Subscriber, SubscriberConfig, telemetry
from tests.conftest import eventually
from tests.ops.test_telemetry import Otel
from tests.parallel.conftest import publish_keyed

pytestmark = pytest.mark.kafka


def test_each_record_runs_in_a_process_span(cluster, stream_factory):
    otel = Otel()
    telemetry.configure(otel.tracer_provider, otel.meter_provider)
    try:
        stream = stream_factory()
        published = publish_keyed(cluster, stream, 40, keys=4)
        lock = threading.Lock()
        spans: set[int] = set()

        def handler(record: Record) -> None:
            span = trace.get_current_span()
            assert span.is_recording()
            with lock:
                spans.add(span.get_span_context().span_id)

        config = SubscriberConfig(stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST)
        with Subscriber(cluster, config) as sub:
            receiver = sub.attach_receiver(handler, concurrency=4)
            eventually(lambda: receiver.metrics().finished >= len(published), 60)
            assert receiver.metrics().failed == 0
        processes = otel.finished(f"process {stream.name}")
        assert len(processes) == len(published) == len(spans)
        assert {p.context.span_id for p in processes} == spans
    finally:
        telemetry.configure()
        otel.tracer_provider.shutdown()
        otel.meter_provider.shutdown()


def test_async_handlers_run_in_a_process_span_too(cluster, stream_factory):
    otel = Otel()
    telemetry.configure(otel.tracer_provider, otel.meter_provider)
    try:
        stream = stream_factory()
        published = publish_keyed(cluster, stream, 12, keys=3)
        spans: set[int] = set()

        async def handler(record: Record) -> None:
            span = trace.get_current_span()
            assert span.is_recording()
            spans.add(span.get_span_context().span_id)
            if record.offset == 5:
                raise ValueError("bad record")

        config = SubscriberConfig(stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST)
        with Subscriber(cluster, config) as sub:
            receiver = sub.attach_receiver(handler, concurrency=4)
            eventually(lambda: receiver.metrics().finished >= len(published), 60)
        processes = otel.finished(f"process {stream.name}")
        assert {p.context.span_id for p in processes} == spans and len(spans) == len(published)
        failed = [p for p in processes if not p.status.is_ok]
        assert len(failed) == 1 and failed[0].events[0].name == "exception"
    finally:
        telemetry.configure()
        otel.tracer_provider.shutdown()
        otel.meter_provider.shutdown()


class _Span(trace.NonRecordingSpan):
    """A span of a tracing backend whose ``end`` fails (a broken exporter's client, say)."""

    def is_recording(self) -> bool:
        return True

    def end(self, end_time: int | None = None) -> None:
        raise RuntimeError("the tracing backend is down")


class _Tracer(trace.NoOpTracer):
    def start_span(self, *args, **kwargs) -> trace.Span:
        return _Span(trace.INVALID_SPAN_CONTEXT)


class _Provider(trace.TracerProvider):
    def get_tracer(self, *args, **kwargs) -> trace.Tracer:
        return _Tracer()


def test_a_span_that_fails_to_end_never_fails_the_handler(cluster, stream_factory):
    otel = Otel()
    telemetry.configure(_Provider(), otel.meter_provider)
    try:
        stream = stream_factory()
        published = publish_keyed(cluster, stream, 10, keys=2)
        errors: list[BaseException | None] = []
        handled: list[int] = []
        config = SubscriberConfig(
            stream=stream,
            initial_offset_scheme=InitialOffsetScheme.EARLIEST,
            error_handler=lambda s, e: errors.append(e),
        )
        with Subscriber(cluster, config) as sub:
            receiver = sub.attach_receiver(lambda r: handled.append(r.offset or 0), concurrency=2)
            eventually(lambda: receiver.metrics().finished >= len(published), 60)
            metrics = receiver.metrics()
        assert metrics.failed == 0 and metrics.retried == 0 and errors == []
        assert sorted(handled) == list(range(len(published)))
    finally:
        telemetry.configure()
        otel.meter_provider.shutdown()


class _Counting(SpanProcessor):
    """Counts the spans started and ended."""

    def __init__(self) -> None:
        self.started = self.ended = 0
        self.lock = threading.Lock()

    def on_start(self, span, parent_context=None) -> None:
        with self.lock:
            self.started += 1

    def on_end(self, span) -> None:
        with self.lock:
            self.ended += 1


def test_every_send_span_ends_even_when_the_queue_refuses_a_record(cluster, stream_factory):
    """An asyncio publisher offers records to a full local queue and waits for room: each
    refused offer ends its span (the record is offered again in a span of its own)."""
    import asyncio

    from bolide.facade import PublisherConfig
    from bolide.facade.aio import AsyncPublisher

    otel, counting = Otel(), _Counting()
    otel.tracer_provider.add_span_processor(counting)
    telemetry.configure(otel.tracer_provider, otel.meter_provider)
    try:
        stream = stream_factory()
        config = PublisherConfig(stream=stream, producer_config={"queue.buffering.max.messages": 1})

        async def main() -> list[int]:
            async with AsyncPublisher(cluster, config) as pub:
                return await asyncio.gather(*(pub.publish(Record(b"%d" % i)) for i in range(50)))

        offsets = asyncio.run(main())
        assert sorted(offsets) == list(range(50))
        assert len(otel.finished(f"send {stream.name}")) >= 50
        assert counting.started == counting.ended
    finally:
        telemetry.configure()
        otel.tracer_provider.shutdown()
        otel.meter_provider.shutdown()
