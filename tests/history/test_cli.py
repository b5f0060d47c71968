"""``bolide db``, ``bolide sql`` and ``bolide archive`` as real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from bolide.facade import Cluster, Record, StreamConfig
from bolide.stores import SqlStore
from tests.history.test_archiver import FAST_GROUP, publish

BOLIDE = [sys.executable, "-m", "bolide.cli.main"]


def bolide(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*BOLIDE, *args], capture_output=True, text=True, timeout=120, env=_env())


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env.pop("BOLIDE_DB", None)
    env.pop("BOLIDE_BOOTSTRAP", None)
    return env


@pytest.mark.parametrize(
    "command",
    [
        ["db"],
        ["db", "upgrade"],
        ["db", "downgrade"],
        ["db", "current"],
        ["archive"],
        ["sql"],
    ],
    ids=" ".join,
)
def test_help_everywhere(command: list[str]) -> None:
    run = bolide(*command, "--help")
    assert run.returncode == 0
    assert "usage: bolide" in run.stdout
    assert "--db" in run.stdout or "ACTION" in run.stdout


def test_db_upgrade_current_downgrade(db_url: str) -> None:
    head = SqlStore(db_url, check_schema=False).head()
    run = bolide("db", "current", "--db", db_url)
    assert (run.returncode, run.stdout.split()[0]) == (0, "none"), run.stderr
    run = bolide("db", "upgrade", "--db", db_url)
    assert run.returncode == 0, run.stderr
    assert f"at revision {head}" in run.stdout
    run = bolide("db", "current", "--db", db_url)
    assert run.stdout.startswith(f"{head} (head {head}): up to date")
    run = bolide("db", "downgrade", "base", "--db", db_url)
    assert run.returncode == 0, run.stderr
    assert "at revision None" in run.stdout
    with SqlStore(db_url) as store:
        assert store.current() is None


def test_db_usage_errors_exit_2(tmp_path: object) -> None:
    assert bolide("db", "current").returncode == 2  # no --db
    run = bolide("db", "current", "--db", "oracle://u@h/db")
    assert run.returncode == 2
    assert "not supported" in run.stderr
    assert bolide("db", "frobnicate", "--db", f"sqlite:///{tmp_path}/x.db").returncode == 2


@pytest.mark.postgres
def test_db_failure_exits_1_without_the_password() -> None:
    run = bolide("db", "current", "--db", "postgresql+psycopg://u:hunter2-pw@127.0.0.1:1/db")
    assert run.returncode == 1
    assert "bolide: error:" in run.stderr
    assert "hunter2-pw" not in run.stderr + run.stdout


def _fill(store: SqlStore) -> None:
    records = []
    for i in range(6):
        rec = Record(
            f"order {i}".encode(), key=b"ACME" if i % 2 else b"INIT", headers={"n": str(i)}
        )
        rec.partition, rec.offset, rec.timestamp_ms = 0, i, 1_000 * i
        records.append(rec)
    store.store_all("orders", records)


def test_sql_with_bound_parameters_as_table_and_json(store: SqlStore, db_url: str) -> None:
    _fill(store)
    query = (
        "SELECT kafka_offset, key, payload FROM bolide_records "
        "WHERE stream = :stream AND key = :key AND timestamp_ms >= :since ORDER BY kafka_offset"
    )
    args = ["--db", db_url, "--param", "stream=orders", "--param", "key:bytes=ACME"]
    run = bolide("sql", query, *args, "--param", "since:int=2000", "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == [
        {"kafka_offset": 3, "key": "ACME", "payload": "order 3"},
        {"kafka_offset": 5, "key": "ACME", "payload": "order 5"},
    ]
    run = bolide("sql", query, *args, "--param", "since:int=0")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].split(" | ") == ["kafka_offset", "key ", "payload"]
    assert len(lines) == 2 + 3
    assert "order 1" in lines[2]
    assert "(3 rows" in run.stderr


def test_sql_parameters_are_never_spliced(store: SqlStore, db_url: str) -> None:
    _fill(store)
    hostile = "orders' OR '1'='1"
    run = bolide(
        "sql",
        "SELECT count(*) AS n FROM bolide_records WHERE stream = :s",
        "--db",
        db_url,
        "--param",
        f"s={hostile}",
        "--json",
    )
    assert json.loads(run.stdout) == [{"n": 0}]


@pytest.mark.parametrize(
    "query",
    [
        "DELETE FROM bolide_records",
        "DROP TABLE bolide_record_headers",
        "CREATE TABLE intruder (x INTEGER)",
        "PRAGMA user_version = 7",
        "WITH gone AS (DELETE FROM bolide_records RETURNING 1) SELECT count(*) FROM gone",
    ],
)
def test_sql_is_read_only(store: SqlStore, db_url: str, query: str) -> None:
    if store.dialect != "sqlite" and query.startswith("PRAGMA"):
        pytest.skip("a SQLite statement")
    if store.dialect == "sqlite" and query.startswith("WITH"):
        pytest.skip("SQLite has no DELETE in a WITH clause")
    _fill(store)
    run = bolide("sql", query, "--db", db_url)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "query failed" in run.stderr and "--write" in run.stderr
    assert store.largest_offset("orders", 0) == 5
    assert [h for h, _ in store.read("orders", 0, 5, 1)[0].headers] == ["n"]
    tables = set(sa.inspect(store.engine).get_table_names())
    assert {"bolide_records", "bolide_record_headers"} <= tables
    assert "intruder" not in tables
    if store.dialect == "sqlite":
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA user_version").scalar() == 0


@pytest.mark.parametrize(
    "query",
    [
        "SELECT 1; COMMIT; DROP TABLE bolide_record_headers",
        "SELECT 1; DROP TABLE bolide_record_headers",
        "COMMIT; DROP TABLE bolide_record_headers;",
        "SELECT 'a;b'; DROP TABLE bolide_record_headers -- ';'",
        "SELECT 1 /* ; */; SET default_transaction_read_only = off; "
        "DROP TABLE bolide_record_headers",
    ],
)
def test_sql_refuses_several_statements(store: SqlStore, db_url: str, query: str) -> None:
    _fill(store)
    for write in ([], ["--write"]):
        run = bolide("sql", query, "--db", db_url, *write)
        assert run.returncode == 2, run.stdout + run.stderr
        assert "one statement" in run.stderr
    assert "bolide_record_headers" in sa.inspect(store.engine).get_table_names()
    assert [h for h, _ in store.read("orders", 0, 5, 1)[0].headers] == ["n"]


def test_sql_semicolons_in_literals_and_comments_are_one_statement(
    store: SqlStore, db_url: str
) -> None:
    query = "SELECT ';' AS a, 'it''s; fine' AS b /* ; */ -- ;\n;  "
    run = bolide("sql", query, "--db", db_url, "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == [{"a": ";", "b": "it's; fine"}]


def test_sql_write_commits(store: SqlStore, db_url: str) -> None:
    _fill(store)
    run = bolide(
        "sql",
        "DELETE FROM bolide_records WHERE stream = :s AND kafka_offset >= :o",
        "--db",
        db_url,
        "--param",
        "s=orders",
        "--param",
        "o:int=4",
        "--write",
    )
    assert run.returncode == 0, run.stderr
    assert "2 rows affected, committed" in run.stderr
    assert store.largest_offset("orders", 0) == 3
    run = bolide("sql", "DROP TABLE bolide_record_headers", "--db", db_url, "--write")
    assert run.returncode == 0, run.stderr
    assert "bolide_record_headers" not in sa.inspect(store.engine).get_table_names()


def test_sql_errors(store: SqlStore, db_url: str, tmp_path: object) -> None:
    run = bolide("sql", "SELECT nope FROM bolide_records", "--db", db_url)
    assert run.returncode == 1
    assert "query failed" in run.stderr
    assert bolide("sql", "SELECT 1", "--db", db_url, "--param", "oops").returncode == 2
    assert bolide("sql", "SELECT 1", "--db", db_url, "--param", "n:int=x").returncode == 2
    assert bolide("sql", "SELECT 1").returncode == 2
    run = bolide("sql", "SELECT 1", "--db", f"sqlite:///{tmp_path}/missing.db")
    assert run.returncode == 1
    assert "no database file" in run.stderr


@pytest.mark.kafka
def test_archive_command(
    cluster: Cluster, store: SqlStore, db_url: str, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory()
    publish(cluster, stream, 30)
    settings = [f"-X{k}={v}" for k, v in FAST_GROUP.items()]
    settings.append(f"-Xfetch_gap_settle_ms={cluster.fetch_gap_settle_ms}")
    common = ["--db", db_url, "--bootstrap", cluster.bootstrap_servers, *settings]
    group = f"cli-{uuid.uuid4().hex[:8]}"
    run = bolide("archive", "--stream", stream.name, "--group", group, "--json", *common)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert (summary["records"], summary["inserted"], summary["caught_up"]) == (30, 30, True)
    assert summary["positions"] == {f"{stream.name}[0]": 30}
    progress = [json.loads(line) for line in run.stderr.splitlines() if line.startswith("{")]
    assert progress and progress[-1]["caught_up"] and progress[-1]["lag"] == 0
    assert progress[0]["records"] == 0 and progress[0]["lag"] == 30, "what is left, at once"
    assert "records_per_s" in progress[-1]
    assert [r.offset for r in store.read(stream.name, 0, 0, 100)] == list(range(30))
    run = bolide("archive", "--stream", f"missing-{uuid.uuid4().hex[:8]}", *common)
    assert run.returncode == 2  # a usage error: archiving never creates a topic
    assert "does not exist" in run.stderr
    assert bolide("archive", "--stream", stream.name, "--db", db_url).returncode == 2
    bad = bolide("archive", "--stream", stream.name, *common, "-Xfetch_gap_settle_ms=soon")
    assert bad.returncode == 2 and "fetch_gap_settle_ms expects an integer" in bad.stderr
