"""What OpenTelemetry costs on the publish and poll paths, side by side in one run.

Five modes, each in a fresh interpreter, interleaved per repeat on one broker: ``off`` (the
``otel`` extra hidden from the import system: ``TELEMETRY is None``), ``import`` (the API
imported but bolide's hooks bypassed in this benchmark's process: what importing
OpenTelemetry costs by itself), ``api`` (installed, no SDK: the global no-op providers),
``sdk`` (the SDK's tracer and meter providers set, every
trace sampled, spans batched to an exporter that drops them) and ``sdk-1%`` (the same with
``ParentBased(TraceIdRatioBased(0.01))``: one trace in a hundred recorded). Each child
publishes ``--records`` records of 100 B with ``publish_async`` and reads them back with an
ungrouped subscriber; the median of the repeats is reported with its ratio to ``off``.

    python -m benchmarks.bench_telemetry [--records 20000] [--repeat 3] [--json]
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/bench_x.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import statistics
import subprocess
import time
import uuid
from typing import Any

from benchmarks._common import Command, Context, Report, markdown_table, positive_int

__all__ = ["MODES", "bench", "main"]

NAME = "telemetry"
MODES = ("off", "import", "api", "sdk", "sdk-1%")

_HIDE_OTEL = """
import sys
from importlib.abc import MetaPathFinder

class _NoOtel(MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NoOtel())
"""


def _child(mode: str, bootstrap: str, records: int) -> dict[str, float]:
    """Publish and read back ``records`` records in this interpreter; return the timings."""
    if mode.startswith("sdk"):
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        class Drop(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        ratio = 0.01 if mode == "sdk-1%" else 1.0
        provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
        provider.add_span_processor(BatchSpanProcessor(Drop()))
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    from bolide.facade import (
        Cluster,
        Publisher,
        PublisherConfig,
        Record,
        StreamConfig,
        Subscriber,
        SubscriberConfig,
        telemetry,
    )

    assert telemetry.enabled() == (mode != "off")
    if mode == "import":  # measure the import alone: the hooks see no instrumentation
        import bolide.facade.publisher
        import bolide.facade.subscriber

        vars(bolide.facade.publisher)["TELEMETRY"] = None
        vars(bolide.facade.subscriber)["TELEMETRY"] = None
    cluster = Cluster(bootstrap, fetch_gap_settle_ms=500)
    stream = StreamConfig(name=f"bench-otel-{mode.rstrip('%')}-{uuid.uuid4().hex[:8]}")
    payload = b"x" * 100
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        pub.publish(Record(payload))  # the topic and the connection are ready
        started = time.perf_counter()
        futures = [pub.publish_async(Record(payload)) for _ in range(records)]
        pub.flush(120)
        for f in futures:
            f.result(120)
        publish_s = time.perf_counter() - started
    with Subscriber(cluster, SubscriberConfig(stream=stream)) as sub:
        sub.seek(1)
        read = 0
        started = time.perf_counter()
        while read < records:
            read += len(sub.poll(1000))
        poll_s = time.perf_counter() - started
    return {"publish_per_s": records / publish_s, "poll_per_s": records / poll_s}


def _run(mode: str, bootstrap: str, records: int) -> dict[str, float]:
    code = (_HIDE_OTEL if mode == "off" else "") + (
        "import json, benchmarks.bench_telemetry as b\n"
        f"print(json.dumps(b._child({mode!r}, {bootstrap!r}, {records})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=900, check=False
    )
    if done.returncode:
        raise RuntimeError(f"the {mode} run failed: {done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--records", type=positive_int, default=20_000, help="records per run")
    parser.add_argument("--repeat", type=positive_int, default=3, help="runs per mode")


def _measure(context: Context, args: argparse.Namespace) -> Report:
    """The median of each mode's runs, and its ratio to ``off`` (no targets)."""
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for i in range(args.repeat):
        context.say(NAME, f"run {i + 1}/{args.repeat} of every mode")
        for mode in MODES:  # interleaved: load from other jobs hits every mode alike
            runs[mode].append(_run(mode, context.cluster.bootstrap_servers, args.records))
    rows: list[dict[str, Any]] = []
    for metric in ("publish_per_s", "poll_per_s"):
        base = statistics.median(r[metric] for r in runs["off"])
        for mode in MODES:
            value = statistics.median(r[metric] for r in runs[mode])
            rows.append({"metric": metric, "mode": mode, "per_s": value, "ratio": value / base})
    title = (
        f"telemetry: {args.records} records of 100 B, median of {args.repeat} runs per mode, "
        f"{context.broker}"
    )
    table = [
        (r["metric"].removesuffix("_per_s"), r["mode"], f"{r['per_s']:,.0f}", f"{r['ratio']:.2f}")
        for r in rows
    ]
    text = markdown_table(("path", "mode", "records/s", "vs off"), table)
    return Report(title, text, [], {"records": args.records, "repeat": args.repeat, "rows": rows})


#: ``--quick``: 500 records, one run of each mode.
COMMAND = Command(NAME, _measure, _options, ["--records", "500", "--repeat", "1"], __doc__)

bench = COMMAND.bench
main = COMMAND.main


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
