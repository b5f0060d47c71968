"""``bolide durable list`` and ``bolide durable expire`` as real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from bolide.facade import Cluster, StreamConfig, Subscriber
from tests.durable.conftest import Events, publish
from tests.durable.test_durable import committed, go_live


def bolide(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bolide.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,  # a guard against a hang, not a speed limit
        check=False,
    )


@pytest.mark.kafka
@pytest.mark.tansu
@pytest.mark.slow
def test_list_then_expire(
    cluster: Cluster,
    stream_factory: Callable[..., StreamConfig],
    durable: Callable[..., Subscriber],
    sqlite_url: str,
) -> None:
    stream = stream_factory()
    # cli-a stays away well within its timeout however slow the CLI runs; cli-b expires.
    for durable_id, timeout_s in (("cli-a", 3_600.0), ("cli-b", 1.0)):
        events = Events()
        sub = durable(
            stream, durable_id, sqlite_url, durable_timeout_s=timeout_s, on_live=events.on_live
        )
        go_live(sub, events)
        sub.close()
    publish(cluster, stream, 7, "away")
    time.sleep(1.2)
    where = ["--db", sqlite_url, "--bootstrap", cluster.bootstrap_servers]
    if cluster.fetch_gap_settle_ms:  # Tansu: log ends are confirmed by reading (docs/cli.md)
        where += ["-X", f"fetch_gap_settle_ms={cluster.fetch_gap_settle_ms}"]

    listed = bolide("durable", "list", *where, "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["durable_id"]: r for r in json.loads(listed.stdout)}
    assert set(rows) == {"cli-a", "cli-b"}
    assert rows["cli-a"]["state"] == "away" and rows["cli-b"]["state"] == "expired"
    assert rows["cli-a"]["backlog"] == 7 and rows["cli-b"]["backlog"] == 7
    assert rows["cli-a"]["streams"] == [stream.name]
    assert rows["cli-a"]["backlog_by_partition"] == {stream.name: {"0": 7}}
    table = bolide("durable", "list", *where)
    assert table.returncode == 0 and "BACKLOG" in table.stdout
    line = next(x for x in table.stdout.splitlines() if x.startswith("cli-a"))
    assert stream.name in line and line.split()[-1] == "7"

    expired = bolide("durable", "expire", *where)
    assert expired.returncode == 0, expired.stderr
    assert "expired cli-b" in expired.stdout and "cli-a" not in expired.stdout
    assert committed(cluster, "bolide-durable-cli-b", stream.name) == {}
    assert committed(cluster, "bolide-durable-cli-a", stream.name) == {0: 0}
    after = json.loads(bolide("durable", "list", *where, "--json").stdout)
    assert [r["durable_id"] for r in after] == ["cli-a"]
    again = bolide("durable", "expire", *where, "--json")
    assert again.returncode == 0 and json.loads(again.stdout) == []


def test_usage_errors_exit_2(tmp_path) -> None:  # type: ignore[no-untyped-def]
    missing = bolide("durable", "list", "--bootstrap", "127.0.0.1:1")
    assert missing.returncode == 2 and "--db" in missing.stderr
    bad = bolide("durable", "expire", "--db", "oracle://x", "--bootstrap", "127.0.0.1:1")
    assert bad.returncode == 2 and "not supported" in bad.stderr
