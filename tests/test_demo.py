"""``bolide demo --quick --json`` as a newcomer runs it, with its claims checked twice.

Once in the summary it prints, and once independently: the archive it leaves behind is read
back from SQLite and decoded, and every symbol's orders must be there, in order, per partition.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bolide.demo.orders import ORDER_SCHEMA, SYMBOLS
from bolide.demo.report import console_hint
from bolide.facade import AvroSerde
from bolide.stores import SqlStore

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    workdir = tmp_path_factory.mktemp("demo")
    done = subprocess.run(
        [sys.executable, "-m", "bolide.cli.main", "demo", "--quick", "--json",
         "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        # The README's command as a newcomer runs it: its own broker and SQLite file.
        env={k: v for k, v in os.environ.items() if k not in ("BOLIDE_BOOTSTRAP", "BOLIDE_DB")},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), workdir


def test_every_check_passed(demo: tuple[dict[str, Any], Path]) -> None:
    summary, _ = demo
    assert summary["ok"] is True
    assert len(summary["checks"]) >= 10
    assert all(summary["checks"].values()), summary["checks"]
    assert summary["elapsed_s"] > 0  # how long it takes is measured, not asserted (speed)
    assert summary["spark_archived"] is None  # --quick skips Spark


def test_counts_match(demo: tuple[dict[str, Any], Path]) -> None:
    s, _ = demo
    assert s["records"] == s["orders"] + s["block_parts"] > 3_000
    assert s["processed"] == s["records"] == s["archived"] == s["typed_rows"]
    assert sum(s["processed_by_member"].values()) == s["processed"]
    assert len(s["processed_by_member"]) == s["members"] == 3
    assert s["publishers"] == 3 and s["symbols"] == 12 and s["partitions"] == 4
    assert s["publish_rate_per_s"] > 0


def test_durable_replay_equals_what_was_missed(demo: tuple[dict[str, Any], Path]) -> None:
    s, _ = demo
    assert s["durable_state"] == "resumed"
    assert s["replayed"] == s["missed"] > 0
    assert s["live_after_reconnect"] > 0
    assert s["missed"] + s["live_after_reconnect"] < s["records"]  # missed only the away part


def test_failover_and_resequencing(demo: tuple[dict[str, Any], Path]) -> None:
    s, _ = demo
    assert s["left_member"] == "trader-3"
    assert s["moved_partitions"]
    assert s["failover_s"] > 0
    assert s["order_violations"] == []
    assert s["blocks"] == 8 and 0 < s["blocks_out_of_order"] < s["blocks"]


def test_queries_over_the_archive(demo: tuple[dict[str, Any], Path]) -> None:
    s, _ = demo
    per_partition, groups, blocks, typed = s["queries"]
    assert sum(row[1] for row in per_partition["rows"]) == s["records"]
    assert {row[0] for row in groups["rows"]} <= set(SYMBOLS)
    assert all(row[1] >= 3 for row in blocks["rows"])  # every block has 3 to 5 parts
    assert typed["columns"] == ["symbol", "side", "orders", "volume", "avg_price"]
    assert len(typed["rows"]) == 6


def test_the_archive_itself_holds_every_symbol_in_order(
    demo: tuple[dict[str, Any], Path],
) -> None:
    s, workdir = demo
    with SqlStore(f"sqlite:///{workdir / 'bolide-demo.db'}") as store:
        serde = AvroSerde(ORDER_SCHEMA, registry=store)
        seqs: dict[str, list[int]] = defaultdict(list)
        partition_of: dict[str, set[int]] = defaultdict(set)
        total = 0
        for p in range(s["partitions"]):
            for record in store.read(s["stream"], p, 0, 100_000):
                total += 1
                order = serde.decode(record.data, stream=s["stream"], partition=p, offset=0)
                if order["block_id"] is None:
                    seqs[order["symbol"]].append(order["seq"])
                    partition_of[order["symbol"]].add(p)
    assert total == s["records"]
    assert sum(len(v) for v in seqs.values()) == s["orders"]
    for symbol, numbers in seqs.items():
        assert numbers == list(range(len(numbers))), symbol  # one partition, in order
        assert len(partition_of[symbol]) == 1, symbol  # a message group stays on its partition


def test_the_report_ends_with_how_to_open_the_console() -> None:
    """On a broker that stays (``-b``, ``--workdir``): the command that opens the console on
    the demo's data; on its own embedded broker, which is gone once it ends: how to run it
    on one that stays."""
    kept = SimpleNamespace(
        workdir=Path("demo"), embedded=False, bootstrap="kafka-1:9092",
        db="sqlite:///demo/bolide-demo.db",
    )  # fmt: skip
    assert console_hint(kept) == (  # type: ignore[arg-type]
        "open it in the web console: bolide console -b kafka-1:9092 "
        "--db sqlite:///demo/bolide-demo.db"
    )
    gone = SimpleNamespace(workdir=None, embedded=True, bootstrap="127.0.0.1:1", db="x")
    hint = console_hint(gone)  # type: ignore[arg-type]
    assert "bolide broker --port 9092" in hint and "bolide console -b 127.0.0.1:9092" in hint
