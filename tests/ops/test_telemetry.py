"""OpenTelemetry: metrics with the messaging conventions' names, and a trace that crosses
publisher -> Kafka -> subscriber -> archive, collected with the SDK's in-memory reader and
exporter."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import propagate
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from opentelemetry.trace import SpanKind

from bolide.facade import (
    Cluster,
    Publisher,
    PublisherConfig,
    Record,
    Resequencer,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
    sequence_headers,
    telemetry,
)
from bolide.stores import Archiver, SqlStore
from bolide.stores.durable_registry import SqlDurableRegistry
from tests.conftest import eventually, upgraded_db_url
from tests.durable.conftest import Events
from tests.ops.conftest import LEASE_MS, publish

pytestmark = pytest.mark.kafka

KAFKA = {"messaging.system": "kafka"}
FAST_GROUP = {"session.timeout.ms": 4000, "heartbeat.interval.ms": 500}


class Otel:
    """In-memory providers bolide reports to for one test."""

    def __init__(self, sampler: Any = None) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider(sampler=sampler)
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def finished(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name == name]

    def points(self, name: str) -> list[tuple[dict[str, Any], Any]]:
        """``(attributes, value)`` of metric ``name`` (a histogram's value is its count)."""
        out = []
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data is not None else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name != name:
                        continue
                    for point in metric.data.data_points:
                        value = getattr(point, "value", None)
                        if value is None:
                            value = point.count  # type: ignore[union-attr]
                        out.append((dict(point.attributes or {}), value))
        return out

    def total(self, name: str, **match: str) -> Any:
        return sum(
            v for a, v in self.points(name) if all(a.get(k) == m for k, m in _attrs(match).items())
        )


def _attrs(match: dict[str, str]) -> dict[str, str]:
    names = {
        "stream": "messaging.destination.name",
        "partition": "messaging.destination.partition.id",
        "group": "messaging.consumer.group.name",
        "operation": "messaging.operation.name",
    }
    return {names.get(k, k): v for k, v in match.items()}


@pytest.fixture
def otel() -> Iterator[Otel]:
    collected = Otel()
    telemetry.configure(collected.tracer_provider, collected.meter_provider)
    yield collected
    telemetry.configure()  # back to the global (no-op) providers for the other tests
    collected.tracer_provider.shutdown()
    collected.meter_provider.shutdown()


def _traceparent(span: ReadableSpan) -> bytes:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}".encode()


def _poll(sub: Subscriber, count: int) -> list[Record]:
    got: list[Record] = []
    eventually(lambda: got.extend(sub.poll(200)) or len(got) >= count, timeout_s=60)
    return got


@pytest.mark.postgres
def test_a_trace_crosses_publisher_subscriber_and_archive(
    otel: Otel,
    cluster: Cluster,
    stream_factory: Callable[..., StreamConfig],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    stream = stream_factory()
    records = [Record(f"r-{i}".encode(), headers={"n": str(i)}) for i in range(3)]
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for r in records:
            pub.publish(r)
    sends = otel.finished(f"send {stream.name}")
    assert len(sends) == 3
    for span, record in zip(sends, records, strict=True):
        assert span.kind is SpanKind.PRODUCER
        assert dict(span.attributes or {}) == KAFKA | {
            "messaging.destination.name": stream.name,
            "messaging.operation.name": "send",
            "messaging.operation.type": "send",
            "messaging.destination.partition.id": "0",
            "messaging.kafka.offset": record.offset,
        }
        assert record.header("traceparent") == _traceparent(span)

    group = f"g-{uuid.uuid4().hex[:8]}"
    config = SubscriberConfig(stream=stream, group=group, lease_timeout_ms=LEASE_MS)
    with Subscriber(cluster, config) as sub:
        polled = _poll(sub, 3)
        sub.confirm()
    # The trace headers travel with the record: what was published equals what was read.
    assert polled == records
    assert [r.header("n") for r in polled] == [b"0", b"1", b"2"]
    polls = otel.finished(f"poll {stream.name}")
    assert len(polls) == 3
    for send, poll in zip(sends, polls, strict=True):
        assert poll.kind is SpanKind.CONSUMER
        assert poll.parent is not None and poll.parent.span_id == send.context.span_id
        assert poll.context.trace_id == send.context.trace_id
        assert [link.context.span_id for link in poll.links] == [send.context.span_id]
        assert (poll.attributes or {})["messaging.consumer.group.name"] == group
        assert (poll.attributes or {})["messaging.operation.type"] == "receive"

    url = upgraded_db_url("postgresql", tmp_path, request)
    with SqlStore(url) as store:
        arch = f"arch-{uuid.uuid4().hex[:8]}"
        Archiver(cluster, store, [stream], group=arch, consumer_config=FAST_GROUP).run()
        stored = store.read(stream.name, 0, 0, 10)
    assert stored == records  # the archive keeps the trace headers with the rest
    archives = otel.finished(f"archive {stream.name}")
    assert len(archives) == 3
    for send, span in zip(sends, archives, strict=True):
        assert span.kind is SpanKind.CONSUMER
        assert span.context.trace_id == send.context.trace_id
        assert span.parent is not None and span.parent.span_id == send.context.span_id
        assert (span.attributes or {})["messaging.consumer.group.name"] == arch

    assert otel.total("messaging.client.sent.messages", stream=stream.name, partition="0") == 3
    assert otel.total("messaging.client.operation.duration", stream=stream.name) == 3
    consumed = otel.points("messaging.client.consumed.messages")
    assert (KAFKA | {
        "messaging.destination.name": stream.name,
        "messaging.destination.partition.id": "0",
        "messaging.operation.name": "poll",
        "messaging.consumer.group.name": group,
    }, 3) in consumed  # fmt: skip
    assert otel.total("bolide.consumer.confirmed.messages", stream=stream.name, group=group) == 3
    assert otel.total("bolide.archive.rows", stream=stream.name, group=arch) == 3


def test_an_unsampled_trace_still_propagates_and_counts(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    otel = Otel(sampler=ParentBased(ALWAYS_OFF))
    telemetry.configure(otel.tracer_provider, otel.meter_provider)
    try:
        stream = stream_factory()
        [record] = publish(cluster, stream, 1)
        with Subscriber(cluster, SubscriberConfig(stream=stream)) as sub:
            sub.seek(0)
            [read] = _poll(sub, 1)
    finally:
        telemetry.configure()
    # The context travels (the sampled flag off), so the whole trace agrees to drop it.
    traceparent = record.header("traceparent")
    assert traceparent is not None and int(traceparent[-2:], 16) & 1 == 0
    assert read == record
    assert otel.spans.get_finished_spans() == ()
    assert otel.total("messaging.client.sent.messages", stream=stream.name) == 1
    assert otel.total("messaging.client.consumed.messages", stream=stream.name) == 1


def test_republishing_a_read_record_starts_a_new_send(
    otel: Otel, cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    first, second = stream_factory(), stream_factory()
    [original] = publish(cluster, first, 1)
    with Subscriber(cluster, SubscriberConfig(stream=first)) as sub:
        sub.seek(0)
        [read] = _poll(sub, 1)
    with Publisher(cluster, PublisherConfig(stream=second)) as pub:
        pub.publish(read)
    [resend] = otel.finished(f"send {second.name}")
    assert [v for k, v in read.headers if k == "traceparent"] == [_traceparent(resend)]
    assert original.header("traceparent") != read.header("traceparent")


def test_receiver_process_spans_continue_the_trace_downstream(
    otel: Otel, cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    source, sink = stream_factory(), stream_factory()
    publish(cluster, source, 4)
    handled: list[Record] = []
    with (
        Publisher(cluster, PublisherConfig(stream=sink)) as onward,
        Subscriber(cluster, SubscriberConfig(stream=source)) as sub,
    ):
        sub.seek(0)

        def handle(record: Record) -> None:
            onward.publish(Record(record.data.upper()))
            handled.append(record)

        sub.attach_receiver(handle)
        eventually(lambda: len(handled) == 4, timeout_s=60)
    sends = {s.context.span_id: s for s in otel.finished(f"send {source.name}")}
    processes = otel.finished(f"process {source.name}")
    onward_sends = otel.finished(f"send {sink.name}")
    assert len(processes) == len(onward_sends) == 4
    for process in processes:
        assert process.kind is SpanKind.CONSUMER
        assert process.parent is not None and process.parent.span_id in sends
    # What the handler published is a child of its process span: one trace end to end.
    by_id = {p.context.span_id: p for p in processes}
    for span in onward_sends:
        assert span.parent is not None and span.parent.span_id in by_id
        parent = by_id[span.parent.span_id]
        assert span.context.trace_id == sends[parent.parent.span_id].context.trace_id  # type: ignore[union-attr]
    durations = otel.points("messaging.process.duration")
    assert [(a["messaging.operation.name"], n) for a, n in durations] == [("process", 4)]


def test_lag_and_held_gauges(
    otel: Otel, cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory()
    publish(cluster, stream, 10)
    group = f"g-{uuid.uuid4().hex[:8]}"
    config = SubscriberConfig(stream=stream, group=group, lease_timeout_ms=LEASE_MS, max_batch=4)
    with Subscriber(cluster, config) as sub:
        read = _poll(sub, 4)
        assert len(read) == 4
        sub.confirm()
        lag = [(a, v) for a, v in otel.points("bolide.consumer.lag") if a.get(
            "messaging.consumer.group.name") == group]  # fmt: skip
        assert lag == [
            (
                KAFKA | {
                    "messaging.destination.name": stream.name,
                    "messaging.destination.partition.id": "0",
                    "messaging.consumer.group.name": group,
                },
                6,
            )
        ]  # fmt: skip
    assert otel.total("bolide.consumer.confirmed.messages", group=group) == 4

    reseq = Resequencer(mode="batch")
    held = Record(b"part", headers=sequence_headers("order-1", 2, 0))
    held.partition, held.offset = 0, 0
    assert reseq.offer(held) == []
    assert ({"bolide.resequencer.mode": "batch"}, 1) in otel.points("bolide.resequencer.held")


@pytest.mark.postgres
@pytest.mark.slow
def test_archive_lag_and_durable_backlog_gauges(
    otel: Otel,
    cluster: Cluster,
    stream_factory: Callable[..., StreamConfig],
    durable: Callable[..., Subscriber],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    url = upgraded_db_url("postgresql", tmp_path, request)
    stream = stream_factory()
    publish(cluster, stream, 5)
    events = Events()
    durable_id = f"otel-{uuid.uuid4().hex[:6]}"
    sub = durable(stream, durable_id, url, on_live=events.on_live)
    events.drain(sub, lambda: events.live_count() == 1 and len(events.records()) == 5)
    sub.poll(100)
    sub.close()
    publish(cluster, stream, 7, start=5)
    with SqlDurableRegistry(url) as registry:
        telemetry.watch_durable(cluster, registry.list)
        try:
            backlog = otel.points("bolide.durable.backlog")
        finally:
            assert telemetry.TELEMETRY is not None
            telemetry.TELEMETRY.unwatch_durable()
    assert (
        KAFKA | {
            "messaging.destination.name": stream.name,
            "messaging.destination.partition.id": "0",
            "messaging.consumer.group.name": f"bolide-durable-{durable_id}",
            "bolide.durable.id": durable_id,
        },
        7,
    ) in backlog  # fmt: skip

    group = f"arch-{uuid.uuid4().hex[:8]}"
    with SqlStore(url) as store:
        archiver = Archiver(cluster, store, [stream], group=group, consumer_config=FAST_GROUP)
        archiver.start()
        try:
            eventually(lambda: store.largest_offset(stream.name, 0) == 11, timeout_s=60)
            eventually(lambda: archiver.health().lag == 0, timeout_s=30)
            lag = [(a, v) for a, v in otel.points("bolide.archive.lag") if a.get(
                "messaging.consumer.group.name") == group]  # fmt: skip
        finally:
            archiver.stop()
    assert lag == [
        (
            KAFKA | {
                "messaging.destination.name": stream.name,
                "messaging.destination.partition.id": "0",
                "messaging.consumer.group.name": group,
            },
            0,
        )
    ]  # fmt: skip
    assert otel.total("bolide.archive.rows", group=group) == 12


def test_without_opentelemetry_every_hook_is_skipped(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory()
    code = textwrap.dedent(
        f"""
        import sys
        from importlib.abc import MetaPathFinder

        class NoOtel(MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        sys.meta_path.insert(0, NoOtel())
        from bolide.facade import Cluster, Publisher, PublisherConfig, Record, StreamConfig
        from bolide.facade import Subscriber, SubscriberConfig, telemetry

        assert telemetry.TELEMETRY is None and not telemetry.enabled()
        cluster = Cluster({cluster.bootstrap_servers!r})
        stream = StreamConfig(name={stream.name!r})
        with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
            record = Record(b"plain")
            pub.publish(record)
        assert record.headers == [], record.headers
        with Subscriber(cluster, SubscriberConfig(stream=stream)) as sub:
            sub.seek(0)
            got = []
            while not got:
                got = list(sub.poll(500))
        assert got == [record] and got[0].headers == []
        try:
            telemetry.configure()
        except ModuleNotFoundError as exc:
            print(exc)
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "OpenTelemetry is not installed: pip install 'bolide[otel]'"


@pytest.mark.slow
def test_the_telemetry_benchmark_runs(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    if cluster.settings:
        pytest.skip("the benchmark's --bootstrap carries no security settings")
    from benchmarks import bench_telemetry

    argv = ["--bootstrap", cluster.bootstrap_servers, "--json", "--records", "50", "--repeat", "1"]
    assert bench_telemetry.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["benchmark"] == "telemetry"
    assert {(r["metric"], r["mode"]) for r in doc["rows"]} == {
        (m, mode) for m in ("publish_per_s", "poll_per_s") for mode in bench_telemetry.MODES
    }
    assert all(r["per_s"] > 0 and r["ratio"] > 0 for r in doc["rows"])


class _BrokenPropagator(TextMapPropagator):
    """A propagator that fails on every call."""

    def inject(self, carrier: Any, context: Any = None, setter: Any = None) -> None:
        raise RuntimeError("broken propagator")

    def extract(self, carrier: Any, context: Any = None, getter: Any = None) -> Any:
        raise RuntimeError("broken propagator")

    @property
    def fields(self) -> set[str]:
        return {"broken"}


def test_a_failing_telemetry_hook_breaks_nothing(
    cluster: Cluster,
    stream_factory: Callable[..., StreamConfig],
    caplog: pytest.LogCaptureFixture,
) -> None:
    otel = Otel()
    previous = propagate.get_global_textmap()
    propagate.set_global_textmap(_BrokenPropagator())
    telemetry.configure(otel.tracer_provider, otel.meter_provider)
    try:
        stream = stream_factory()
        handled: list[Record] = []
        [record] = publish(cluster, stream, 1)
        with Subscriber(cluster, SubscriberConfig(stream=stream)) as sub:
            sub.seek(0)
            sub.attach_receiver(handled.append)
            eventually(lambda: len(handled) == 1, timeout_s=60)
    finally:
        propagate.set_global_textmap(previous)
        telemetry.configure()
    assert record.offset == 0 and record.headers == []
    assert handled == [record]
    assert "telemetry: send failed" in caplog.text
    assert "broken propagator" in caplog.text
