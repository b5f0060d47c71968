"""The ``bolide`` command line as users run it: real subprocesses, the session's broker.

Covers ``--help`` on every level, usage errors (exit 2), runtime failures (exit 1), the
``BOLIDE_BOOTSTRAP`` default and ``-v``, and ``publish``/``tail``: keys, headers, standard
input, JSON, offsets, times, subscriber groups and Avro through the SQL schema registry.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bolide.cli.main import build_parser, main
from bolide.cli.stream import parse_time_ms
from bolide.facade import Cluster, Publisher, PublisherConfig, Record, StreamConfig
from bolide.facade.kafka import admin_client
from bolide.stores import SqlStore

_SCRIPT = shutil.which("bolide", path=str(Path(sys.executable).parent))
_COMMAND = [_SCRIPT] if _SCRIPT else [sys.executable, "-m", "bolide.cli.main"]


def bolide(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """Run ``bolide ARGS`` and return the finished process (output as text); ``timeout``
    catches a hang, and is long enough for a command on a machine under heavy load."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("BOLIDE_")}
    environ.update(env or {})
    return subprocess.run(
        [*_COMMAND, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=environ,
    )


def _command_paths() -> Iterator[list[str]]:
    """Every command path of the parser: [], [broker], [db], [db, upgrade], ..."""

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> Iterator[list[str]]:
        yield path
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    yield from walk(child, [*path, name])

    return walk(build_parser(), [])


# -- help and usage -------------------------------------------------------------------------


def test_every_command_level_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    paths = list(_command_paths())
    names = {" ".join(p) for p in paths}
    assert {"broker", "demo", "publish", "tail", "db upgrade", "db downgrade", "db current",
            "archive", "sql", "durable list", "durable expire", "bench"} <= names  # fmt: skip
    for path in paths:
        with pytest.raises(SystemExit) as exited:
            main([*path, "--help"])
        assert exited.value.code == 0, path
        out = capsys.readouterr().out
        assert out.startswith(f"usage: {' '.join(['bolide', *path])}"), (path, out[:80])


@pytest.mark.parametrize("path", [[], ["broker"], ["demo"], ["publish"], ["tail"]])
def test_help_as_a_subprocess(path: list[str]) -> None:
    done = bolide(*path, "--help")
    assert done.returncode == 0, done.stderr
    assert "usage: bolide" in done.stdout
    assert done.stderr == ""


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["no-such-command"],
        ["publish", "value"],  # no --stream
        ["publish", "--stream", "s", "--key", "k", "--group", "g", "v"],
        ["publish", "--stream", "bad name", "v"],
        ["publish", "--stream", "s", "--header", "novalue", "v"],
        ["tail", "--stream", "s", "--group", "g", "--from-beginning"],
        ["tail", "--stream", "s", "--from-offset", "1", "--from-beginning"],
        ["tail", "--stream", "s", "--from-time", "yesterday"],
        ["tail", "--stream", "s", "--count", "-1"],
        ["tail", "--stream", "s", "--group", "g", "--lease-timeout-ms", "5"],
        ["demo", "--orders", "3"],
        ["publish", "--stream", "s", "--avro-schema", "schema.avsc", "v"],  # needs --db
    ],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    done = bolide(*args, env={"BOLIDE_BOOTSTRAP": "127.0.0.1:1"})
    assert done.returncode == 2, (args, done.stdout, done.stderr)
    assert "usage: bolide" in done.stderr
    assert "Traceback" not in done.stderr


def test_missing_bootstrap_is_a_usage_error() -> None:
    done = bolide("tail", "--stream", "s")
    assert done.returncode == 2
    assert "--bootstrap HOST:PORT is required (or set $BOLIDE_BOOTSTRAP)" in done.stderr


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("-Xsocket.timeout.ms", "-X expects KEY=VALUE"),
        ("-Xfetch_gap_settle_ms=soon", "fetch_gap_settle_ms expects an integer"),
        ("-Xfetch_gap_settle_ms=-5", "fetch_gap_settle_ms must be a non-negative int"),
    ],
)
def test_bad_cluster_settings_are_usage_errors(setting: str, message: str) -> None:
    done = bolide("tail", "--stream", "s", "--bootstrap", "127.0.0.1:1", setting)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


def test_runtime_failure_exits_1(tmp_path: Path) -> None:
    done = bolide("sql", "SELECT 1", "--db", f"sqlite:///{tmp_path / 'absent.db'}")
    assert done.returncode == 1
    assert done.stderr.startswith("bolide: error: ")


def test_parse_time_ms() -> None:
    assert parse_time_ms("1700000000000") == 1_700_000_000_000
    assert parse_time_ms("2023-11-14T22:13:20Z") == 1_700_000_000_000
    assert parse_time_ms("2023-11-14T22:13:20") == 1_700_000_000_000  # UTC when naive
    assert parse_time_ms("2023-11-15T00:13:20+02:00") == 1_700_000_000_000
    with pytest.raises(ValueError, match="neither epoch milliseconds nor ISO 8601"):
        parse_time_ms("noon")


# -- publish and tail against the broker --------------------------------------------------


@pytest.fixture
def where(cluster: Cluster) -> list[str]:
    settings = [f"-X{k}={v}" for k, v in cluster.settings.items() if not callable(v)]
    gap = f"-Xfetch_gap_settle_ms={cluster.fetch_gap_settle_ms}"
    return ["--bootstrap", cluster.bootstrap_servers, *settings, gap, "-Xclient.id=bolide-cli"]


def _json_lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.mark.kafka
def test_publish_then_tail_keys_headers_and_stdin(
    stream_factory: Callable[..., StreamConfig], where: list[str]
) -> None:
    name = stream_factory().name
    one = bolide("publish", "--stream", name, *where, "hello")
    assert one.returncode == 0, one.stderr
    assert one.stdout.strip() == f"{name}[0]@0"
    many = bolide(
        "publish", "--stream", name, *where, "--key", "k1", "--header", "src=cli",
        "--header", "src=again", "--json", "-", stdin="a\nb\n\nc\n",
    )  # fmt: skip
    assert many.returncode == 0, many.stderr
    assert [r["offset"] for r in _json_lines(many.stdout)] == [1, 2, 3, 4]

    text = bolide("tail", "--stream", name, *where, "--from-beginning", "-e")
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines() == [
        "0:0 key=- headers=- hello",
        "0:1 key=k1 headers=src=cli,src=again a",
        "0:2 key=k1 headers=src=cli,src=again b",
        "0:3 key=k1 headers=src=cli,src=again ",
        "0:4 key=k1 headers=src=cli,src=again c",
    ]
    picked = bolide(
        "tail", "--stream", name, *where, "--from-offset", "2", "--count", "2", "--json"
    )
    rows = _json_lines(picked.stdout)
    assert [(r["offset"], r["value"], r["key"]) for r in rows] == [(2, "b", "k1"), (3, "", "k1")]
    assert rows[0]["headers"] == [["src", "cli"], ["src", "again"]]
    assert isinstance(rows[0]["timestamp_ms"], int)


@pytest.mark.kafka
def test_environment_default_and_verbose(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    name = stream_factory().name
    env = {"BOLIDE_BOOTSTRAP": cluster.bootstrap_servers}
    done = bolide("-v", "publish", "--stream", name, "x", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{name}[0]@0"  # logs go to stderr, never to stdout
    assert f"INFO bolide.cli: publishing to {name} (1 partitions)" in done.stderr
    quiet = bolide("tail", "--stream", name, "--from-beginning", "-e", env=env)
    assert quiet.stdout == "0:0 key=- headers=- x\n"
    assert quiet.stderr == ""


@pytest.mark.kafka
@pytest.mark.slow
def test_tail_multi_partition_by_time_and_at_end(
    stream_factory: Callable[..., StreamConfig], where: list[str]
) -> None:
    name = stream_factory().name
    for group in ("ACME", "BOLT", "CRUX"):
        done = bolide(
            "publish", "--stream", name, *where, "--partitions", "3", "--group", group, group
        )
        assert done.returncode == 0, done.stderr
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    late = bolide("publish", "--stream", name, *where, "--group", "BOLT", "--json", "BOLT")
    partition = _json_lines(late.stdout)[0]["partition"]

    since = bolide("tail", "--stream", name, *where, "--from-time", str(cut), "-e", "--json")
    assert since.returncode == 0, since.stderr
    assert [(r["partition"], r["value"]) for r in _json_lines(since.stdout)] == [
        (partition, "BOLT")
    ]
    everything = bolide("tail", "--stream", name, *where, "--from-beginning", "-e")
    assert sorted(line.split()[-1] for line in everything.stdout.splitlines()) == [
        "ACME", "BOLT", "BOLT", "CRUX",
    ]  # fmt: skip
    only = bolide(
        "tail", "--stream", name, *where, "--from-beginning", "-e", "--partition", str(partition)
    )
    assert [line.split(":")[0] for line in only.stdout.splitlines()] == [str(partition)] * 2
    nothing = bolide("tail", "--stream", name, *where, "-e")  # from the end: at the end
    assert nothing.returncode == 0 and nothing.stdout == ""
    wrong = bolide("publish", "--stream", name, *where, "--partitions", "5", "x")
    assert wrong.returncode == 1
    assert "has 3 partitions" in wrong.stderr


@pytest.mark.kafka
@pytest.mark.slow
def test_tail_in_a_group_resumes_after_what_it_printed(
    stream_factory: Callable[..., StreamConfig], where: list[str]
) -> None:
    name = stream_factory().name
    bolide("publish", "--stream", name, *where, "-", stdin="v0\nv1\nv2\n")
    group = f"g-{name}"
    seen = []
    for _ in range(3):
        done = bolide(
            "tail", "--stream", name, *where, "--group", group, "--count", "1",
            "--lease-timeout-ms", "4000",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        seen.append(done.stdout.split()[-1])
    assert seen == ["v0", "v1", "v2"]


@pytest.mark.kafka
def test_avro_publish_and_tail_through_the_sql_registry(
    stream_factory: Callable[..., StreamConfig], where: list[str], tmp_path: Path
) -> None:
    name = stream_factory().name
    db = f"sqlite:///{tmp_path / 'registry.db'}"
    with SqlStore(db) as store:
        store.upgrade()
    schema = tmp_path / "order.avsc"
    schema.write_text(
        json.dumps(
            {
                "type": "record",
                "name": "Order",
                "fields": [{"name": "symbol", "type": "string"}, {"name": "qty", "type": "int"}],
            }
        )
    )
    avro = ["--avro-schema", str(schema), "--db", db]
    done = bolide("publish", "--stream", name, *where, *avro, '{"symbol": "ACME", "qty": 5}')
    assert done.returncode == 0, done.stderr
    bad = bolide("publish", "--stream", name, *where, *avro, "not json")
    assert bad.returncode == 1
    assert "must be JSON" in bad.stderr
    bolide("publish", "--stream", name, *where, "plain bytes")

    decoded = bolide("tail", "--stream", name, *where, *avro, "--from-beginning", "-e", "--json")
    assert decoded.returncode == 0, decoded.stderr
    assert [r["value"] for r in _json_lines(decoded.stdout)] == [
        {"symbol": "ACME", "qty": 5},
        "plain bytes",  # not Avro: shown raw, with a warning
    ]
    assert "cannot decode" in decoded.stderr
    raw = bolide("tail", "--stream", name, *where, "--from-beginning", "--count", "1")
    assert raw.stdout.split()[-1].startswith("\\x00")  # magic byte 0, then the schema id


def test_version_and_no_abbreviated_options() -> None:
    version = bolide("--version")
    assert version.returncode == 0 and version.stdout.startswith("bolide ")
    # --part is not taken for --partition (or --partitions): every parser refuses prefixes.
    done = bolide("publish", "-t", "s", "-b", "127.0.0.1:1", "--part", "1", "x")
    assert done.returncode == 2 and "unrecognized arguments: --part" in done.stderr


def test_a_refused_librdkafka_setting_is_named() -> None:
    done = bolide("tail", "-t", "s", "-b", "127.0.0.1:1", "-Xno.such.setting=1")
    assert done.returncode == 2, done.stderr
    assert 'No such configuration property: "no.such.setting"' in done.stderr


@pytest.mark.kafka
def test_reading_commands_never_create_a_topic(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], where: list[str]
) -> None:
    name = stream_factory().name
    assert bolide("publish", "-t", name, *where, "x").returncode == 0
    typo = name[:-1] + ("x" if name[-1] != "x" else "y")
    archive = ["archive", "--stream", typo, "--db", "sqlite://"]
    for command in (["tail", "-t", typo, "-e"], ["lag", "-t", typo], ["top", "-t", typo], archive):
        done = bolide(*command, *where)
        assert done.returncode == 2, (command, done.stderr)
        assert f"stream {typo!r} does not exist on {cluster.bootstrap_servers}" in done.stderr
        assert f"did you mean {name!r}" in done.stderr
    meta = admin_client(cluster).list_topics(timeout=10)
    assert typo not in meta.topics


@pytest.mark.kafka
def test_kcat_flags_keys_partitions_and_the_last_records(
    stream_factory: Callable[..., StreamConfig], where: list[str]
) -> None:
    name = stream_factory().name
    lines = "".join(f"k{i}:v{i}\n" for i in range(6)) + "no key here\n"
    done = bolide("publish", "-t", name, *where, "--partitions", "2", "-K", ":", stdin=lines)
    assert done.returncode == 0, done.stderr
    pinned = bolide("publish", "-t", name, *where, "-p", "1", "-k", "pk", "--json", "pinned")
    assert pinned.returncode == 0, pinned.stderr
    assert _json_lines(pinned.stdout)[0]["partition"] == 1
    beyond = bolide("publish", "-t", name, *where, "-p", "2", "x")
    assert beyond.returncode == 2 and "--partition 2" in beyond.stderr

    everything = bolide("tail", "-t", name, *where, "--from-beginning", "-e", "-K", "=")
    assert everything.returncode == 0, everything.stderr
    pairs = [line.split("=", 1) for line in everything.stdout.splitlines()]
    assert sorted(v for _, v in pairs) == sorted(
        [*(f"v{i}" for i in range(6)), "no key here", "pinned"]
    )
    assert {k: v for k, v in pairs if v.startswith("v")} == {f"k{i}": f"v{i}" for i in range(6)}
    last = bolide("tail", "-t", name, *where, "--last", "1", "-p", "1", "-e", "--json")
    rows = _json_lines(last.stdout)
    assert [(r["partition"], r["value"], r["key"]) for r in rows] == [(1, "pinned", "pk")]
    per_partition = bolide("tail", "-t", name, *where, "--last", "2", "-e", "--json")
    counted = [r["partition"] for r in _json_lines(per_partition.stdout)]
    assert sorted(counted) == [0, 0, 1, 1]
    two = bolide("tail", "-t", name, *where, "--from-beginning", "-c", "2")
    assert two.returncode == 0 and len(two.stdout.splitlines()) == 2


@pytest.mark.kafka
def test_kcat_offsets_and_mode_flags(
    stream_factory: Callable[..., StreamConfig], where: list[str]
) -> None:
    name = stream_factory().name
    published = bolide("-P", "-t", name, *where, "-P", stdin="".join(f"v{i}\n" for i in range(5)))
    assert published.returncode == 0, published.stderr

    def values(*start: str) -> list[str]:
        done = bolide("-C", "-t", name, *where, *start, "-e", "-K", "=")
        assert done.returncode == 0, done.stderr
        return [line.split("=", 1)[1] for line in done.stdout.splitlines()]

    assert values("-o", "beginning") == [f"v{i}" for i in range(5)]
    assert values("-o", "3") == ["v3", "v4"]
    assert values("-o", "-2") == ["v3", "v4"]  # the last 2
    assert values("-o-1") == ["v4"]
    assert values("-o", "end") == []
    tail_c = bolide("tail", "-C", "-t", name, *where, "-o", "beginning", "-c", "1")
    assert tail_c.returncode == 0 and tail_c.stdout.endswith("v0\n"), tail_c.stderr
    for bad in (["-o", "stored"], ["-o", "1", "--from-beginning"], ["-o", "--2"]):
        done = bolide("tail", "-t", name, *where, *bad)
        assert done.returncode == 2 and "usage: bolide tail" in done.stderr, (bad, done.stderr)


def test_a_mistyped_flag_names_the_nearest_one_with_the_command_usage() -> None:
    done = bolide("tail", "-t", "s", "-b", "127.0.0.1:1", "--form-beginning")
    assert done.returncode == 2
    assert done.stderr.startswith("usage: bolide tail "), done.stderr
    assert "unrecognized arguments: --form-beginning (did you mean --from-beginning?)" in (
        done.stderr
    )
    nested = bolide("dlq", "list", "-t", "s", "--reasn", "failed")
    assert nested.returncode == 2 and nested.stderr.startswith("usage: bolide dlq list ")
    assert "(did you mean --reason?)" in nested.stderr


def test_without_a_broker_the_error_says_how_to_start_one() -> None:
    done = bolide("publish", "-t", "s", "-b", "127.0.0.1:1", "x")
    assert done.returncode == 1
    assert "cannot reach the cluster at 127.0.0.1:1" in done.stderr
    assert "`bolide broker` runs one" in done.stderr


def test_spark_without_the_extra_names_it(tmp_path: Path) -> None:
    # A pyspark that cannot be imported stands for an installation without the extra.
    (tmp_path / "pyspark").mkdir()
    (tmp_path / "pyspark" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'pyspark'\", name='pyspark')\n"
    )
    for args in (["spark"], ["spark", "archive", "--stream", "s"]):
        done = bolide(*args, env={"PYTHONPATH": str(tmp_path)})
        assert done.returncode == 1, done.stderr
        assert "pip install 'bolide[spark]'" in done.stderr and "Traceback" not in done.stderr


def _read_then_close(args: list[str], lines: int) -> tuple[int, str]:
    """Run ``bolide ARGS`` into a pipe, read ``lines`` lines and close it (``| head -N``);
    return the exit code and standard error."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("BOLIDE_")}
    with subprocess.Popen(
        [*_COMMAND, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environ
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        for _ in range(lines):
            assert proc.stdout.readline()
        proc.stdout.close()
        errors = proc.stderr.read().decode()
        return proc.wait(timeout=120), errors


@pytest.mark.kafka
def test_a_closed_pipe_ends_commands_quietly(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig], where: list[str]
) -> None:
    stream = stream_factory()
    # Far more than a pipe holds: tail is still writing when its reader goes away.
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(3_000):
            pub.publish_async(Record(b"%d %s" % (i, b"x" * 200)))
        pub.flush(60)
    tail = _read_then_close(["tail", "-t", stream.name, *where, "-o", "beginning", "-e"], 2)
    top = _read_then_close(["top", "-t", stream.name, *where, "--json", "--interval", "0.1"], 1)
    for code, errors in (tail, top):
        assert (code, errors) == (141, "")  # as coreutils: 128 + SIGPIPE, in silence
