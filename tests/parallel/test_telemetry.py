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
