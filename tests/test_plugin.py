"""``bolide.testing`` works in a user's own test suite, as docs/quickstart.md shows it.

The user test of the quick start is written into an empty project folder and run by a separate
``pytest`` process: the fixtures must come from the installed entry point alone, with no
conftest and no configuration. It runs once against the session's broker (through
``BOLIDE_TEST_BOOTSTRAP``) and once with no broker given, where the plugin starts its own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bolide.facade import Cluster
from bolide.facade.broker.apache import kafka_unavailable

QUICKSTART = Path(__file__).resolve().parents[1] / "docs" / "quickstart.md"

#: Checks the plugin's other fixtures beside the documented test.
_EXTRA = """

def test_backend_and_fresh_names(bolide_backend, bolide_cluster, bolide_stream_factory):
    import os

    name, cluster = bolide_backend
    assert cluster is bolide_cluster
    assert name == os.environ["EXPECTED_BACKEND"]
    first, second = bolide_stream_factory(), bolide_stream_factory(name_prefix="orders")
    assert first.name != second.name and second.name.startswith("orders-")
"""


def documented_user_test() -> str:
    """The quick start's example test (the python block defining ``test_orders_round_trip``)."""
    text = QUICKSTART.read_text(encoding="utf-8")
    for match in re.finditer(r"^```python\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        if "def test_orders_round_trip(" in match.group(1):
            return match.group(1)
    raise AssertionError("docs/quickstart.md has no test_orders_round_trip example")


def run_user_suite(project: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    (project / "tests").mkdir()
    (project / "tests" / "test_orders.py").write_text(documented_user_test() + _EXTRA)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("BOLIDE_", "PYTEST_"))}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=project,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.kafka
@pytest.mark.slow
def test_plugin_fixtures_against_a_given_cluster(cluster: Cluster, tmp_path: Path) -> None:
    done = run_user_suite(
        tmp_path,
        {"BOLIDE_TEST_BOOTSTRAP": cluster.bootstrap_servers, "EXPECTED_BACKEND": "external"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout


@pytest.mark.kafka
@pytest.mark.slow
def test_plugin_starts_its_own_broker(tmp_path: Path) -> None:
    if os.environ.get("DOCKER_HOST") or Path("/var/run/docker.sock").exists():
        pytest.skip("with a Docker engine the plugin prefers a testcontainers Kafka")
    # The plugin's choice: the embedded Apache Kafka where it can run, else Tansu.
    expected = "kafka" if kafka_unavailable() is None else "tansu"
    done = run_user_suite(tmp_path, {"EXPECTED_BACKEND": expected})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout
