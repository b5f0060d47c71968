"""The asyncio benchmark runs end to end on a tiny workload (numbers are not judged here)."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import bench_aio
from benchmarks._common import Context
from bolide.facade import Cluster

_TINY = bench_aio.QUICK


@pytest.mark.kafka
@pytest.mark.slow
def test_aio_benchmark_json_and_table(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    if cluster.settings:
        pytest.skip("the benchmark's --bootstrap carries no security settings")
    assert bench_aio.main(["--bootstrap", cluster.bootstrap_servers, "--json", *_TINY]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["benchmark"] == "aio"
    metrics = [r["metric"] for r in doc["rows"]]
    assert metrics[:4] == [
        "publish (no wait per record)",
        "publish, awaiting each ack",
        "poll, max_batch=1000",
        "poll, max_batch=10",
    ]
    assert any(m.startswith("3 subscribers: deliveries") for m in metrics)
    for row in doc["rows"]:
        if row["unit"] in {"records/s", "deliveries/s"}:
            assert math.isfinite(row["ratio"]) and row["sync"] > 0 and row["aio"] > 0, row
    rows = [
        bench_aio.Row(**{k: r[k] for k in ("metric", "unit", "sync", "aio", "higher_is_better")})
        for r in doc["rows"]
    ]
    lines = bench_aio.table(rows).splitlines()
    assert "asyncio/sync" in lines[0] and len(lines) == 2 + len(rows)


@pytest.mark.kafka
@pytest.mark.slow
def test_aio_benchmark_takes_part_in_run_all(cluster: Cluster) -> None:
    report = bench_aio.bench(Context(cluster, "the session's broker", quick=True))
    assert report.title.startswith("asyncio") and "asyncio/sync" in report.table
    assert {r.metric for r in report.ratios} >= {
        "publish (no wait per record)",
        "poll, max_batch=1000",
    }
    assert all(r.reference_value > 0 and r.bolide_value > 0 for r in report.ratios)
