"""Spark on a standalone cluster: the archive job and format("bolide") reads, 1 and 2 workers.

The benchmark starts a master and one worker of 1 core and 1 GiB
(``bolide.testing.spark_cluster``) on this machine, then adds a second worker; each time a
new session whose executors take every worker's core. The same records (``--records`` of
``--payload`` bytes with two headers, over two partitions: one Spark task per partition) are
measured, best of ``--repeat``:

* format("bolide") batch read, forced through every column by an aggregate;
* archive job: Structured Streaming from format("bolide") into PostgreSQL (``--db``: executors
  on other machines cannot share a SQLite file), ``availableNow``, ``--batch`` records per
  micro-batch, a fresh schema and checkpoint each run, timed from the call to its return
  (planning, task start and every micro-batch included);
* the ``Archiver`` (bolide.stores, one process, no Spark) of the same records into the same
  database, timed from its first committed batch to caught up, as in bench_store;
* the driver's memory as the batch grows: the archive job of a quarter of ``--memory-records``
  records of 1 KiB in ONE micro-batch, then of all of them (another stream) in one, on the 2
  workers, from a fresh driver process (its own JVM): the peak RSS (VmHWM) of the driver's
  Python and of its JVM after each stays flat when the rows stay on the executors.

The load average is printed at start and end: Kafka, PostgreSQL, the master, the workers and
their executors share this machine's cores with whatever else runs. Run
``python -m benchmarks.bench_spark_cluster --help`` from the repository root, or
``bolide bench --only spark_cluster``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/bench_x.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import os
import tempfile
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

from benchmarks._common import (
    Command,
    Context,
    Ratio,
    Report,
    Skipped,
    bench_databases,
    machine_info,
    markdown_table,
    positive_int,
)
from benchmarks.bench_spark import PARTITIONS, best_seconds, fill, needs_pyspark, stream_options
from benchmarks.bench_store import archive_stream
from bolide.facade import Cluster, StreamConfig

__all__ = ["bench", "driver_memory", "main", "run"]

NAME = "spark_cluster"
#: The issue's goal for the archive job on this machine's two cores.
SCALING_TARGET = 1.6
READ = "format('bolide') batch read"
ARCHIVE = "archive job into PostgreSQL"
ARCHIVER = "Archiver into PostgreSQL (one process)"
_MIB = 1024 * 1024


def _stream(prefix: str) -> StreamConfig:
    name = f"bench-{prefix}-{uuid.uuid4().hex[:8]}"
    return StreamConfig(name=name, partitions=PARTITIONS, global_order=False)


def _stored(url: str, stream: str, records: int) -> None:
    from bolide.stores import SqlStore

    with SqlStore(url) as store:
        stored = sum(len(store.read(stream, p, 0, records)) for p in range(PARTITIONS))
    if stored != records:
        raise RuntimeError(f"{stream}: {stored} records archived, expected {records}")


def _read(spark: Any, cluster: Cluster, stream: StreamConfig, records: int) -> None:
    from bolide.spark import kafka_options

    options = kafka_options(stream, cluster, startingOffsets="earliest", includeHeaders=True)
    df = spark.read.format("bolide").options(**options).load()
    row = df.selectExpr(
        "count(*) AS n", "sum(length(value)) AS b", "sum(size(headers)) AS h"
    ).first()
    if row is None or row["n"] != records or row["h"] != 2 * records:
        raise RuntimeError(f"format('bolide') read {row}, expected {records} records")


def _archive(
    spark: Any, cluster: Cluster, stream: StreamConfig, pg_url: str, records: int, batch: int
) -> float:
    """Seconds of one archive job of ``stream`` into a fresh schema (not counting its set-up)."""
    from bolide.spark import archive

    with (
        bench_databases(pg_url, NAME, sqlite=False) as dbs,
        tempfile.TemporaryDirectory() as tmp,
    ):
        url = dict(dbs)["postgresql"]
        began = time.perf_counter()
        archive(
            spark,
            stream,
            url,
            str(Path(tmp) / "ckpt"),
            bootstrap=cluster,
            source="bolide",
            max_offsets_per_trigger=batch,
        )
        seconds = time.perf_counter() - began
        _stored(url, stream.name, records)
    return seconds


def _on_workers(
    standalone: Any, cluster: Cluster, stream: StreamConfig, args: argparse.Namespace
) -> dict[str, float]:
    """Rows/s of the read and of the archive job on the cluster's workers, in a new session."""
    spark = standalone.session("bolide-bench-cluster")
    try:
        _read(spark, cluster, stream, args.records)  # warms every executor's Python workers
        read = best_seconds(args.repeat, lambda: _read(spark, cluster, stream, args.records))
        job = min(
            _archive(spark, cluster, stream, args.db, args.records, args.batch)
            for _ in range(args.repeat)
        )
    finally:
        spark.stop()
    return {READ: args.records / read, ARCHIVE: args.records / job}


def _peak_rss(pid: int) -> int:
    """The peak resident set (VmHWM) of process ``pid``, in bytes."""
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


def _driver_jvm() -> int:
    """The pid of this process's JVM (PySpark's gateway: a ``java`` child of this process)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="ascii", errors="replace")
        except OSError:
            continue
        command, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        if command == "java" and int(rest.split()[1]) == os.getpid():
            return int(entry.name)
    raise RuntimeError("the driver's JVM is not a child of this process")


def driver_memory(
    master_url: str, workers: int, cluster: Cluster, streams: Sequence[str], url: str, tmp: str
) -> list[tuple[int, int]]:
    """In a fresh driver process, archive all of each stream in turn, each in one micro-batch
    on the cluster; after each, the peak RSS so far of this process and of its JVM, in bytes.
    Peaks only grow: a batch that passed through the driver would raise them."""
    from bolide.spark import archive, spark_session
    from bolide.testing.spark_cluster import session_settings

    os.environ["PYSPARK_PYTHON"] = sys.executable
    settings = session_settings(workers)
    spark = spark_session("bolide-bench-memory", master_url, config=settings)
    peaks = []
    try:
        for stream in streams:
            checkpoint = str(Path(tmp) / f"ckpt-{stream}")
            archive(
                spark,
                stream,
                url,
                checkpoint,
                bootstrap=cluster,
                source="bolide",
                max_offsets_per_trigger=None,
            )
            peaks.append((_peak_rss(os.getpid()), _peak_rss(_driver_jvm())))
    finally:
        spark.stop()
    return peaks


def _memory(
    standalone: Any, cluster: Cluster, streams: dict[int, StreamConfig], pg_url: str
) -> list[dict[str, Any]]:
    """``driver_memory`` of the streams (keyed by their record counts, smallest first), in a
    process of its own, so that no earlier run of this one has raised the peaks."""
    with (
        bench_databases(pg_url, NAME, sqlite=False) as dbs,
        tempfile.TemporaryDirectory() as tmp,
        ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool,
    ):
        url = dict(dbs)["postgresql"]
        names = [s.name for s in streams.values()]
        master, workers = standalone.master_url, len(standalone.workers)
        peaks = pool.submit(driver_memory, master, workers, cluster, names, url, tmp).result()
        for records, stream in streams.items():
            _stored(url, stream.name, records)
    return [
        {"records": records, "python_mib": python / _MIB, "jvm_mib": jvm / _MIB}
        for records, (python, jvm) in zip(streams, peaks, strict=True)
    ]


def _archiver(
    cluster: Cluster, stream: StreamConfig, pg_url: str, records: int, repeat: int
) -> float:
    from bolide.stores import SqlStore

    batch = max(1, min(5_000, records // 10))  # several batches: its rate starts at the first
    best = 0.0
    for _ in range(repeat):
        with (
            bench_databases(pg_url, NAME, sqlite=False) as dbs,
            SqlStore(dict(dbs)["postgresql"]) as store,
        ):
            rate, archived = archive_stream(cluster, store, stream, batch)
        if archived != records:
            raise RuntimeError(f"the Archiver archived {archived} records, expected {records}")
        best = max(best, rate)
    return best


def run(cluster: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    """Fill the streams, start the cluster with 1 then 2 workers and measure on each; then the
    driver's memory and the ``Archiver``. Returns the figures and the load averages."""
    from pyspark.sql import SparkSession

    from bolide.testing.spark_cluster import StandaloneCluster

    load_start = os.getloadavg()
    active = SparkSession.getActiveSession()
    if active is not None:  # another benchmark's local session: one SparkContext per process
        active.stop()
    stream = _stream("spark-cluster")
    fill(cluster, stream, args.records, args.payload)
    small, large = max(1, args.memory_records // 4), args.memory_records
    memory_streams = {n: _stream(f"spark-memory-{n}") for n in (small, large)}
    for n, s in memory_streams.items():
        fill(cluster, s, n, 1024)
    workers: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bolide-spark-cluster-") as tmp:
        standalone = StandaloneCluster(Path(tmp))
        try:
            standalone.start(workers=1)
            workers["1"] = _on_workers(standalone, cluster, stream, args)
            standalone.add_worker()
            workers["2"] = _on_workers(standalone, cluster, stream, args)
            memory = _memory(standalone, cluster, memory_streams, args.db)
        finally:
            standalone.stop()
    archiver = _archiver(cluster, stream, args.db, args.records, args.repeat)
    return {
        "workers": workers,
        "archiver_rows_per_s": archiver,
        "memory": memory,
        "load_average": {"start": load_start, "end": os.getloadavg()},
    }


def _tables(results: dict[str, Any]) -> str:
    one, two = results["workers"]["1"], results["workers"]["2"]
    rows = [
        [name, f"{one[name]:,.0f}", f"{two[name]:,.0f}", f"{two[name] / one[name]:.2f}x"]
        for name in (READ, ARCHIVE)
    ]
    rows.append([ARCHIVER, f"{results['archiver_rows_per_s']:,.0f}", "", ""])
    rates = markdown_table(["rows/s", "1 worker", "2 workers", "2 / 1"], rows)
    memory = markdown_table(
        [
            "archive job, one micro-batch of 1 KiB records",
            "driver Python peak RSS (MiB)",
            "driver JVM peak RSS (MiB)",
        ],
        [
            [f"{m['records']:,}", f"{m['python_mib']:,.0f}", f"{m['jvm_mib']:,.0f}"]
            for m in results["memory"]
        ],
    )
    load = results["load_average"]
    loads = (
        f"load average (1, 5, 15 min) at start {_load(load['start'])}, at end {_load(load['end'])}"
    )
    return f"{rates}\n\n{memory}\n\n{loads}"


def _load(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def _ratios(results: dict[str, Any]) -> list[Ratio]:
    one, two = results["workers"]["1"], results["workers"]["2"]
    return [
        Ratio(
            NAME,
            f"{ARCHIVE}, 2 workers",
            f"{ARCHIVE}, 1 worker",
            "rows/s",
            one[ARCHIVE],
            two[ARCHIVE],
            SCALING_TARGET,
        ),
        Ratio(NAME, f"{READ}, 2 workers", f"{READ}, 1 worker", "rows/s", one[READ], two[READ]),
        Ratio(
            NAME,
            f"{ARCHIVE}, 2 workers",
            ARCHIVER,
            "rows/s",
            results["archiver_rows_per_s"],
            two[ARCHIVE],
        ),
    ]


def _title(args: argparse.Namespace, broker: str, elapsed: float) -> str:
    return (
        f"spark_cluster ({args.records:,} records of {args.payload} B over {PARTITIONS} "
        f"partitions, standalone workers of 1 core; {broker}, {elapsed:.0f} s)"
    )


def _measure(context: Context, args: argparse.Namespace) -> Report:
    """Both worker counts, the driver's memory and the ``Archiver``; the scaling ratios."""
    context.say(NAME, f"{args.records:,} records, best of {args.repeat}, 1 then 2 workers")
    started = time.monotonic()
    results = run(context.cluster, args)
    title = _title(args, context.broker, time.monotonic() - started)
    text = f"{_machine()}\n\n{_tables(results)}"
    return Report(title, text, _ratios(results), {"results": results})


def _check(args: argparse.Namespace) -> None:
    """A PostgreSQL ``--db`` (``Skipped`` without one) and PySpark, before any broker starts."""
    if not args.db:
        raise Skipped("needs PostgreSQL (--db; --pg in bolide bench): the executors share it")
    if not args.db.startswith("postgresql"):
        raise ValueError(f"--db must be a PostgreSQL URL (the executors share it), got {args.db!r}")
    needs_pyspark(args)


def _options(parser: argparse.ArgumentParser) -> None:
    stream_options(parser)
    parser.add_argument(
        "--batch", type=positive_int, default=50_000, help="records per micro-batch"
    )
    parser.add_argument(
        "--memory-records",
        type=positive_int,
        default=40_000,
        help="1 KiB records in the larger memory probe's one micro-batch",
    )
    parser.add_argument(
        "--repeat", type=positive_int, default=1, help="runs per measurement (best kept)"
    )


#: ``--quick``: tiny counts, a smoke run.
QUICK = ["--records", "400", "--batch", "200", "--memory-records", "400", "--repeat", "1"]
COMMAND = Command(NAME, _measure, _options, QUICK, __doc__, database="--db", check=_check)

bench = COMMAND.bench
main = COMMAND.main


def _machine() -> str:
    info = machine_info()
    return ", ".join(f"{k}: {v}" for k, v in info.items())


if __name__ == "__main__":
    sys.exit(main())
