"""``bolide dlq`` through the real ``bolide`` entry point, on the session's broker."""

from __future__ import annotations

import json
import uuid

import pytest

from bolide.facade.deadletter import REPLAYED_FROM_HEADER
from tests.deadletters.conftest import ARCHIVE_ONLY, Letters, read_all
from tests.test_cli import bolide

pytestmark = [pytest.mark.kafka]


def _where(letters: Letters) -> list[str]:
    """``--db``, ``--bootstrap`` and, on Tansu, its fetch-gap window."""
    cluster = letters.cluster
    args = ["--db", letters.db_url, "--bootstrap", cluster.bootstrap_servers]
    if cluster.fetch_gap_settle_ms:
        args += ["-X", f"fetch_gap_settle_ms={cluster.fetch_gap_settle_ms}"]
    return args


def test_list_show_replay_purge(letters: Letters, stream_factory) -> None:
    dead, where = letters.dead.name, _where(letters)
    listed = bolide("dlq", "list", "--stream", dead, "--json", *where)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [r["id"] for r in rows] == [f"{dead}/0/{o}" for o in range(8)]
    assert sorted(r["reason"] for r in rows) == ["failed"] * 4 + ["undecodable"] * 4
    assert {r["source"] for r in rows} == {
        f"{letters.source.name}/0/{o}" for o in letters.failed | letters.undecodable
    }
    assert [r["archived"] for r in rows[:4]] == [True] * 4
    table = bolide("-v", "dlq", "list", "-t", dead, "--reason", "failed", *where)
    assert table.returncode == 0, table.stderr
    assert table.stdout.count(f"{dead}/0/") == 4 and "undecodable" not in table.stdout
    assert "(4 dead letters)" in table.stderr
    since = bolide(
        "dlq", "list", "-t", dead, "--since", str(letters.second_round_ms), "--json", *where
    )
    assert [r["id"] for r in json.loads(since.stdout)] == [f"{dead}/0/{o}" for o in range(4, 8)]

    first = rows[0]
    shown = bolide("dlq", "show", first["id"], "--json", *where)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == first
    text = bolide("dlq", "show", first["id"], *where)
    assert f"reason: {first['reason']}" in text.stdout and "headers:" in text.stdout

    replay = bolide("dlq", "replay", "-t", dead, "--where", "reason = 'failed'", "--json", *where)
    assert replay.returncode == 0, replay.stderr
    assert json.loads(replay.stdout)["replayed"] == 4
    assert "4/4 dead letters replayed" in replay.stderr
    again = bolide("dlq", "replay", "-t", dead, "--where", "reason = 'failed'", *where)
    assert again.returncode == 0 and f"replayed 0 dead letters of {dead}" in again.stdout
    other = stream_factory("cli-retry")
    to_other = bolide("dlq", "replay", "-t", dead, "--to", other.name, "--json", *where)
    assert json.loads(to_other.stdout) == {"stream": dead, "replayed": 8, "to": other.name}
    origins = {r.header(REPLAYED_FROM_HEADER) for r in read_all(letters.cluster, other)}
    assert origins == {r["id"].encode() for r in rows}

    purged = bolide("dlq", "purge", "-t", dead, "--reason", "undecodable", "--json", *where)
    assert purged.returncode == 0, purged.stderr
    assert json.loads(purged.stdout) == {"stream": dead, "purged": 4}
    left = json.loads(bolide("dlq", "list", "-t", dead, "--json", *where).stdout)
    assert [r["reason"] for r in left] == ["failed"] * 4
    assert [r["replayed_to"] for r in left] == [[letters.source.name, other.name]] * 4


def test_usage_and_runtime_errors(letters: Letters) -> None:
    dead, where = letters.dead.name, _where(letters)
    cases = [
        (["purge", "-t", dead], 2, "say which dead letters"),
        (["purge", "-t", dead, "--all", "--reason", "failed"], 2, "--all purges every"),
        (["replay", "-t", dead, "--where", "1 = 1; DELETE FROM x"], 2, "';' ends a statement"),
        (["replay", "-t", dead, "--where", "nope = 1"], 2, "the database refused"),
        (["list", "-t", f"missing-{uuid.uuid4().hex[:8]}"], 2, "no dead-letter stream"),
        (["list", "-t", dead, "--since", "last tuesday"], 2, "--since 'last tuesday'"),
        (["show", "nothing-here"], 2, "<stream>/<partition>/<offset>"),
        (["show", f"{dead}/0/99"], 1, f"bolide: error: no dead letter {dead}/0/99"),
    ]
    for args, code, message in cases:
        run = bolide("dlq", *args, *where)
        assert (run.returncode, message in run.stderr) == (code, True), (args, run.stderr)
    bootstrap = ["--bootstrap", letters.cluster.bootstrap_servers]
    no_db = bolide("dlq", "replay", "-t", dead, *bootstrap)
    assert no_db.returncode == 2 and "--db URL is required" in no_db.stderr
    no_file = bolide("dlq", "list", "-t", dead, "--db", "sqlite:///no/such/file.db", *bootstrap)
    assert no_file.returncode == 1 and "no database file" in no_file.stderr
    negative = bolide("dlq", "replay", "-t", dead, "--claim-timeout-s", "-1", *where)
    assert negative.returncode == 2 and "--claim-timeout-s must be >= 0" in negative.stderr
    # Nothing above changed anything.
    rows = json.loads(bolide("dlq", "list", "-t", dead, "--json", *where).stdout)
    assert len(rows) == 8 and not any(r["replayed_to"] for r in rows)


def test_list_and_show_read_kafka_without_a_database(letters: Letters) -> None:
    dead = letters.dead.name
    bootstrap = ["--bootstrap", letters.cluster.bootstrap_servers]
    if letters.cluster.fetch_gap_settle_ms:
        bootstrap += ["-X", f"fetch_gap_settle_ms={letters.cluster.fetch_gap_settle_ms}"]
    listed = bolide("dlq", "list", "-t", dead, "--json", *bootstrap)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    # What Kafka holds: the dead letters before ARCHIVE_ONLY are in the archive alone.
    assert [r["id"] for r in rows] == [f"{dead}/0/{o}" for o in range(ARCHIVE_ONLY, 8)]
    assert not any(r["archived"] or r["replayed_to"] for r in rows)  # no history to say so
    shown = bolide("dlq", "show", rows[-1]["id"], "--json", *bootstrap)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == rows[-1]
