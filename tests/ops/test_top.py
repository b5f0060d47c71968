"""``bolide top`` in a pseudo-terminal: the screen a person sees, after a few refreshes."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable

import pyte
import pytest

from bolide.facade import Cluster, StreamConfig
from tests.ops.conftest import bolide, lagging_group, publish

pytestmark = pytest.mark.kafka

COLUMNS, LINES = 140, 40


def run_in_terminal(
    args: list[str], cluster: Cluster, timeout_s: float = 120, columns: int = COLUMNS
) -> tuple[int, str]:
    """Run ``bolide ARGS`` on a pseudo-terminal; return its exit code and final screen."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", LINES, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BOLIDE_", "NO_COLOR"))}
    env.update(BOLIDE_BOOTSTRAP=cluster.bootstrap_servers, TERM="xterm-256color")
    # Rich takes COLUMNS and LINES over the terminal's size (pytest-xdist's workers set them).
    env.update(COLUMNS=str(columns), LINES=str(LINES))
    proc = subprocess.Popen(
        [sys.executable, "-m", "bolide.cli", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        close_fds=True,
    )
    os.close(slave)
    screen = pyte.Screen(columns, LINES)
    stream = pyte.ByteStream(screen)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            stream.feed(chunk)
        code = proc.wait(timeout=30)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return code, "\n".join(line.rstrip() for line in screen.display)


def test_top_renders_streams_lag_bars_and_refreshes(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory(name_prefix="top")  # short: the table fits the terminal
    publish(cluster, stream, 10)
    group = lagging_group(cluster, stream, read=4, confirm=4)
    args = ["top", "--group", group, "--stream", stream.name, "--iterations", "3"]
    code, screen = run_in_terminal([*args, "--interval", "0.5"], cluster)
    assert code == 0, screen
    assert "update 3" in screen  # refreshed in place: the last update is on screen
    assert "update 1" not in screen and "update 2" not in screen
    lines = screen.splitlines()
    assert any(line.startswith("streams") for line in lines), screen
    stream_row = next((line for line in lines if stream.name in line and group not in line), "")
    assert [c.strip() for c in stream_row.split("│")[1:-1]] == [stream.name, "1", "10", "0.0"]
    lag_row = next((line for line in lines if group in line), None)
    assert lag_row is not None, screen
    cells = [c.strip() for c in lag_row.split("│")[1:-1]]
    assert cells[:6] == [group, stream.name, "0", "4", "10", "6"], lag_row
    # Proportional to the lag: 6 records draw a sliver of the bar, not all of it.
    assert cells[6].count("█") == 1 and "·" in cells[6], lag_row
    assert "lag per group and partition" in screen


def test_top_fits_80_columns_without_cutting_numbers(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory(name_prefix="top-narrow-screen-with-a-long-stream-name")
    publish(cluster, stream, 1_234)
    group = lagging_group(cluster, stream, read=4, confirm=4)
    args = ["top", "--group", group, "--stream", stream.name, "--iterations", "1"]
    code, screen = run_in_terminal(args, cluster, columns=80)
    assert code == 0, screen
    assert all(len(line) <= 80 for line in screen.splitlines())
    lag_row = next(line for line in screen.splitlines() if "1,234" in line and "1,230" in line)
    cells = [c.strip() for c in lag_row.split("│")[1:-1]]
    assert cells[2:6] == ["0", "4", "1,234", "1,230"], lag_row  # every digit shown
    assert set(cells[6]) == {"█"}, lag_row  # the largest lag past the floor fills its bar
    # Names are never cut: too wide for the screen, they are folded over the row's lines.
    assert folded(screen, lag_row, 0) == group, screen
    assert folded(screen, lag_row, 1) == stream.name, screen
    stream_row = next(
        line for line in screen.splitlines() if line.startswith(f"│ {stream.name[:8]}")
    )
    assert folded(screen, stream_row, 0) == stream.name, screen


def folded(screen: str, first: str, column: int) -> str:
    """The text of cell ``column`` of the table row whose first line is ``first``, joined
    over the lines the row is folded on."""
    lines = screen.splitlines()
    start = lines.index(first)
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("│"))
    return "".join(line.split("│")[column + 1].strip() for line in lines[start:end])


def test_top_json_updates_with_rates(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory()
    publish(cluster, stream, 10)
    group = lagging_group(cluster, stream, read=4, confirm=4)
    scope = ["--group", group, "--stream", stream.name]
    run = bolide("top", *scope, "--json", "--iterations", "2", "--interval", "0.2", cluster=cluster)
    assert run.returncode == 0, run.stderr
    first, second = (json.loads(line) for line in run.stdout.splitlines())
    assert (first["update"], second["update"]) == (1, 2)
    assert "rates" not in first
    assert second["rates"]["published"] == {stream.name: 0.0}
    assert second["rates"]["consumed"] == [
        {"group": group, "stream": stream.name, "partition": 0, "per_s": 0.0}
    ]
    assert [r["lag"] for r in second["partitions"]] == [6]
    bad = bolide("top", "--interval", "0", cluster=cluster)
    assert bad.returncode == 2 and "--interval" in bad.stderr
