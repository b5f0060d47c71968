"""The parallel benchmark runs end to end on a tiny workload (numbers are not judged here)."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import bench_parallel, run_all
from benchmarks._common import Context
from bolide.facade import Cluster

pytestmark = pytest.mark.kafka

_TINY = [
    "--concurrency", "4", "--io-seconds", "0.05", "--sleep-ms", "1",
    "--cpu-records", "300", "--repeat", "1", "--cpu-repeat", "1",
]  # fmt: skip


def test_parallel_benchmark_json(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    if cluster.settings:
        pytest.skip("the benchmark's --bootstrap carries no security settings")
    code = bench_parallel.main(["--bootstrap", cluster.bootstrap_servers, "--json", *_TINY])
    doc = json.loads(capsys.readouterr().out)
    assert code == (0 if doc["met"] else 1)
    assert doc["benchmark"] == "parallel"
    rows = {(r["handler"], r["concurrency"]): r for r in doc["rows"]}
    assert set(rows) == {("sleep 1 ms", 1), ("sleep 1 ms", 4), ("no work", 1), ("no work", 32)}
    for row in rows.values():
        assert math.isfinite(row["value"]) and row["value"] > 0
        assert math.isfinite(row["ratio"]) and row["ratio"] > 0
    assert rows[("sleep 1 ms", 4)]["target"] == ">= 0.8"
    assert "parallel" in run_all.KNOWN and "parallel" in run_all.available()


def test_parallel_benchmark_reports_its_ratios(cluster: Cluster) -> None:
    report = bench_parallel.bench(Context(cluster, "test broker", quick=True))
    ratios = {r.metric: r for r in report.ratios}
    assert set(ratios) == {"sleep handler, concurrency 8", "no-work handler, concurrency 32"}
    assert ratios["sleep handler, concurrency 8"].target == bench_parallel.IO_TARGET
    no_work = ratios["no-work handler, concurrency 32"]
    assert no_work.target == 1.0
    rows = {(r["handler"], r["concurrency"]): r for r in report.data["rows"]}
    # The summary's verdict is the table's: time at 32 <= 1.2 x time at 1.
    assert no_work.met == rows[("no work", 32)]["met"]
    assert "| no work" in report.table
