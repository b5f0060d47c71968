"""The outbox relay under SIGKILL: ``bolide outbox relay`` processes killed at random points
(mid-batch among them) while the application keeps adding rows, restarted, then left to
finish.

At least once: every row reaches Kafka, none is lost, and each key's first copies are in
commit order (a killed batch is published again). Transactional (``--transactional-id``):
read with ``read_committed``, every row exactly once, in commit order per key.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from bolide.facade import (
    Cluster,
    InitialOffsetScheme,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.kafka import ensure_topic
from bolide.stores import Outbox, SqlStore
from tests.conftest import DATABASES, eventually, upgraded_db_url
from tests.reliability.conftest import KILLS, ROOT, record_figures, scaled

pytestmark = [pytest.mark.kafka, pytest.mark.reliability, pytest.mark.slow]

TOTAL = scaled(3_000)
RUNS = max(KILLS, 4)
KEYS = 7


class Writer(threading.Thread):
    """The application: adds rows ``b"<i>"`` keyed ``k<i % 7>`` in transactions of 1-20."""

    def __init__(self, store: SqlStore, stream: StreamConfig, rng: random.Random) -> None:
        super().__init__(name="outbox-writer", daemon=True)
        self.store, self.stream, self.rng = store, stream, random.Random(rng.random())
        self.added = 0
        self.failure: BaseException | None = None

    def run(self) -> None:
        outbox = Outbox(self.store)
        try:
            while self.added < TOTAL:
                size = min(self.rng.randint(1, 20), TOTAL - self.added)
                with self.store.engine.begin() as conn:
                    for i in range(self.added, self.added + size):
                        outbox.add(conn, self.stream, Record(b"%d" % i, key=b"k%d" % (i % KEYS)))
                self.added += size
                time.sleep(self.rng.uniform(0, 0.004))
        except BaseException as exc:  # reported by the test
            self.failure = exc


class Relay:
    """One ``bolide outbox relay`` process."""

    def __init__(self, tmp_path: Path, run: int, argv: list[str]) -> None:
        self.err_path = tmp_path / f"relay{run}.err"
        with self.err_path.open("w") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bolide.cli.main", "-v", "outbox", "relay", *argv],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err,
            )  # fmt: skip

    def alive(self) -> bool:
        code = self.process.poll()
        assert code is None, f"relay exited with {code}: {self.err_path.read_text()[-3000:]}"
        return True

    def started(self) -> bool:
        """Past its start (its SIGTERM handler set): earlier runs may have sent every row
        before this one has even started, and a SIGTERM then ends it unhandled."""
        return "outbox relay started" in self.err_path.read_text()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(60)


def sent_count(store: SqlStore) -> int:
    with store.engine.connect() as conn:
        query = "SELECT count(*) FROM bolide_outbox WHERE sent_ms IS NOT NULL"
        return int(conn.execute(sa.text(query)).scalar_one())


def read_all(cluster: Cluster, stream: StreamConfig) -> list[Record]:
    config = SubscriberConfig(
        stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST, max_batch=5_000
    )
    got: list[Record] = []
    with Subscriber(cluster, config) as sub:
        eventually(lambda: got.extend(sub.poll(500)) or len(got) >= TOTAL, 120)
        while batch := sub.poll(1_000):
            got.extend(batch)
    return got


def first_copies_by_key(records: list[Record]) -> dict[bytes | None, list[int]]:
    """Each key's numbers in Kafka order, a number's later copies left out."""
    seen: set[int] = set()
    out: dict[bytes | None, list[int]] = {}
    for r in sorted(records, key=lambda r: (r.partition or 0, r.offset or 0)):
        number = int(r.data or b"")
        if number not in seen:
            seen.add(number)
            out.setdefault(r.key, []).append(number)
    return out


@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
@pytest.mark.parametrize("kind", DATABASES)
def test_a_killed_relay_loses_no_row_and_keeps_each_keys_order(
    cluster: Cluster,
    stream_factory: Callable[..., StreamConfig],
    tmp_path: Path,
    request: pytest.FixtureRequest,
    rng: random.Random,
    embedded_broker: bool,
    mode: str,
    kind: str,
) -> None:
    if mode == "exactly-once" and embedded_broker:
        pytest.skip(
            "Tansu delivers aborted transactions to read_committed readers "
            "(docs/compatibility.md): a killed relay's batch would show twice"
        )
    url = upgraded_db_url(kind, tmp_path, request)
    store = SqlStore(url)
    request.addfinalizer(store.close)
    stream = stream_factory(partitions=3, global_order=False)
    ensure_topic(cluster, stream)
    argv = ["--db", url, "--bootstrap", cluster.bootstrap_servers, "--batch-size", "50"]
    if mode == "exactly-once":
        argv += ["--transactional-id", f"kills-{stream.name}"]
    writer = Writer(store, stream, rng)
    writer.start()
    started = time.monotonic()
    for run in range(RUNS):
        # Kill points spread over the rows, leaving work for every later run.
        target = sent_count(store) + rng.randint(20, TOTAL // (RUNS + 1))
        relay = Relay(tmp_path, run, argv)
        try:
            eventually(lambda r=relay, t=target: r.alive() and sent_count(store) >= t, 120, 0.005)
            time.sleep(rng.uniform(0, 0.03))  # between rounds, or inside one
        finally:
            relay.kill()
    last = Relay(tmp_path, RUNS, argv)
    try:
        writer.join(300)
        assert writer.failure is None and writer.added == TOTAL, writer.failure
        eventually(
            lambda: last.alive() and last.started() and sent_count(store) == TOTAL, 180, 0.05
        )
    finally:
        code = last.stop()
    assert code == 0, last.err_path.read_text()[-3000:]
    records = read_all(cluster, stream)
    copies = Counter(int(r.data or b"") for r in records)
    assert set(copies) == set(range(TOTAL)), "every row published, none lost"
    for key, numbers in first_copies_by_key(records).items():
        assert numbers == sorted(numbers), f"key {key!r}: a row overtook an older one"
    duplicates = sum(n - 1 for n in copies.values())
    if mode == "exactly-once":
        assert duplicates == 0, "read_committed sees each row once"
    record_figures(
        f"outbox-{mode}-{kind}", runs=RUNS, records=TOTAL, duplicates=duplicates, lost=0,
        elapsed_s=round(time.monotonic() - started, 1),
    )  # fmt: skip
