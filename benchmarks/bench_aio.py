"""bolide's asyncio API against its sync API, and many asyncio subscribers on one loop.

Throughput rows run the same work through ``Publisher``/``Subscriber`` and through
``AsyncPublisher``/``AsyncSubscriber`` in one process against one broker, alternating sync and
async and keeping the best of ``--repeat``. The fan-out rows open ``--subscribers`` subscribers
(all on one event loop, against one thread per sync subscriber), publish ``--fanout-records``
records and time until every subscriber has all of them; they report memory (RSS) and Python
threads added, deliveries/s and the CPU the quiet subscribers burn while waiting.

Run ``python -m benchmarks.bench_aio --help`` from the repository root.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/bench_x.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import math
import resource
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks._common import Command, Context, Ratio, Report, markdown_table, positive_int
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
from bolide.facade.aio import AsyncPublisher, AsyncSubscriber
from bolide.facade.kafka import ensure_topic

__all__ = ["Row", "bench", "main", "run", "table"]

NAME = "aio"
PAYLOAD = 100
_TIMEOUT_S = 180.0
#: Quiet consumers by the hundred: a longer broker-side wait keeps empty fetches few.
_MANY = {"fetch.wait.max.ms": 500, "fetch.queue.backoff.ms": 50}


@dataclass
class Row:
    """One measured quantity, sync against asyncio."""

    metric: str
    unit: str
    sync: float
    aio: float
    higher_is_better: bool

    @property
    def ratio(self) -> float:
        """asyncio / sync."""
        return self.aio / self.sync if self.sync else math.inf


def _stream(cluster: Cluster, label: str) -> StreamConfig:
    stream = StreamConfig(name=f"bench-aio-{label}-{uuid.uuid4().hex[:10]}")
    ensure_topic(cluster, stream)
    return stream


def _records(count: int) -> list[Record]:
    return [Record(b"x" * PAYLOAD) for _ in range(count)]


# -- publish ----------------------------------------------------------------------------------


def sync_publish(cluster: Cluster, stream: StreamConfig, count: int) -> float:
    """Records/s: ``publish_async`` for every record, then wait for every future."""
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        pub.publish(Record(b"warm-up"))
        records = _records(count)
        start = time.perf_counter()
        futures = [pub.publish_async(r) for r in records]
        for f in futures:
            f.result(_TIMEOUT_S)
        return count / (time.perf_counter() - start)


def aio_publish(cluster: Cluster, stream: StreamConfig, count: int) -> float:
    """Records/s: ``publish_nowait`` for every record (``await publish`` when full), then
    await every future."""

    async def main() -> float:
        async with AsyncPublisher(cluster, PublisherConfig(stream=stream)) as pub:
            await pub.publish(Record(b"warm-up"))
            records = _records(count)
            start = time.perf_counter()
            futures: list[Any] = []
            for r in records:
                try:
                    futures.append(pub.publish_nowait(r))
                except Exception:  # the local queue is full: wait for room
                    futures.append(asyncio.ensure_future(pub.publish(r)))
            await asyncio.gather(*futures)
            return count / (time.perf_counter() - start)

    return asyncio.run(main())


def sync_publish_acked(cluster: Cluster, stream: StreamConfig, count: int) -> float:
    """Records/s, one at a time: ``publish`` waits for each acknowledgement."""
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        pub.publish(Record(b"warm-up"))
        start = time.perf_counter()
        for r in _records(count):
            pub.publish(r)
        return count / (time.perf_counter() - start)


def aio_publish_acked(cluster: Cluster, stream: StreamConfig, count: int) -> float:
    """Records/s, one at a time: ``await publish`` for each acknowledgement."""

    async def main() -> float:
        async with AsyncPublisher(cluster, PublisherConfig(stream=stream)) as pub:
            await pub.publish(Record(b"warm-up"))
            start = time.perf_counter()
            for r in _records(count):
                await pub.publish(r)
            return count / (time.perf_counter() - start)

    return asyncio.run(main())


# -- poll -------------------------------------------------------------------------------------


def _earliest(stream: StreamConfig, **extra: Any) -> SubscriberConfig:
    return SubscriberConfig(
        stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST, **extra
    )


def sync_poll(cluster: Cluster, stream: StreamConfig, count: int, max_batch: int) -> float:
    """Records/s reading ``count`` records already in the stream."""
    with Subscriber(cluster, _earliest(stream, max_batch=max_batch)) as sub:
        start = time.perf_counter()
        got = 0
        while got < count:
            got += len(sub.poll(1000))
            if time.perf_counter() - start > _TIMEOUT_S:
                raise TimeoutError("sync poll")
        return count / (time.perf_counter() - start)


def aio_poll(cluster: Cluster, stream: StreamConfig, count: int, max_batch: int) -> float:
    """Records/s reading ``count`` records already in the stream, with ``await poll``."""

    async def main() -> float:
        async with AsyncSubscriber(cluster, _earliest(stream, max_batch=max_batch)) as sub:
            start = time.perf_counter()
            got = 0
            async with asyncio.timeout(_TIMEOUT_S):
                while got < count:
                    got += len(await sub.poll(1000))
            return count / (time.perf_counter() - start)

    return asyncio.run(main())


def _fill(cluster: Cluster, stream: StreamConfig, count: int) -> None:
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for r in _records(count):
            pub.produce(r)
        pub.flush(_TIMEOUT_S)


# -- fan-out ----------------------------------------------------------------------------------


@dataclass
class Fanout:
    """What one fan-out run measured."""

    open_s: float
    rss_mb: float  # while every subscriber waits
    threads: int  # Python threads added, while every subscriber waits
    deliveries_per_s: float
    idle_cpu: float  # fraction of one core used while every subscriber waits


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return math.nan


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def aio_fanout(cluster: Cluster, subscribers: int, records: int, idle_s: float) -> Fanout:
    """``subscribers`` asyncio subscribers on one loop, each reading ``records`` records."""
    stream = _stream(cluster, "fanout")
    config = SubscriberConfig(stream=stream, consumer_config=_MANY)

    async def main() -> Fanout:
        rss, threads = _rss_mb(), threading.active_count()
        started = time.perf_counter()
        subs = [AsyncSubscriber(cluster, config) for _ in range(subscribers)]
        await asyncio.gather(*(s.open() for s in subs))
        opened = time.perf_counter() - started
        await asyncio.sleep(1.0)  # let the waits settle to their quiet pace
        cpu, wall = _cpu_s(), time.perf_counter()
        await asyncio.sleep(idle_s)
        idle = (_cpu_s() - cpu) / (time.perf_counter() - wall)
        rss_added, threads_added = _rss_mb() - rss, threading.active_count() - threads
        counts = [0] * subscribers
        done = asyncio.Event()
        remaining = subscribers

        async def listen(i: int, sub: AsyncSubscriber) -> None:
            nonlocal remaining
            async for _ in sub:
                counts[i] += 1
                if counts[i] == records:
                    remaining -= 1
                    if not remaining:
                        done.set()
                    return

        tasks = [asyncio.create_task(listen(i, s)) for i, s in enumerate(subs)]
        async with AsyncPublisher(cluster, PublisherConfig(stream=stream)) as pub:
            start = time.perf_counter()
            await pub.publish_many(_records(records))
            await asyncio.wait_for(done.wait(), _TIMEOUT_S)
            elapsed = time.perf_counter() - start
        result = Fanout(
            open_s=opened,
            rss_mb=rss_added,
            threads=threads_added,
            deliveries_per_s=subscribers * records / elapsed,
            idle_cpu=idle,
        )
        await asyncio.gather(*tasks)
        await asyncio.gather(*(s.close() for s in subs))
        return result

    return asyncio.run(main())


def sync_fanout(cluster: Cluster, subscribers: int, records: int, idle_s: float) -> Fanout:
    """``subscribers`` sync subscribers, each polling in a thread of its own."""
    stream = _stream(cluster, "fanout")
    config = SubscriberConfig(stream=stream, consumer_config=_MANY)
    rss, threads = _rss_mb(), threading.active_count()
    started = time.perf_counter()
    subs = [Subscriber(cluster, config) for _ in range(subscribers)]
    opened = time.perf_counter() - started
    counts = [0] * subscribers
    finished = threading.Barrier(subscribers + 1)

    def listen(i: int, sub: Subscriber) -> None:
        while counts[i] < records:
            counts[i] += len(sub.poll(100))
        finished.wait(_TIMEOUT_S)

    workers = [
        threading.Thread(target=listen, args=(i, s), daemon=True) for i, s in enumerate(subs)
    ]
    for w in workers:
        w.start()
    time.sleep(1.0)
    cpu, wall = _cpu_s(), time.perf_counter()
    time.sleep(idle_s)
    idle = (_cpu_s() - cpu) / (time.perf_counter() - wall)
    rss_added, threads_added = _rss_mb() - rss, threading.active_count() - threads
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        start = time.perf_counter()
        pub.publish_many(_records(records)).result(_TIMEOUT_S)
        finished.wait(_TIMEOUT_S)
        elapsed = time.perf_counter() - start
    result = Fanout(
        open_s=opened,
        rss_mb=rss_added,
        threads=threads_added,
        deliveries_per_s=subscribers * records / elapsed,
        idle_cpu=idle,
    )
    for w in workers:
        w.join(_TIMEOUT_S)
    for s in subs:
        s.close()
    return result


# -- the run ----------------------------------------------------------------------------------


def _best(repeat: int, sync: Callable[[], float], aio: Callable[[], float]) -> tuple[float, float]:
    sync_best = aio_best = 0.0
    for _ in range(repeat):
        sync_best = max(sync_best, sync())
        aio_best = max(aio_best, aio())
    return sync_best, aio_best


def run(
    cluster: Cluster,
    *,
    count: int,
    acked: int,
    repeat: int,
    subscribers: int,
    fanout_records: int,
    idle_s: float,
    progress: Callable[[str], None] = lambda _: None,
) -> list[Row]:
    """Measure every row; ``progress`` gets a line per phase."""
    rows: list[Row] = []
    progress(f"publish {count} records")
    s, a = _best(
        repeat,
        lambda: sync_publish(cluster, _stream(cluster, "pub"), count),
        lambda: aio_publish(cluster, _stream(cluster, "pub"), count),
    )
    rows.append(Row("publish (no wait per record)", "records/s", s, a, True))
    progress(f"publish {acked} records one acknowledgement at a time")
    s, a = _best(
        repeat,
        lambda: sync_publish_acked(cluster, _stream(cluster, "ack"), acked),
        lambda: aio_publish_acked(cluster, _stream(cluster, "ack"), acked),
    )
    rows.append(Row("publish, awaiting each ack", "records/s", s, a, True))
    full = _stream(cluster, "poll")
    _fill(cluster, full, count)
    for max_batch in (1000, 10):
        progress(f"poll {count} records, max_batch={max_batch}")
        s, a = _best(
            repeat,
            lambda mb=max_batch: sync_poll(cluster, full, count, mb),  # type: ignore[misc]
            lambda mb=max_batch: aio_poll(cluster, full, count, mb),  # type: ignore[misc]
        )
        rows.append(Row(f"poll, max_batch={max_batch}", "records/s", s, a, True))
    progress(f"fan-out: {subscribers} sync subscribers (a thread each)")
    sync_fan = sync_fanout(cluster, subscribers, fanout_records, idle_s)
    progress(f"fan-out: {subscribers} asyncio subscribers on one loop")
    aio_fan = aio_fanout(cluster, subscribers, fanout_records, idle_s)
    label = f"{subscribers} subscribers"
    rows += [
        Row(f"{label}: open", "s", sync_fan.open_s, aio_fan.open_s, False),
        Row(f"{label}: RSS added", "MB", sync_fan.rss_mb, aio_fan.rss_mb, False),
        Row(f"{label}: Python threads added", "threads", sync_fan.threads, aio_fan.threads, False),
        Row(
            f"{label}: deliveries ({fanout_records} records each)",
            "deliveries/s",
            sync_fan.deliveries_per_s,
            aio_fan.deliveries_per_s,
            True,
        ),
        Row(f"{label}: CPU while quiet", "cores", sync_fan.idle_cpu, aio_fan.idle_cpu, False),
    ]
    return rows


def table(rows: Sequence[Row]) -> str:
    """The rows as a Markdown table."""
    return markdown_table(
        ["metric", "unit", "sync", "asyncio", "asyncio/sync"],
        [(r.metric, r.unit, _fmt(r.sync), _fmt(r.aio), f"{r.ratio:.2f}") for r in rows],
    )


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--count", type=positive_int, default=50_000, help="records per run")
    parser.add_argument("--acked", type=positive_int, default=500, help="records acked one by one")
    parser.add_argument("--repeat", type=positive_int, default=3, help="runs per row (best kept)")
    parser.add_argument("--subscribers", type=positive_int, default=200, help="fan-out size")
    parser.add_argument("--fanout-records", type=positive_int, default=200, help="fan-out records")
    parser.add_argument("--idle-s", type=float, default=3.0, help="quiet time measured")


#: ``--quick``: tiny counts, a smoke run.
QUICK = ["--count", "300", "--acked", "5", "--repeat", "1", "--subscribers", "3"]
QUICK += ["--fanout-records", "3", "--idle-s", "0.2"]


def _measure(context: Context, args: argparse.Namespace) -> Report:
    """Every row; the throughput rows are the headline ratios (asyncio against the sync API,
    no target)."""
    rows = run(
        context.cluster,
        count=args.count,
        acked=args.acked,
        repeat=args.repeat,
        subscribers=args.subscribers,
        fanout_records=args.fanout_records,
        idle_s=args.idle_s,
        progress=lambda msg: context.say(NAME, msg),
    )
    ratios = [
        Ratio(NAME, r.metric, "sync API", r.unit, r.sync, r.aio) for r in rows if r.higher_is_better
    ]
    title = f"asyncio: sync vs asyncio API ({context.broker})"
    data = {"rows": [{**asdict(r), "ratio": r.ratio} for r in rows]}
    return Report(title, table(rows), ratios, data)


COMMAND = Command(NAME, _measure, _options, QUICK, __doc__)

bench = COMMAND.bench
main = COMMAND.main


if __name__ == "__main__":
    sys.exit(main())
