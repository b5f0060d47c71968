"""Exactly-once under SIGKILL: 5,000 records, a worker killed at random points 10 times and
restarted, then left to finish.

``sql``: each record is inserted into a PostgreSQL table without a unique key, its position
written in the same transaction (``SqlPositions``): the table holds every record once.
``txn``: each record is published to an output stream in a Kafka transaction with its input
position: read with ``read_committed``, the output holds every input once.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from bolide.facade import (
    Cluster,
    InitialOffsetScheme,
    Publisher,
    PublisherConfig,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.stores import SqlPositions, SqlStore
from tests.conftest import eventually
from tests.reliability.conftest import (
    ROOT,
    committed,
    make_db_url,
    record_figures,
    wait_session_expiry,
)
from tests.reliability.eos_worker import LEASE_MS, ledger_table

pytestmark = [pytest.mark.kafka, pytest.mark.postgres, pytest.mark.reliability, pytest.mark.slow]

TOTAL = 5_000
KILLS = 10
PARTITIONS = 2


def publish_input(cluster: Cluster, stream: StreamConfig) -> None:
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(TOTAL):
            pub.publish_async(Record(b"%d" % i, key=b"k%d" % (i % 7)))
        assert pub.flush(60) == 0


class Worker:
    """One run of ``tests.reliability.eos_worker``."""

    def __init__(self, tmp_path: Path, run: int, args: list[str]) -> None:
        self.log = tmp_path / "worker.log"
        self.err_path = tmp_path / f"worker{run}.err"
        with self.err_path.open("w") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.reliability.eos_worker", args[0], *args[1:5],
                 str(self.log), str(run), *args[5:]],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err,
            )  # fmt: skip

    def alive(self) -> bool:
        code = self.process.poll()
        assert code is None, f"worker exited with {code}: {self.err_path.read_text()[-3000:]}"
        return True

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)

    def dump(self) -> str:
        """The worker's thread stacks (it is left running)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGUSR1)
            time.sleep(1)
        return self.err_path.read_text()[-6000:]


def kill_at_random_points(
    tmp_path: Path, rng, args: list[str], progress: Callable[[], int], *, grouped: bool
) -> list[float]:
    """Start, wait for a random amount of progress, SIGKILL; ``KILLS`` times. Returns how
    long each restart took to make progress."""
    recovery = []
    for run in range(KILLS):
        done = progress()
        # Kill points spread over the stream, leaving work for every later run.
        target = done + rng.randint(1, max(1, (TOTAL - done) // (KILLS - run + 1)))
        worker = Worker(tmp_path, run, args)
        started = time.monotonic()
        try:
            try:
                eventually(lambda w=worker, t=target: w.alive() and progress() >= t, 120, 0.005)
            except AssertionError as exc:
                raise AssertionError(
                    f"run {run} stopped at {progress()} of {target}: {worker.dump()}"
                ) from exc
            recovery.append(time.monotonic() - started)
            time.sleep(rng.uniform(0, 0.05))  # between transactions, or inside one
        finally:
            worker.kill()
        if grouped:
            wait_session_expiry(LEASE_MS)  # the next member joins an empty group
    return recovery


def finish(tmp_path: Path, args: list[str], progress: Callable[[], int]) -> None:
    worker = Worker(tmp_path, KILLS, args)
    try:
        eventually(lambda: worker.alive() and progress() >= TOTAL, 180, 0.05)
        time.sleep(1.0)  # nothing more may come
    finally:
        worker.kill()


def test_sql_sink_holds_every_record_once_across_kills(
    cluster: Cluster, stream_factory, tmp_path: Path, request, rng
) -> None:
    url = make_db_url("postgresql", tmp_path, request)
    store = SqlStore(url)
    store.upgrade()
    request.addfinalizer(store.close)
    table = ledger_table(f"ledger_{uuid.uuid4().hex[:8]}")
    table.metadata.create_all(store.engine)
    stream = stream_factory(partitions=PARTITIONS, global_order=False)
    publish_input(cluster, stream)
    args = ["sql", cluster.bootstrap_servers, stream.name, str(PARTITIONS), "ledger",
            "--db", url, "--table", table.name]  # fmt: skip

    def count() -> int:
        with store.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())

    def check() -> None:
        with store.engine.connect() as conn:
            places = conn.execute(sa.select(table.c.kafka_partition, table.c.kafka_offset)).all()
        per_partition: dict[int, list[int]] = {}
        for p, o in sorted(places):
            per_partition.setdefault(p, []).append(o)
        for p, offsets in per_partition.items():
            assert offsets == list(range(len(offsets))), f"partition {p}: hole or duplicate"
        stored = SqlPositions(store).positions("ledger", stream.name)
        assert stored == {p: len(o) for p, o in per_partition.items()}, "positions match rows"

    started = time.monotonic()
    recovery = kill_at_random_points(tmp_path, rng, args, count, grouped=False)
    check()
    finish(tmp_path, args, count)
    check()
    with store.engine.connect() as conn:
        values = conn.execute(sa.select(table.c.value)).scalars().all()
    assert len(values) == TOTAL
    assert sorted(int(bytes(v)) for v in values) == list(range(TOTAL)), "every record exactly once"
    record_figures(
        "exactly-once-sql", runs=KILLS, records=TOTAL, duplicates=0, lost=0,
        recovery_s=round(max(recovery), 2), elapsed_s=round(time.monotonic() - started, 1),
    )  # fmt: skip


def read_output(cluster: Cluster, stream: StreamConfig) -> list[Record]:
    config = SubscriberConfig(
        stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST, max_batch=5_000
    )
    got: list[Record] = []
    with Subscriber(cluster, config) as sub:
        eventually(lambda: got.extend(sub.poll(500)) or len(got) >= TOTAL, 120)
        while batch := sub.poll(1_000):
            got.extend(batch)
    return got


def test_transactions_publish_every_input_once_across_kills(
    cluster: Cluster, stream_factory, tmp_path: Path, rng, embedded_broker: bool
) -> None:
    source = stream_factory(partitions=PARTITIONS, global_order=False)
    sink = stream_factory(partitions=PARTITIONS, global_order=False)
    publish_input(cluster, source)
    group = f"eos-{uuid.uuid4().hex[:8]}"
    args = ["txn", cluster.bootstrap_servers, source.name, str(PARTITIONS), group,
            "--output", sink.name]  # fmt: skip

    def progress() -> int:  # the input has no transaction markers: offsets count records
        return sum(committed(cluster, group, source.name, PARTITIONS).values())

    started = time.monotonic()
    recovery = kill_at_random_points(tmp_path, rng, args, progress, grouped=True)
    finish(tmp_path, args, progress)
    output = read_output(cluster, sink)
    copies = Counter(r.header("in") for r in output)
    inputs = {f"{p}:{o}".encode() for p in range(PARTITIONS) for o in range(TOTAL)}
    assert set(copies) <= inputs
    assert {int(r.data) for r in output} == set(range(TOTAL)), "every input is in the output"
    duplicates = sum(n - 1 for n in copies.values())
    if not embedded_broker:
        assert duplicates == 0, "read_committed sees each input once"
    else:
        # Tansu delivers aborted transactions to read_committed readers
        # (docs/compatibility.md): a copy beyond the first may only come from the
        # transaction a kill interrupted, the last one of a killed run.
        last_txn: dict[bytes, int] = {}
        for r in output:
            run, txn = r.header("run") or b"", int(r.header("txn") or b"0")
            last_txn[run] = max(last_txn.get(run, 0), txn)
        for place, n in copies.items():
            if n == 1:
                continue
            writers = [(r.header("run"), int(r.header("txn") or b"0")) for r in output
                       if r.header("in") == place]  # fmt: skip
            interrupted = [
                w for w in writers if w[0] != str(KILLS).encode() and w[1] == last_txn[w[0]]
            ]
            assert len(writers) - len(interrupted) <= 1, f"{place!r} written by {writers}"
    record_figures(
        "exactly-once-transactions", runs=KILLS, records=TOTAL, duplicates=duplicates, lost=0,
        recovery_s=round(max(recovery), 2), elapsed_s=round(time.monotonic() - started, 1),
    )  # fmt: skip
