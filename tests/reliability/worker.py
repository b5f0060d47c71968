"""A subscriber process for the crash tests: processes records, logs them, and gets killed.

One line per event, written unbuffered so that a SIGKILL loses nothing already logged:

``READY``
    the member holds its lease (or, for a durable client, is connected);
``P <partition> <offset> [<group> <number>]``
    one record processed (after processing, before its confirm): the resequencer mode adds
    the sequence group and number of the released record.

Modes:

``group``
    a grouped subscriber that confirms each batch after processing it;
``reseq``
    a grouped subscriber feeding a batch resequencer, confirming ``safe_offset`` only;
``durable``
    a durable client, which confirms what it delivered at the start of the next poll;
``parallel``
    a grouped subscriber with a parallel receiver (key order, random handler latency up to
    twice ``--delay-ms``), which confirms below its first unfinished record; with
    ``--fail-every N``, records whose value is a multiple of N fail their first call in each
    process and go through retry tiers (``D <partition> <offset>``: dead-lettered);
``tiers``
    a parallel receiver with retry tiers of 0.2 s and an hour: a record whose value is
    ``stuck`` fails every call (it waits an hour in the second tier, its key parked behind
    it), one whose value is ``once`` fails its first call in the process (none with
    ``--healed``).

Usage: ``python -m tests.reliability.worker MODE BOOTSTRAP TOPIC PARTITIONS GROUP LOG STOP
[--db URL] [--delay-ms MS] [--max-batch N]``.
"""

from __future__ import annotations

import argparse
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TextIO

from bolide.facade import (
    Cluster,
    DurableClientBusyError,
    ReceiverOptions,
    Record,
    Resequencer,
    Retry,
    RetryTier,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.resequencer.sequence import NUMBER_HEADER, SEQUENCE_GROUP_HEADER

LEASE_MS = 4_000
RESEQ_TIMEOUT_S = 3.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="worker")
    parser.add_argument("mode", choices=("group", "reseq", "durable", "parallel", "tiers"))
    parser.add_argument("bootstrap")
    parser.add_argument("topic")
    parser.add_argument("partitions", type=int)
    parser.add_argument("group")
    parser.add_argument("log")
    parser.add_argument("stop")
    parser.add_argument("--db", default=None)
    parser.add_argument("--delay-ms", type=float, default=0.2)
    parser.add_argument("--max-batch", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--fail-every", type=int, default=0)
    parser.add_argument("--healed", action="store_true")
    return parser


def _connect(
    args: argparse.Namespace, on_assign: Callable[[list[Any]], None] | None = None
) -> Subscriber:
    stream = StreamConfig(
        name=args.topic, partitions=args.partitions, global_order=args.partitions == 1
    )
    common = {
        "stream": stream,
        "lease_timeout_ms": LEASE_MS,
        "max_batch": args.max_batch,
        "error_handler": lambda summary, error: None,
        "on_assign": on_assign,
    }
    if args.mode != "durable":
        return Subscriber(Cluster(args.bootstrap), SubscriberConfig(group=args.group, **common))
    deadline = time.monotonic() + 30
    while True:
        try:
            config = SubscriberConfig(durable_id=args.group, durable_registry=args.db, **common)
            return Subscriber(Cluster(args.bootstrap), config)
        except DurableClientBusyError:
            # The killed predecessor's claim lapses after one lease.
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _line(record: Record) -> str:
    line = f"P {record.partition} {record.offset}"
    group = record.header(SEQUENCE_GROUP_HEADER)
    if group is not None:
        line += f" {group.decode()} {(record.header(NUMBER_HEADER) or b'').decode()}"
    return line + "\n"


def run_parallel(args: argparse.Namespace, out: TextIO) -> None:
    """The ``parallel`` mode: the receiver handles and confirms; this thread only waits."""
    delay, rng, lock = args.delay_ms / 1000, random.Random(), threading.Lock()

    failed: set[tuple[int | None, int | None]] = set()

    def handler(record: Record) -> None:
        time.sleep(rng.random() * 2 * delay)  # the work
        place = (record.partition, record.offset)
        with lock:
            failing = args.fail_every and int(record.data or b"0") % args.fail_every == 0
            if failing and place not in failed:  # each such record fails its first call here
                failed.add(place)
                raise RuntimeError("first call fails")
            out.write(_line(record))

    def dead(record: Record, error: BaseException) -> None:
        with lock:
            out.write(f"D {record.partition} {record.offset}\n")

    options: ReceiverOptions = {}
    if args.fail_every:  # retry tiers: the failing record moves on, its key is parked
        tiers = [RetryTier(delay_s=0.3), RetryTier(delay_s=0.4), RetryTier(delay_s=0.5)]
        options = {"retry": Retry(attempts=1, backoff_s=0, tiers=tiers), "dead_letter": dead}

    def assigned(partitions: list[Any]) -> None:
        # A rebalance inside this process (a lease lost on a busy machine) starts a new span:
        # records above the confirmed position are read again, as after a takeover.
        with lock:
            out.write(f"A {' '.join(str(p) for p in partitions)}\n")

    with _connect(args, assigned) as sub:
        sub.attach_receiver(handler, concurrency=args.concurrency, max_in_flight=200, **options)
        while not sub.is_assigned():
            time.sleep(0.05)
        out.write("READY\n")
        while not os.path.exists(args.stop):
            time.sleep(0.05)


def run_tiers(args: argparse.Namespace, out: TextIO) -> None:
    """The ``tiers`` mode: records fail by their value, the receiver moves them through
    its tiers; this thread only waits."""
    lock, calls = threading.Lock(), Counter[tuple[int | None, int | None]]()
    parked = threading.Event()  # the stuck record's key has a second record in the tiers

    def handler(record: Record) -> None:
        with lock:
            calls[(record.partition, record.offset)] += 1
            call = calls[(record.partition, record.offset)]
        if record.data == b"stuck":
            if call == 2:  # in the first tier: the next record of its key parks there too
                parked.wait(60)
            raise RuntimeError("stuck")
        if record.data == b"once" and call == 1 and not args.healed:
            raise RuntimeError("first call fails")
        with lock:
            out.write(_line(record))

    tiers = [RetryTier(delay_s=0.2), RetryTier(delay_s=3600)]
    with _connect(args) as sub:
        receiver = sub.attach_receiver(
            handler, concurrency=4, retry=Retry(attempts=1, backoff_s=0, tiers=tiers)
        )
        while not sub.is_assigned():
            time.sleep(0.05)
        out.write("READY\n")
        while not os.path.exists(args.stop):
            if receiver.metrics().parked >= 2:
                parked.set()
            time.sleep(0.05)


def run(args: argparse.Namespace, out: TextIO) -> None:
    if args.mode == "parallel":
        run_parallel(args, out)
        return
    if args.mode == "tiers":
        run_tiers(args, out)
        return
    delay = args.delay_ms / 1000
    reseq = Resequencer(mode="batch", timeout_s=RESEQ_TIMEOUT_S) if args.mode == "reseq" else None
    confirmed: dict[int, int] = {}
    ready = False
    with _connect(args) as sub:
        if args.mode == "durable":
            out.write("READY\n")
            ready = True
        while not os.path.exists(args.stop):
            batch = sub.poll(100)
            if not ready and sub.is_assigned():
                out.write("READY\n")
                ready = True
            released = list(batch) if reseq is None else []
            if reseq is not None:
                for record in batch:
                    released.extend(reseq.offer(record))
                released.extend(reseq.tick())
            for record in released:
                time.sleep(delay)  # the work
                out.write(_line(record))
            if args.mode == "group" and len(batch):
                sub.confirm()  # confirm after process: only what was handled
            elif reseq is not None:
                for partition in range(args.partitions):
                    safe = reseq.safe_offset(partition)
                    if safe is None or safe <= confirmed.get(partition, -1):
                        continue
                    try:
                        sub.confirm(safe, partition=partition)
                    except ValueError:
                        continue  # a partition re-assigned and not read again yet
                    confirmed[partition] = safe


def main() -> None:
    args = _parser().parse_args()
    with open(args.log, "a", buffering=1, encoding="utf-8") as out:
        run(args, out)


if __name__ == "__main__":
    main()
