"""``bolide outbox relay`` as a real subprocess: it publishes until SIGTERM, shows progress
at ``-v``, and exits 1 or 2 with a clear message on bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from bolide.facade import Cluster, Record, StreamConfig
from bolide.stores import Outbox, OutboxRelay, SqlStore
from tests.conftest import eventually
from tests.outbox.conftest import read_stream

pytestmark = [pytest.mark.kafka]


def cluster_args(cluster: Cluster) -> list[str]:
    settings = [f"-X{k}={v}" for k, v in cluster.settings.items() if not callable(v)]
    return ["--bootstrap", cluster.bootstrap_servers, *settings]


def bolide(*args: str) -> list[str]:
    return [sys.executable, "-m", "bolide.cli.main", *args]


def test_relay_command_publishes_until_sigterm_with_progress_at_v(
    cluster: Cluster,
    db_url: str,
    store: SqlStore,
    outbox: Outbox,
    topic: Callable[..., StreamConfig],
) -> None:
    stream = topic()
    with store.engine.begin() as conn:
        for i in range(30):
            outbox.add(conn, stream, Record(b"%d" % i, key=b"k"))
    argv = ["-v", "outbox", "relay", "--db", db_url, *cluster_args(cluster)]
    process = subprocess.Popen(
        bolide(*argv, "--progress-interval-s", "0.2", "--json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        eventually(lambda: process.poll() is None and outbox.pending() == 0, 60)
        with store.engine.begin() as conn:  # rows added while it runs are relayed too
            outbox.add(conn, stream, Record(b"30", key=b"k"))
        eventually(lambda: process.poll() is None and outbox.pending() == 0, 60)
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err[-3000:]
    counts = json.loads(out)
    assert counts["published"] == 31 and counts["pending"] == 0 and counts["retries"] == 0
    assert "outbox relay started" in err and "31 rows published" in err
    assert [int(r.data or b"") for r in read_stream(cluster, stream, 31)] == list(range(31))


def test_relay_command_exits_1_naming_a_stream_that_does_not_exist(
    cluster: Cluster, db_url: str, store: SqlStore, outbox: Outbox
) -> None:
    with store.engine.begin() as conn:
        outbox.add(conn, "no-such-stream-9b2e", Record(b"x"))
    done = subprocess.run(
        bolide("outbox", "relay", "--db", db_url, *cluster_args(cluster)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "bolide: error: stream 'no-such-stream-9b2e' does not exist" in done.stderr
    assert outbox.pending() == 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "--db URL is required"),
        (["--db", "sqlite:///x.db"], "--bootstrap HOST:PORT is required"),
        (["--db", "mysql://h/db", "-b", "h:1"], "not supported"),
        (["--db", "sqlite:///x.db", "-b", "h:1", "--batch-size", "0"], "batch-size must be >= 1"),
        (["--db", "sqlite:///x.db", "-b", "h:1", "--poll-interval-ms", "0"], "poll-interval-ms"),
    ],
)
def test_relay_command_usage_errors_exit_2(extra: list[str], message: str) -> None:
    env_free = {"BOLIDE_DB": "", "BOLIDE_BOOTSTRAP": ""}
    done = subprocess.run(
        bolide("outbox", "relay", *extra),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **env_free},
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr


@pytest.mark.parametrize("link", ["symbolic", "hard"])
def test_relay_command_refuses_a_second_relay_on_the_same_sqlite_file_by_another_name(
    cluster: Cluster,
    store: SqlStore,
    outbox: Outbox,
    relays: Callable[..., OutboxRelay],
    tmp_path: Path,
    link: str,
) -> None:
    if store.dialect != "sqlite":
        pytest.skip("PostgreSQL relays share the work")
    database = Path(str(store.engine.url.database))
    alias = database.with_name("alias.db")
    if link == "symbolic":
        alias.symlink_to(database)
    else:
        os.link(database, alias)
    relay = relays(outbox)
    done = subprocess.run(
        bolide("outbox", "relay", "--db", f"sqlite:///{alias}", *cluster_args(cluster)),
        capture_output=True,
        text=True,
        timeout=120,  # before it runs on: a relay let in would not exit
        check=False,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert "another outbox relay runs on" in done.stderr
    assert relay.running
