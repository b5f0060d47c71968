"""The console's key search against a full scan of the topic, in one run.

A stream of ``count`` records (100 B, ``count / 100`` keys, so each key has 100 records) is
archived into SQLite; then one key is looked for twice:

- the console's search (``bolide.console.data.Console.search``): the archive's key index,
  then Kafka only past the archived frontier (nothing here: the archive is caught up);
- what Kafka UI and AKHQ do: a consumer reads the whole topic from its start and keeps the
  records with that key.

Each side reports the time to its first result and to its last (the end of the search). The
ratio is the scan's time to the last result over the console's (higher: the console is that
many times faster).

Run from the repository root: ``python -m benchmarks.bench_console [--quick] [--json]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/bench_x.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tempfile
import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from benchmarks._common import Context, Ratio, Report, Skipped, markdown_table, standalone
from bolide.facade import Cluster, Publisher, PublisherConfig, Record, StreamConfig
from bolide.facade.kafka import probe_consumer

NAME = "console"
_TIMEOUT_S = 1800.0


def fill(cluster: Cluster, count: int) -> StreamConfig:
    """A fresh stream of ``count`` records, 100 records per key."""
    stream = StreamConfig(name=f"bench-console-{time.time_ns()}")
    keys = max(1, count // 100)
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(count):
            pub.publish_async(Record(b"x" * 100, key=b"k%d" % (i % keys)))
        pub.flush(_TIMEOUT_S)
    return stream


def scan(cluster: Cluster, stream: str, key: bytes) -> tuple[float, float, int]:
    """A whole-topic read for ``key``: (seconds to the first match, to the end, matches)."""
    consumer = probe_consumer(cluster, **{"enable.partition.eof": False})
    try:
        tp = TopicPartition(stream, 0)
        high = consumer.get_watermark_offsets(tp, timeout=30)[1]
        started = time.perf_counter()
        consumer.assign([TopicPartition(stream, 0, OFFSET_BEGINNING)])
        first, found, at = 0.0, 0, -1
        while at < high - 1:
            for msg in consumer.consume(1000, timeout=1.0):
                if msg.error() is not None:
                    continue
                at = msg.offset() or 0
                if msg.key() == key:
                    found += 1
                    first = first or time.perf_counter() - started
        return first, time.perf_counter() - started, found
    finally:
        consumer.close()


def bench(context: Context) -> Report:
    """``run_all``'s entry: fill and archive a stream, then search one key both ways."""
    try:
        from bolide.console.data import Console
        from bolide.console.settings import ConsoleSettings
    except ImportError as exc:
        raise Skipped(f"the console's extra is not installed: {exc}") from exc
    from bolide.stores import Archiver, Search, SqlStore

    count = 20_000 if context.quick else 1_000_000
    context.say(NAME, f"publish {count} records")
    stream = fill(context.cluster, count)
    with tempfile.TemporaryDirectory(prefix="bolide-bench-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'console.db'}"
        with SqlStore(url) as store:
            store.upgrade()
            context.say(NAME, "archive them")
            group = f"bench-console-{uuid.uuid4().hex[:8]}"
            Archiver(context.cluster, store, [stream], group=group).run(until_caught_up=True)
        key = b"k%d" % (max(1, count // 100) // 2)
        console = Console(ConsoleSettings(context.cluster, db=url))
        try:
            context.say(NAME, "the console's search")
            started = time.perf_counter()
            found = console.search(stream.name, Search(key=key), 1000)
            took = time.perf_counter() - started
        finally:
            console.close()
    context.say(NAME, "a full scan of the topic")
    first, last, matches = scan(context.cluster, stream.name, key)
    if matches != len(found.records):
        raise RuntimeError(f"the scan found {matches} records, the console {len(found.records)}")
    ratio = Ratio(NAME, f"key search, {count:,} records", "full topic scan", "searches/s",
                  1 / last, 1 / took, None)  # fmt: skip
    rows = [
        ["console (archive index, Kafka past the archive)", f"{took:.3f}", f"{took:.3f}",
         f"{ratio.ratio:.1f}x"],
        ["full topic scan (a consumer from the start)", f"{first:.3f}", f"{last:.3f}", "1.0x"],
    ]  # fmt: skip
    table = markdown_table(["search", "first result (s)", "last result (s)", "speed-up"], rows)
    title = f"console: a key's {matches} records among {count:,} ({context.broker}, SQLite)"
    return Report(title, table, [ratio], {"records": count, "matches": matches})


main = standalone(bench, NAME, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
