"""Where the time of bolide's measured paths goes: each path run once in a process of its own,
sampled by ``py-spy`` (every thread, idle waits left out) during its timed phase only.

The set-up (records published, the broker joined) runs before the sampler attaches; the
process then waits for a line on its standard input, runs the phase and exits. The report
gives, per path, the rate of that run and the functions where the samples landed (self
time, the file and line of the function), so that a ratio in ``docs/performance.md`` that
falls short of its goal comes with where its time is spent. Rates under the sampler are a
little lower than ``bolide bench``'s; compare them with nothing.

Run ``python -m benchmarks.profiles --help`` from the repository root (needs ``py-spy``:
``pip install py-spy``; root, or ptrace allowed, to attach).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from benchmarks._common import DEFAULT_PG, bench_databases, broker_cluster
from bolide.facade import Cluster, Publisher, PublisherConfig, Record, StreamConfig

__all__ = ["PATHS", "Hotspot", "hotspots", "main", "sampler_path"]

_ROOT = Path(__file__).resolve().parents[1]
_PAYLOAD = b"x" * 100
#: ``fn(cluster, count, stack)``: sets a path up and returns its timed phase.
Path_ = Callable[[Cluster, int, ExitStack], Callable[[], float]]


@dataclass(frozen=True, slots=True)
class Hotspot:
    """A function's share of a path's samples (its own time: the leaf frame), and its line
    with the most of them."""

    function: str
    where: str
    share: float


def _published(cluster: Cluster, count: int, headers: int = 0) -> StreamConfig:
    stream = StreamConfig(name=f"profile-{uuid.uuid4().hex[:10]}")
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(count):
            hs = [(f"h{j}", f"value-{i}-{j}".encode()) for j in range(headers)]
            pub.produce(Record(_PAYLOAD, key=f"key-{i % 100}".encode(), headers=hs), None)
        pub.flush(120)
    return stream


def _publishing(cluster: Cluster, count: int, many: bool) -> Callable[[], float]:
    """``publish_async`` per record, or ``publish_many`` per thousand, until all acknowledged:
    the timed part of ``bench_facade``'s rows (their untimed check of every future, which
    builds each one's condition, is left out)."""
    from benchmarks.bench_facade import fresh_topic

    publisher = Publisher(cluster, PublisherConfig(stream=fresh_topic(cluster, "profile")))
    publisher.publish(Record(_PAYLOAD))  # the connection and the idempotent producer id

    def phase() -> float:
        start = time.perf_counter()
        last: Future[Any]
        if many:
            for _ in range(0, count, 1000):
                last = publisher.publish_many([Record(_PAYLOAD) for _ in range(1000)])
        else:
            for _ in range(count):
                last = publisher.publish_async(Record(_PAYLOAD))
        publisher.flush(120)
        last.result(120)
        elapsed = time.perf_counter() - start
        publisher.close()
        return count / elapsed

    return phase


def _poll(cluster: Cluster, count: int, stack: ExitStack) -> Callable[[], float]:
    from benchmarks.bench_facade import bolide_poll

    stream = _published(cluster, count)
    return lambda: bolide_poll(cluster, stream, count)


def _poll_grouped(cluster: Cluster, count: int, stack: ExitStack) -> Callable[[], float]:
    from benchmarks.bench_facade import bolide_poll_grouped

    stream = _published(cluster, count)
    return lambda: bolide_poll_grouped(cluster, stream, count)


def _archive(database: str) -> Path_:
    def prepare(cluster: Cluster, count: int, stack: ExitStack) -> Callable[[], float]:
        from benchmarks.bench_store import archive_stream
        from bolide.stores import SqlStore

        stream = _published(cluster, count, headers=1)
        pg = os.environ.get("BOLIDE_BENCH_PG", DEFAULT_PG) if database == "postgresql" else None
        dbs = stack.enter_context(bench_databases(pg, "profiles", sqlite=pg is None))
        if not dbs:
            raise SystemExit(f"profiles: no {database} to archive into")
        store = stack.enter_context(SqlStore(dbs[0][1]))
        return lambda: archive_stream(cluster, store, stream, 2000)[0]

    return prepare


def _spark_write(cluster: Cluster, count: int, stack: ExitStack) -> Callable[[], float]:
    """What a Spark executor's task of the archive job runs per Arrow batch (the job's
    ``mapInArrow`` function, without Spark): Kafka-schema rows made into records, then
    stored in one transaction per batch of 10,000 (Spark's Arrow batch size)."""
    import pyarrow as pa

    from bolide.spark._archive import records_by_stream
    from bolide.stores import SqlStore

    pg = os.environ.get("BOLIDE_BENCH_PG", DEFAULT_PG)
    dbs = stack.enter_context(bench_databases(pg, "profiles", sqlite=False))
    if not dbs:
        raise SystemExit("profiles: no PostgreSQL for spark_write")
    store = stack.enter_context(SqlStore(dbs[0][1]))
    n = 10_000
    stream = f"profile-{uuid.uuid4().hex[:10]}"
    chunks = [
        pa.RecordBatch.from_pydict(
            {
                "key": [f"key-{i % 100}".encode() for i in range(first, first + n)],
                "value": [_PAYLOAD] * n,
                "topic": [stream] * n,
                "partition": [0] * n,
                "offset": list(range(first, first + n)),
                "timestamp": pa.array([1_700_000_000_000_000 + i for i in range(n)],
                                      pa.timestamp("us")),
                "headers": [[{"key": "h0", "value": b"value"}]] * n,
            }
        )
        for first in range(0, count, n)
    ]  # fmt: skip

    def phase() -> float:
        start = time.perf_counter()
        for chunk in chunks:
            store.store_batches(records_by_stream(pa.Table.from_batches([chunk])))
        return count / (time.perf_counter() - start)

    return phase


def _meteor(cluster: Cluster, count: int, stack: ExitStack) -> Callable[[], float]:
    """Meteor's shape (``bench_meteor``): 4 publishers and 16 subscribers in one process,
    ``count`` records in all; its rate is deliveries/s (the subscribers' set-up, mostly
    waiting for the broker, falls in the phase)."""
    from benchmarks.bench_meteor import one_run

    return lambda: one_run(cluster, "bolide", 4, 16, count // 4)


#: The paths, by name: ``fn(cluster, count, stack)`` sets one up (what it opens goes on
#: ``stack``) and returns its timed phase.
PATHS: dict[str, Path_] = {
    "publish_async": lambda cluster, count, _: _publishing(cluster, count, many=False),
    "publish_many": lambda cluster, count, _: _publishing(cluster, count, many=True),
    "poll": _poll,
    "poll_grouped": _poll_grouped,
    "meteor": _meteor,
    "archive_sqlite": _archive("sqlite"),
    "archive_pg": _archive("postgresql"),
    "spark_write": _spark_write,
}


def _target(name: str, bootstrap: str, count: int) -> None:
    """The sampled process: set ``name`` up, wait for the go, run its phase, print its rate."""
    with ExitStack() as stack:
        phase = PATHS[name](Cluster(bootstrap), count, stack)
        print("ready", flush=True)
        sys.stdin.readline()
        print(f"{phase():.0f}", flush=True)


def hotspots(raw: Iterable[str], top: int) -> tuple[int, list[Hotspot]]:
    """The ``top`` leaf functions of py-spy's raw (collapsed) stacks, with their shares."""
    leaves: Counter[tuple[str, str]] = Counter()
    lines: dict[tuple[str, str], Counter[str]] = {}
    total = 0
    for entry in raw:
        stack, _, count = entry.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        function, _, where = stack.rsplit(";", 1)[-1].partition(" (")
        path, _, line = where.rstrip(")").replace(str(_ROOT) + "/", "").rpartition(":")
        leaves[(function, path)] += int(count)
        lines.setdefault((function, path), Counter())[line] += int(count)
        total += int(count)
    spots = [
        Hotspot(f, f"{p}:{lines[(f, p)].most_common(1)[0][0]}", n / total)
        for (f, p), n in leaves.most_common(top)
    ]
    return total, spots


def sampler_path() -> str | None:
    """py-spy's executable: on the path, or beside this Python (a virtualenv not activated)."""
    beside = Path(sys.executable).with_name("py-spy")
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def _profile(name: str, bootstrap: str, count: int, rate: int, top: int) -> str:
    spy = sampler_path()
    if spy is None:
        raise SystemExit("profiles: py-spy is not installed (pip install py-spy)")
    command = [sys.executable, "-m", "benchmarks.profiles", "--target", name, "-b", bootstrap,
               "--count", str(count)]  # fmt: skip
    with (
        subprocess.Popen(
            command, cwd=_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        ) as target,
        tempfile.NamedTemporaryFile(suffix=".txt") as out,
    ):
        assert target.stdin is not None and target.stdout is not None
        if target.stdout.readline().strip() != "ready":
            target.wait(60)
            raise SystemExit(f"profiles: {name} failed to set up (exit {target.returncode})")
        sampler = subprocess.Popen(
            [spy, "record", "--pid", str(target.pid), "--format", "raw", "--rate", str(rate),
             "--output", out.name, "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(2.0)  # the sampler attached
        target.stdin.write("go\n")
        target.stdin.flush()
        measured = target.stdout.readline().strip()
        target.wait(600)
        if sampler.wait(60) != 0:
            raise SystemExit(
                f"profiles: py-spy could not sample {name} (exit {sampler.returncode})"
            )
        samples, spots = hotspots(Path(out.name).read_text().splitlines(), top)
    lines = [f"## {name}: {measured}/s under the sampler, {samples} samples", ""]
    lines += ["| share | function | where |", "|--:|---|---|"]
    lines += [f"| {s.share:.1%} | `{s.function}` | {s.where} |" for s in spots]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profiles", description=__doc__)
    parser.add_argument("--only", action="append", choices=sorted(PATHS), help="repeatable")
    parser.add_argument("--count", type=int, default=200_000, help="records per path")
    parser.add_argument("--rate", type=int, default=250, help="samples per second")
    parser.add_argument("--top", type=int, default=15, help="functions shown per path")
    parser.add_argument("-b", "--bootstrap", help="Kafka bootstrap servers (default: embedded)")
    parser.add_argument("--target", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.target:
        _target(args.target, args.bootstrap, args.count)
        return 0
    load = os.getloadavg()[0]
    with broker_cluster(args.bootstrap) as (cluster, described):
        bootstrap = cluster.client_config({}, {})["bootstrap.servers"]
        print(f"# Profiles on {described}, load average {load:.2f} at the start\n")
        for name in args.only or list(PATHS):
            print(_profile(name, bootstrap, args.count, args.rate, args.top), "\n", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
