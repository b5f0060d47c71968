"""Quix Streams' side of ``bench_peers``, run in a virtualenv of its own.

Quix Streams pins ``confluent-kafka<2.13``, which bolide cannot import, so ``bench_peers`` runs
this module with the Python of a separate virtualenv (``python -m benchmarks.quix_peer``, from
the repository root) and reads one JSON line, ``{"rate": records_per_s}``, from its stdout. Only
the standard library, Quix Streams and ``benchmarks._steady`` are imported here.

- ``publish``: ``quixstreams.kafka.Producer.produce`` per record, then ``flush``; with
  ``--settings quix`` Quix's own defaults (librdkafka's ``linger.ms=5``, no idempotence, no
  callback per record), with ``--settings bolide`` bolide's (``enable.idempotence``,
  ``acks=all``, ``linger.ms=1``, a delivery callback per record, every one checked).
- ``consume``: an ``Application`` with a ``StreamingDataFrame`` over the topic (bytes values, a
  fresh consumer group, from the earliest offset), timed in the steady state as every side is.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from typing import Any

from benchmarks._steady import SteadyClock

#: Settings for ``publish --settings bolide``: bolide's producer defaults
#: (``bolide.facade.kafka.PRODUCER_DEFAULTS``, restated: bolide cannot be imported here).
BOLIDE_PRODUCER = {"enable.idempotence": True, "acks": "all", "linger.ms": 1}
_TIMEOUT_S = 120.0


def publish(bootstrap: str, topic: str, count: int, size: int, settings: str) -> float:
    """Records/s until every record is acknowledged (flushed)."""
    from quixstreams.kafka import Producer

    extra: dict[str, Any] = dict(BOLIDE_PRODUCER) if settings == "bolide" else {}
    producer = Producer(bootstrap, extra_config=extra)
    payload = bytes(range(size))
    acked = [0]
    failed: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is None:
            acked[0] += 1
        else:
            failed.append(err)

    callback = on_delivery if settings == "bolide" else None
    producer.produce(topic, payload, partition=0)
    producer.flush(_TIMEOUT_S)  # warm-up: connection (and producer id)
    start = time.perf_counter()
    for _ in range(count):
        producer.produce(topic, payload, partition=0, on_delivery=callback)
    left = producer.flush(_TIMEOUT_S)
    elapsed = time.perf_counter() - start
    if left or failed or (callback is not None and acked[0] != count):
        raise RuntimeError(f"Quix publish: {left} left, {len(failed)} failed, {acked[0]} acked")
    return count / elapsed


def consume(bootstrap: str, topic: str, total: int) -> float:
    """Records/s of a ``StreamingDataFrame`` reading ``total`` records, in the steady state."""
    from quixstreams import Application

    clock = SteadyClock(total, _TIMEOUT_S)
    with tempfile.TemporaryDirectory(prefix="bench-quix-") as state_dir:
        app = Application(
            broker_address=bootstrap,
            consumer_group=f"bench-peers-{uuid.uuid4().hex}",
            auto_offset_reset="earliest",
            state_dir=state_dir,
            auto_create_topics=False,
            use_changelog_topics=False,
            loglevel="WARNING",
        )
        seen = [0, 0]  # records, records already counted on the clock

        def on_value(value: bytes) -> None:
            seen[0] += 1
            if seen[0] - seen[1] >= 1000 or seen[0] >= total:
                done = clock.count(seen[0] - seen[1])
                seen[1] = seen[0]
                if done:
                    app.stop()

        sdf = app.dataframe(app.topic(topic, value_deserializer="bytes"))
        sdf.update(on_value)
        app.run()
    if clock.seen < total:
        raise RuntimeError(f"Quix consume: {clock.seen} of {total} records read")
    return clock.rate()


def main(argv: Sequence[str] | None = None) -> int:
    """``publish|consume --bootstrap B --topic T --count N [--size S] [--settings quix|bolide]``."""
    parser = argparse.ArgumentParser(prog="quix_peer", description=__doc__.split("\n")[0])
    parser.add_argument("work", choices=["publish", "consume"])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--settings", choices=["quix", "bolide"], default="quix")
    args = parser.parse_args(argv)
    if args.work == "publish":
        rate = publish(args.bootstrap, args.topic, args.count, args.size, args.settings)
    else:
        rate = consume(args.bootstrap, args.topic, args.count)
    print(json.dumps({"rate": rate}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
