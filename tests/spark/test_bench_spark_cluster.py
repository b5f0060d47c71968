"""The Spark cluster benchmark runs end to end on a tiny workload (numbers are not judged here)."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import bench_spark_cluster, run_all
from bolide.facade import Cluster
from tests.conftest import PG_ADMIN_URL
from tests.spark.conftest import Sessions

pytestmark = [pytest.mark.spark]


def _positive(value: object) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.postgres
@pytest.mark.timeout(1800)  # a hang guard: on a loaded machine it takes 15 minutes
def test_cluster_benchmark_reports_every_row_with_1_and_2_workers(
    cluster: Cluster, spark_sessions: Sessions, capsys: pytest.CaptureFixture[str]
) -> None:
    if cluster.settings:
        pytest.skip("the benchmark's --bootstrap carries no security settings")
    spark_sessions.stop()  # one SparkContext per process: the benchmark starts its own
    argv = ["--bootstrap", cluster.bootstrap_servers, "--db", PG_ADMIN_URL, "--quick", "--json"]
    assert bench_spark_cluster.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    results = doc["results"]
    for workers in ("1", "2"):
        rates = results["workers"][workers]
        assert set(rates) == {bench_spark_cluster.READ, bench_spark_cluster.ARCHIVE}
        assert all(_positive(v) for v in rates.values()), (workers, rates)
    assert _positive(results["archiver_rows_per_s"])
    assert [m["records"] for m in results["memory"]] == [100, 400]
    for probe in results["memory"]:
        assert _positive(probe["python_mib"]) and _positive(probe["jvm_mib"]), probe
    assert len(results["load_average"]["start"]) == len(results["load_average"]["end"]) == 3
    ratios = {(r["metric"], r["reference"]): r for r in doc["ratios"]}
    assert len(ratios) == 3 and all(_positive(r["ratio"]) for r in ratios.values())
    assert "spark_cluster" in run_all.available() and "spark_cluster" in run_all.KNOWN


def test_cluster_benchmark_refuses_a_store_the_executors_cannot_share(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert bench_spark_cluster.main(["--db", "sqlite:///history.db", "--quick"]) == 2
    assert "--db must be a PostgreSQL URL" in capsys.readouterr().err


@pytest.mark.kafka
def test_run_all_skips_it_without_postgresql(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--only", "spark_cluster", "--pg", "", "--quick", "--bootstrap"]
    assert run_all.main([*argv, cluster.bootstrap_servers]) == 0
    assert "skipped spark_cluster: needs PostgreSQL" in capsys.readouterr().err
