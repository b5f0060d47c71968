"""The embedded broker's engines: which one runs, and a clear error (never a hang) for each
missing or broken part: Java, its version, the jars, Maven, a broker that dies, a port taken."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bolide.facade import BrokerError, Cluster, EmbeddedBroker
from bolide.facade.broker import resolve_engine
from bolide.facade.broker.apache import kafka_unavailable
from bolide.facade.broker.jars import KAFKA, Artifacts, fetch
from bolide.facade.kafka import broker_setting
from bolide.testing.plugin import cluster_backend

needs_kafka = pytest.mark.skipif(
    kafka_unavailable() is not None, reason=f"Apache Kafka cannot run here: {kafka_unavailable()}"
)


def _script(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def test_unknown_engine_and_broker_count_are_usage_errors() -> None:
    with pytest.raises(ValueError, match="engine must be one of"):
        EmbeddedBroker(engine="redpanda")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="brokers"):
        EmbeddedBroker(engine="tansu", brokers=0)
    with pytest.raises(BrokerError, match="one broker"):
        EmbeddedBroker(engine="tansu", brokers=3)


def test_without_java_kafka_is_refused_and_auto_runs_tansu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.delenv("BOLIDE_ENGINE", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no java on it
    with pytest.raises(BrokerError, match="Java 17"):
        EmbeddedBroker(engine="kafka")
    assert resolve_engine("auto") == "tansu"
    assert EmbeddedBroker().engine == "tansu"


def test_an_old_java_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _script(tmp_path / "bin", "java", "echo 'openjdk version \"11.0.2\" 2019-01-15' >&2")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(BrokerError, match=r"Java 17\+.*Java 11"):
        EmbeddedBroker(engine="kafka")


def test_missing_jars_name_the_command_that_fetches_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("BOLIDE_CACHE", str(tmp_path))
    monkeypatch.delenv("BOLIDE_KAFKA_HOME", raising=False)
    monkeypatch.delenv("BOLIDE_ENGINE", raising=False)
    with pytest.raises(BrokerError, match="bolide fetch kafka"):
        EmbeddedBroker(engine="kafka")
    assert resolve_engine("auto") == "tansu"


def test_an_unreachable_maven_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    mvn = "echo '[ERROR] Could not transfer artifact org.apache.kafka:kafka_2.13' >&2; exit 1"
    _script(tmp_path / "bin", "mvn", mvn)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("BOLIDE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(BrokerError, match="Could not transfer artifact") as info:
        fetch(KAFKA)
    assert "Maven Central" in str(info.value)
    assert KAFKA.jars() is None  # nothing half-fetched is taken for complete


def test_fetch_without_maven_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("BOLIDE_CACHE", str(tmp_path / "cache"))
    pom = tmp_path / "pom.xml"
    pom.write_text("<project/>")
    with pytest.raises(BrokerError, match="needs Maven"):
        fetch(Artifacts("x", pom, "1"))


def test_a_taken_port_is_refused_at_once() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(BrokerError, match=f"port {port} is taken"):
            EmbeddedBroker(engine="tansu", port=port)


@needs_kafka
@pytest.mark.kafka
def test_a_broker_that_dies_during_start_fails_fast_with_its_log(tmp_path: Path) -> None:
    broker = EmbeddedBroker(
        engine="kafka",
        log_path=tmp_path / "kafka.log",
        broker_settings={"num.network.threads": "none"},
    )
    with pytest.raises(BrokerError, match=r"exited|formatting") as info:
        broker.start()
    assert "num.network.threads" in str(info.value)  # the tail of the log says what is wrong
    assert not broker.running


@needs_kafka
@pytest.mark.kafka
def test_stop_removes_its_data_and_stops_only_its_own_processes(tmp_path: Path) -> None:
    def ours() -> set[str]:
        return {p.name for p in Path(tempfile.gettempdir()).glob("bolide-kafka-*")}

    before = ours()
    bystander = subprocess.Popen(["sleep", "120"])
    try:
        with EmbeddedBroker(engine="kafka", log_path=tmp_path / "k.log") as broker:
            assert broker.engine == "kafka" and broker.node_ids == (1,)
            # Other runs on the machine may start and stop brokers meanwhile: the folder named
            # on this broker's own command line is its own.
            (pid,) = broker.pids
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            own = {n for n in ours() - before if any(n in arg for arg in cmdline)}
            assert len(own) == 1
        assert not own & ours()
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.kafka
@pytest.mark.parametrize(
    ("engine", "hint"),
    [
        pytest.param("kafka", "", marks=needs_kafka, id="kafka"),
        pytest.param("tansu", "pass -X fetch_gap_settle_ms=500", id="tansu"),
    ],
)
def test_the_broker_command_prints_its_address_and_stops_on_sigterm(
    tmp_path: Path, engine: str, hint: str
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "bolide.cli", "broker", "--engine", engine),
            *("--port", str(port), "--log", str(tmp_path / "b.log")),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        assert f"{engine} broker (1 node) listening on" in lines[0]
        assert lines[1].strip() == f"export BOLIDE_BOOTSTRAP=127.0.0.1:{port}"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
    # Clients of an engine with workarounds are told the setting that turns them on.
    assert (hint in err) if hint else ("fetch_gap_settle_ms" not in err), err


@pytest.mark.kafka
@needs_kafka
def test_the_broker_command_runs_kafkas_stock_group_settings(tmp_path: Path) -> None:
    """``bolide broker --group-settings stock``: a broker with Apache Kafka's own group
    defaults (a 6 s session floor), as a production cluster runs them."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "bolide.cli", "broker", "--engine", "kafka"]
    command += ["--port", str(port), "--log", str(tmp_path / "b.log"), "--group-settings", "stock"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert "kafka broker (1 node) listening on" in proc.stdout.readline()
        cluster = Cluster(f"127.0.0.1:{port}")
        assert broker_setting(cluster, "group.min.session.timeout.ms") == "6000"
        assert broker_setting(cluster, "group.initial.rebalance.delay.ms") == "3000"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    refused = subprocess.run(
        [*command[:3], "broker", "--engine", "tansu", "--group-settings", "stock"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 1, refused.stderr
    assert "group_settings='stock' needs the Apache Kafka engine" in refused.stderr


def test_group_settings_are_checked_and_apply_to_apache_kafka_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Which group settings the broker runs is tested in tests/pubsub/test_stock_groups.py."""
    with pytest.raises(ValueError, match="group_settings must be one of fast, stock"):
        EmbeddedBroker(engine="kafka", group_settings="slow")  # type: ignore[arg-type]
    with pytest.raises(BrokerError, match="group_settings='stock' needs the Apache Kafka"):
        EmbeddedBroker(engine="tansu", group_settings="stock")
    monkeypatch.delenv("BOLIDE_TEST_BOOTSTRAP", raising=False)
    monkeypatch.setenv("BOLIDE_TEST_ENGINE", "kafka")
    monkeypatch.setenv("BOLIDE_TEST_GROUP_SETTINGS", "slow")
    with pytest.raises(pytest.UsageError, match="BOLIDE_TEST_GROUP_SETTINGS must be fast or stock"):
        next(cluster_backend())
