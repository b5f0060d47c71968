"""A process that dies hard leaves no child behind: the embedded broker's JVMs and the Spark
cluster's daemons are leashed (``bolide.facade.broker.leash``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bolide.facade.broker.jars import KAFKA, find_java
from tests.conftest import eventually

OWNER = textwrap.dedent(
    """
    import subprocess, sys, time
    from bolide.facade.broker.leash import Leash
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    leash = Leash(child.pid)
    if sys.argv[1] == "release":
        leash.release()
    print(child.pid, flush=True)
    time.sleep(300)
    """
)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too: it only waits for its (re-)parent to reap it.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def owner(script: str, *args: str) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen(
        [sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.strip(), "the owner printed no pid"
    return process, int(line.split()[0])


def kill(process: subprocess.Popen[str]) -> None:
    """SIGKILL the owner (no clean-up of its own runs), reap it, close our end of its pipe."""
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.stdout is not None
    process.stdout.close()


def test_the_child_dies_with_its_killed_owner() -> None:
    process, child = owner(OWNER, "keep")
    assert alive(child)
    kill(process)
    eventually(lambda: not alive(child), 30)


def test_a_released_child_outlives_its_owner() -> None:
    process, child = owner(OWNER, "release")
    kill(process)
    time.sleep(1)
    try:
        assert alive(child)
    finally:
        os.killpg(child, signal.SIGKILL)


BROKER_OWNER = textwrap.dedent(
    """
    import sys, time
    from bolide.facade import EmbeddedBroker
    broker = EmbeddedBroker(engine="kafka", log_path=sys.argv[1])
    broker.start()
    print(" ".join(str(n.process.pid) for n in broker._engine._nodes.values()), flush=True)
    time.sleep(300)
    """
)


@pytest.mark.kafka
def test_a_killed_program_leaves_no_kafka_node(tmp_path: Path) -> None:
    if KAFKA.jars() is None or find_java() is None:
        pytest.skip("needs Java and the Kafka jars (bolide fetch kafka)")
    process, node = owner(BROKER_OWNER, str(tmp_path / "kafka.log"))
    assert alive(node)
    kill(process)
    eventually(lambda: not alive(node), 60)
