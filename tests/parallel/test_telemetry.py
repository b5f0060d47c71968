"""With OpenTelemetry, each record a parallel receiver handles runs in a ``process`` span."""

from __future__ import annotations

import threading

import pytest
from opentelemetry import trace

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
