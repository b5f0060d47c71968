"""The peers benchmark runs end to end on a tiny workload (its figures are not judged here)."""

from __future__ import annotations

import sys

import pytest

from benchmarks import bench_peers
from benchmarks._common import Context, Ratio
from bolide.cli.main import main as cli_main
from bolide.facade import Cluster

_PEERS = [
    "confluent-kafka",
    "aiokafka",
    "kafka-python",
    "FastStream (confluent)",
    "FastStream (aiokafka)",
]
_PUBLISHERS = [
    "bolide publish_async",
    "bolide publish_many",
    "bolide publish_async (Quix's settings)",
    *_PEERS,
    "Quix Streams (its defaults)",
    "Quix Streams (bolide's settings)",
]
_CONSUMERS = ["bolide poll", *_PEERS, "Quix Streams (StreamingDataFrame)"]
#: Tansu refuses aiokafka's idempotent producer id; FastStream's aiokafka broker then leaves
#: that producer's connection for the garbage collector (a failed row, not a bolide leak).
_PEER_LEAKS = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _needs_peers(cluster: Cluster) -> None:
    for module in bench_peers.PEERS:
        pytest.importorskip(module, reason="the peers come with pip install 'bolide[bench]'")
    if cluster.settings:
        pytest.skip("the peers are given bootstrap servers only, no security settings")


def _quick(cluster: Cluster) -> tuple[list[dict[str, object]], list[Ratio]]:
    report = bench_peers.bench(Context(cluster, "the test broker", quick=True))
    assert report.title.startswith("peers: bolide vs the Python Kafka clients (500 records")
    rows: list[dict[str, object]] = report.data["rows"]
    assert [(r["work"], r["client"]) for r in rows] == [
        *(("publish", c) for c in _PUBLISHERS),
        *(("consume", c) for c in _CONSUMERS),
    ]
    lines = report.table.splitlines()
    assert len(lines) == 2 + len(rows) and "bolide/client" in lines[0]
    return rows, report.ratios


def _check_ratios(rows: list[dict[str, object]], ratios: list[Ratio]) -> None:
    """One ratio per measured client: bolide's per-record figure over that client's, bolide's
    with Quix's settings for Quix with its own."""
    rate = {(r["work"], r["client"]): r["rate"] for r in rows}
    measured = {
        (r["work"], r["client"]): r["rate"]
        for r in rows
        if r["rate"] is not None and not str(r["client"]).startswith("bolide")
    }
    assert {(r.metric.split()[0], r.reference) for r in ratios} == set(measured)
    for ratio in ratios:
        work = ratio.metric.split()[0]
        assert ratio.reference_value == measured[(work, ratio.reference)]
        ours = "bolide poll" if work == "consume" else "bolide publish_async"
        if ratio.reference == "Quix Streams (its defaults)":
            ours = "bolide publish_async (Quix's settings)"
        assert ratio.bolide_value == rate[(work, ours)]
        assert ratio.target == (0.9 if ratio.reference == "confluent-kafka" else 1.0)


@pytest.mark.kafka
@pytest.mark.slow
@_PEER_LEAKS
def test_every_client_does_the_same_work(cluster: Cluster, embedded_broker: bool) -> None:
    _needs_peers(cluster)
    rows, ratios = _quick(cluster)
    for row in rows:
        if str(row["client"]).startswith(("bolide", "confluent")) or not embedded_broker:
            # Apache Kafka 4 speaks to every peer; Tansu may refuse one (a skipped row).
            assert isinstance(row["rate"], float) and row["rate"] > 0, row
            assert row["skipped"] == ""
        else:
            assert row["rate"] is not None or str(row["skipped"]).startswith("failed: "), row
    _check_ratios(rows, ratios)


@pytest.mark.kafka
@pytest.mark.slow
@_PEER_LEAKS
def test_a_missing_peer_is_a_skipped_row(
    cluster: Cluster, embedded_broker: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    _needs_peers(cluster)
    monkeypatch.setitem(sys.modules, "kafka", None)  # kafka-python cannot be imported

    def no_quix() -> None:
        raise RuntimeError("could not set up quixstreams: no index")

    monkeypatch.setattr(bench_peers, "quix_python", no_quix)
    rows, ratios = _quick(cluster)
    skipped = [r for r in rows if r["rate"] is None]
    missing = [r for r in skipped if r["client"] == "kafka-python"]
    assert [r["work"] for r in missing] == ["publish", "consume"]
    assert all(
        r["skipped"] == "not installed (kafka): pip install 'bolide[bench]'" for r in missing
    )
    no_venv = [r for r in skipped if str(r["client"]).startswith("Quix")]
    assert [r["client"] for r in no_venv] == [*_PUBLISHERS[-2:], _CONSUMERS[-1]]
    assert {r["skipped"] for r in no_venv} == {"could not set up quixstreams: no index"}
    if not embedded_broker:
        # every other client measured
        assert {(r["work"], r["client"]) for r in skipped} == {
            (r["work"], r["client"]) for r in missing + no_venv
        }
    assert not {"kafka-python", *_PUBLISHERS[-2:]} & {r.reference for r in ratios}
    _check_ratios(rows, ratios)


def test_peers_flag_names_the_extra_when_a_peer_is_missing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "faststream", None)  # FastStream cannot be imported
    assert bench_peers.missing_peers()[-1:] == ["faststream"]
    assert cli_main(["bench", "--peers"]) == 1
    err = capsys.readouterr().err
    assert "faststream" in err and "pip install 'bolide[bench]'" in err
