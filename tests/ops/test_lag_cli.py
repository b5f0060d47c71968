"""``bolide lag``, ``bolide groups`` and ``bolide topics`` as real subprocesses, on the
session's broker and PostgreSQL."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from bolide.facade import Cluster, Record, StreamConfig, Subscriber, SubscriberConfig
from bolide.facade.ops import lag_report
from bolide.stores import Archiver, SqlStore
from tests.conftest import eventually, upgraded_db_url
from tests.durable.conftest import Events
from tests.ops.conftest import bolide, lagging_group, publish

pytestmark = pytest.mark.kafka


def test_lag_json_gives_exact_figures(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory()
    publish(cluster, stream, 10)
    group = lagging_group(cluster, stream, read=4, confirm=4)

    both = ["--group", group, "--stream", stream.name]
    for scope in (both[:2], both[2:], both):
        run = bolide("lag", *scope, "--json", cluster=cluster)
        assert run.returncode == 0, run.stderr
        report = json.loads(run.stdout)
        assert report["partitions"] == [
            {
                "group": group,
                "stream": stream.name,
                "partition": 0,
                "committed": 4,
                "log_start": 0,
                "log_end": 10,
                "lag": 6,
                "member_id": None,
                "client_id": None,
                "host": None,
            }
        ], scope
        assert report["max_lag"] == 6
        assert [g["group"] for g in report["groups"]] == [group]
        assert report["archive"] == [] and report["durable"] == []

    text = bolide("lag", "--group", group, cluster=cluster)
    assert text.returncode == 0, text.stderr
    header, _, row = text.stdout.splitlines()[:3]
    assert [c.strip() for c in header.split(" | ")][:6] == [
        "GROUP", "STREAM", "PARTITION", "COMMITTED", "LOG-END", "LAG"
    ]  # fmt: skip
    assert [c.strip() for c in row.split(" | ")][:6] == [group, stream.name, "0", "4", "10", "6"]


def test_fail_over_exit_codes(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory()
    publish(cluster, stream, 10)
    group = lagging_group(cluster, stream, read=4, confirm=4)

    within = bolide("lag", "--group", group, "--fail-over", "6", cluster=cluster)
    assert within.returncode == 0, within.stderr
    assert within.stderr == ""
    over = bolide("lag", "--group", group, "--fail-over", "5", "--json", cluster=cluster)
    assert over.returncode == 1
    assert json.loads(over.stdout)["max_lag"] == 6  # the figures are printed all the same
    assert f"over 5: group {group} on {stream.name}[0]: lag 6" in over.stderr
    assert bolide("lag", "--group", group, "--fail-over", "-1", cluster=cluster).returncode == 2
    missing = bolide("lag", "--group", group)
    assert missing.returncode == 2 and "--bootstrap" in missing.stderr
    bad = bolide("lag", "--group", group, "-X", "no.such.setting=1", cluster=cluster)
    assert bad.returncode == 2 and "no.such.setting" in bad.stderr
    unreachable = bolide("lag", "--bootstrap", "127.0.0.1:1", "-X", "socket.timeout.ms=1000")
    assert unreachable.returncode == 1 and unreachable.stderr.startswith("bolide: error:")


def test_nothing_to_report(cluster: Cluster, stream_factory: Callable[..., StreamConfig]) -> None:
    stream = stream_factory()
    publish(cluster, stream, 3)
    run = bolide("lag", "--stream", stream.name, "--fail-over", "0", cluster=cluster)
    assert (run.returncode, run.stdout.strip()) == (
        0,
        "no lag to report (no group reads these streams)",
    )
    # Both named: the group's lag counts from the log start, as its members would read.
    fresh = f"g-{uuid.uuid4().hex[:8]}"
    named = bolide("lag", "--group", fresh, "--stream", stream.name, "--json", cluster=cluster)
    rows = json.loads(named.stdout)["partitions"]
    assert [(r["committed"], r["log_end"], r["lag"]) for r in rows] == [(None, 3, 3)]


@pytest.mark.postgres
def test_archive_lag_after_a_partial_archive(
    cluster: Cluster,
    stream_factory: Callable[..., StreamConfig],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    url = upgraded_db_url("postgresql", tmp_path, request)
    stream = stream_factory()
    publish(cluster, stream, 6)
    group = f"arch-{uuid.uuid4().hex[:8]}"
    with SqlStore(url) as store:
        config = {"session.timeout.ms": 4000, "heartbeat.interval.ms": 500}
        stats = Archiver(cluster, store, [stream], group=group, consumer_config=config).run()
        assert stats.records == 6
    publish(cluster, stream, 4, start=6)

    run = bolide("lag", "--stream", stream.name, "--store", url, "--json", cluster=cluster)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["archive"] == [
        {
            "stream": stream.name,
            "partition": 0,
            "archived": 5,
            "position": 6,
            "log_end": 10,
            "lag": 4,
        }
    ]
    # The archiver's own group lags by as much: its offsets follow the database commit.
    assert [(r["group"], r["committed"], r["lag"]) for r in report["partitions"]] == [(group, 6, 4)]
    text = bolide("lag", "--stream", stream.name, "--db", url, "--fail-over", "3", cluster=cluster)
    assert text.returncode == 1
    assert f"archive of {stream.name}[0]: lag 4" in text.stderr
    assert "ARCHIVE" in text.stdout and "POSITION" in text.stdout


@pytest.mark.postgres
@pytest.mark.slow
def test_a_durable_clients_backlog_while_away(
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
    sub = durable(stream, f"ops-{uuid.uuid4().hex[:6]}", url, on_live=events.on_live)
    events.drain(sub, lambda: events.live_count() == 1 and len(events.records()) == 5)
    sub.poll(100)  # the batch before is finished: close keeps its position
    sub.close()
    publish(cluster, stream, 7, start=5)

    run = bolide("lag", "--stream", stream.name, "--db", url, "--json", cluster=cluster)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    [client] = report["durable"]
    assert client["durable_id"] == sub.config.durable_id
    assert (client["state"], client["backlog"]) == ("away", 7)
    assert client["backlog_by_partition"] == {stream.name: {"0": 7}}
    rows = [(r["group"], r["committed"], r["lag"]) for r in report["partitions"]]
    assert rows == [(client["group"], 5, 7)]
    over = bolide("lag", "--stream", stream.name, "--db", url, "--fail-over", "6", cluster=cluster)
    assert over.returncode == 1
    assert f"durable client {client['durable_id']} (away): backlog 7" in over.stderr


def test_groups_and_topics(cluster: Cluster, stream_factory: Callable[..., StreamConfig]) -> None:
    stream = stream_factory(partitions=2, global_order=False)
    publish(cluster, stream, 10)
    report = lag_report(cluster, streams=[stream.name], all_streams=True)
    assert sum(e for (s, _), e in report.ends.items() if s == stream.name) == 10
    group = f"g-{uuid.uuid4().hex[:10]}"
    config = SubscriberConfig(stream=stream, group=group, lease_timeout_ms=4000)
    with Subscriber(cluster, config) as sub:
        got: list[Record] = []
        eventually(lambda: got.extend(sub.poll(200)) or len(got) == 10, timeout_s=60)
        # One publisher's records share a partition (its key); confirm there only.
        held = got[0].partition or 0
        first = 1 + max(r.offset or 0 for r in got if r.partition == held)
        sub.confirm(first - 1, partition=held)
        eventually(lambda: sub.committed()[held] == first, timeout_s=30)

    topics = bolide("topics", stream.name, "--json", cluster=cluster)
    assert topics.returncode == 0, topics.stderr
    [topic] = json.loads(topics.stdout)
    assert topic["topic"] == stream.name and topic["records"] == 10
    assert [p["partition"] for p in topic["partitions"]] == [0, 1]
    assert sum(p["log_end"] for p in topic["partitions"]) == 10
    described = bolide("topics", stream.name, cluster=cluster)
    assert f"topic {stream.name}: 2 partitions, 10 records" in described.stdout
    assert "LOG-START" in described.stdout and "settings:" in described.stdout
    listed = bolide("topics", cluster=cluster)
    line = next(x for x in listed.stdout.splitlines() if x.startswith(stream.name + " "))
    assert [c.strip() for c in line.split("|")] == [stream.name, "2", "10"]
    missing = bolide("topics", f"no-such-{uuid.uuid4().hex[:6]}", cluster=cluster)
    assert missing.returncode == 1 and "no such topic" in missing.stderr

    groups = bolide("groups", "--json", cluster=cluster)
    assert groups.returncode == 0, groups.stderr
    mine = next(g for g in json.loads(groups.stdout) if g["group"] == group)
    assert mine["streams"] == [stream.name]
    assert mine["committed"] == [{"stream": stream.name, "partition": held, "offset": first}]
    one = json.loads(bolide("groups", group, "--json", cluster=cluster).stdout)
    [g] = one
    ends = {p["partition"]: p["log_end"] for p in topic["partitions"]}
    assert [(r["partition"], r["committed"], r["lag"]) for r in g["lag"]] == [
        (p, first, ends[p] - first) if p == held else (p, None, ends[p]) for p in (0, 1)
    ]
    text = bolide("groups", group, cluster=cluster)
    assert text.stdout.startswith(f"group {group}: ")
    assert "COMMITTED" in text.stdout
    table = bolide("groups", cluster=cluster)
    row = next(x for x in table.stdout.splitlines() if x.startswith(group + " "))
    assert row.split("|")[-1].strip() == stream.name


@pytest.mark.parametrize("command", [["lag"], ["groups"], ["topics"], ["top"]], ids=" ".join)
def test_help(command: list[str]) -> None:
    run = bolide(*command, "--help")
    assert run.returncode == 0
    assert run.stdout.startswith(f"usage: bolide {command[0]}")
    assert "-X KEY=VALUE" in run.stdout and "--json" in run.stdout


def test_owner_is_the_member_holding_the_partition(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], embedded_broker: bool
) -> None:
    if embedded_broker:
        pytest.skip("the embedded broker's DescribeGroups reports no members (compatibility.md)")
    stream = stream_factory()
    publish(cluster, stream, 3)
    group = f"g-{uuid.uuid4().hex[:10]}"
    config = SubscriberConfig(stream=stream, group=group, lease_timeout_ms=10_000)
    with Subscriber(cluster, config) as sub:
        sub.attach_receiver(lambda record: None)  # keeps polling: the lease stays held
        eventually(lambda: sub.health(lag=False).lease_held, timeout_s=60)
        run = bolide("lag", "--group", group, "--json", cluster=cluster)
        assert run.returncode == 0, run.stderr
        [row] = json.loads(run.stdout)["partitions"]
        assert row["client_id"] == f"bolide-sub-{stream.name}" and row["member_id"]
        groups = json.loads(bolide("groups", group, "--json", cluster=cluster).stdout)
        [member] = groups[0]["members"]
        assert member["assignment"] == [{"stream": stream.name, "partition": 0}]
