"""A subscriber-group member with a resequencer, run as its own process by the failover test.

It logs what it processes and what the broker says is confirmed, one line per event:

``R <time> <partition> <offset> <group> <number> <size>``
    a record released by the resequencer and processed (in release order);
``K <time> <partition> <position>``
    the group's confirmed position (next offset to read) as the broker reported it;
``READY <time>``
    the member holds a lease.

Usage: ``python -m tests.resequencer.member BOOTSTRAP TOPIC PARTITIONS GROUP LOG STOPFILE MODE``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

from bolide.facade import (
    Cluster,
    Record,
    Resequencer,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.resequencer.sequence import NUMBER_HEADER, SEQUENCE_GROUP_HEADER, SIZE_HEADER

LEASE_MS = 6000


def _process(out: TextIO, record: Record) -> None:
    group = (record.header(SEQUENCE_GROUP_HEADER) or b"").decode()
    number = (record.header(NUMBER_HEADER) or b"").decode()
    size = (record.header(SIZE_HEADER) or b"").decode()
    out.write(f"R {time.time():.6f} {record.partition} {record.offset} {group} {number} {size}\n")


def run(argv: list[str]) -> None:
    bootstrap, topic, partitions, group, log_path, stop_path, mode = argv
    stream = StreamConfig(name=topic, partitions=int(partitions), global_order=False)
    reseq = Resequencer(mode=mode, timeout_s=300)  # type: ignore[arg-type]
    config = SubscriberConfig(
        stream=stream, group=group, lease_timeout_ms=LEASE_MS, error_handler=lambda s, e: None
    )
    confirmed: dict[int, int] = {}
    ready = False
    with Subscriber(Cluster(bootstrap), config) as sub, open(log_path, "a", buffering=1) as out:
        while not os.path.exists(stop_path):
            batch = sub.poll(100)
            for record in batch:
                for released in reseq.offer(record):
                    _process(out, released)
            if not ready and sub.is_assigned():
                ready = True
                out.write(f"READY {time.time():.6f}\n")
            moved = False
            for partition in range(int(partitions)):
                safe = reseq.safe_offset(partition)
                if safe is None or safe <= confirmed.get(partition, -1):
                    continue
                try:
                    sub.confirm(safe, partition=partition)
                except ValueError:
                    continue  # a partition re-assigned and not read again yet
                confirmed[partition] = safe
                moved = True
            if moved:
                # Log what the broker reports: the test never trusts a commit still in flight.
                positions = sub.committed(timeout_s=5)
                now = time.time()
                for p, position in sorted(positions.items()):
                    if position is not None:
                        out.write(f"K {now:.6f} {p} {position}\n")


if __name__ == "__main__":
    run(sys.argv[1:])
