"""The facade benchmark runs end to end on a tiny workload (numbers are not judged here)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import bench_eos, bench_facade, bench_load, run_all
from bolide.facade import Cluster
from bolide.facade.cli.main import main as cli_main

_TINY = ["--count", "200", "--repeat", "1", "--latency-samples", "5", "--round-trips", "5"]

_EXPECTED = {
    ("publish", 100),
    ("publish_many", 100),
    ("produce", 100),
    ("poll", 100),
    ("publish", 1024),
    ("publish_many", 1024),
    ("produce", 1024),
    ("poll", 1024),
    ("latency p50", 100),
    ("latency p99", 100),
    ("latency p50", 1024),
    ("latency p99", 1024),
    *((f"round trip {q}", 100) for q in ("min", "p50", "p95", "p99", "max")),
}

_ROW_FIELDS = ("metric", "payload", "unit", "raw", "bolide", "higher_is_better")


def _check_numbers(rows: list[dict[str, object]]) -> None:
    assert {(r["metric"], r["payload"]) for r in rows} == _EXPECTED
    for row in rows:
        for field in ("raw", "bolide", "ratio"):
            value = row[field]
            assert isinstance(value, float) and math.isfinite(value) and value > 0, (row, field)


@pytest.mark.kafka
@pytest.mark.slow
def test_facade_benchmark_json_and_table(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    if cluster.settings:
        pytest.skip("the benchmark's --bootstrap carries no security settings")
    assert bench_facade.main(["--bootstrap", cluster.bootstrap_servers, "--json", *_TINY]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["benchmark"] == "facade"
    assert doc["machine"]["librdkafka"] and doc["machine"]["python"]
    _check_numbers(doc["rows"])

    rows = [bench_facade.Row(**{k: r[k] for k in _ROW_FIELDS}) for r in doc["rows"]]
    lines = bench_facade.table(rows).splitlines()
    assert lines[0].startswith("| metric") and "bolide/raw" in lines[0]
    assert len(lines) == 2 + len(_EXPECTED)
    assert any(line.startswith("| publish ") and "100 B" in line for line in lines)
    assert any(line.startswith("| round trip p99 ") for line in lines)


@pytest.mark.kafka
@pytest.mark.slow
def test_load_benchmark_reports_latency_percentiles(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    if cluster.settings:
        pytest.skip("the benchmark's --bootstrap carries no security settings")
    tiny = ["--seconds", "1", "--rate", "100", "--publishers", "1", "--subscribers", "1"]
    argv = ["--bootstrap", cluster.bootstrap_servers, "--json", *tiny, "--warmup-s", "0"]
    assert bench_load.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["benchmark"] == "load" and doc["records"] >= 1
    for span in ("whole_ms", "after_warmup_ms"):
        assert set(doc[span]) == {"min", "p50", "p95", "p99", "max"}
        assert all(math.isfinite(v) and v > 0 for v in doc[span].values()), doc[span]
    assert "load" in run_all.available() and "load" in run_all.KNOWN


@pytest.mark.kafka
@pytest.mark.postgres
@pytest.mark.slow
def test_exactly_once_benchmark_reports_ratios(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    if cluster.settings:
        pytest.skip("the benchmark's --bootstrap carries no security settings")
    tiny = ["--records", "200", "--batch", "100", "--txn-size", "100", "--repeat", "1"]
    assert bench_eos.main(["--bootstrap", cluster.bootstrap_servers, "--json", *tiny]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["benchmark"] == "eos"
    assert {(r["measure"].split(",")[0], r["database"]) for r in doc["rows"]} == {
        ("publish", "-"),
        ("read-process-publish", "-"),
        ("insert + confirm", "sqlite"),
        ("insert + confirm", "postgresql"),
    }
    for row in doc["rows"]:
        assert all(math.isfinite(row[k]) and row[k] > 0 for k in ("baseline_rec_s", "eos_rec_s"))
    assert "eos" in run_all.available() and "eos" in run_all.KNOWN


def test_runner_notes_missing_benchmarks_and_rejects_unknown_names(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run_all.main(["--only", "no-such-bench"]) == 2
    assert "unknown benchmark no-such-bench" in capsys.readouterr().err
    code, _, skipped = run_all._run_one("no-such-bench", [], capture=True)
    assert code == 0 and skipped == "benchmarks/bench_no-such-bench.py is not present"
    assert "facade" in run_all.available()


def test_bench_command_explains_a_missing_benchmarks_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["bench", "--dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "no benchmarks found" in err and "source checkout" in err
