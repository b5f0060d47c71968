"""A durable client in its own process, for the kill test: prints each record it reads.

Usage: python durable_client.py BOOTSTRAP DB_URL TOPIC DURABLE_ID
"""

from __future__ import annotations

import sys

from bolide.facade import Cluster, StreamConfig, Subscriber, SubscriberConfig


def main(bootstrap: str, db_url: str, topic: str, durable_id: str) -> None:
    sub = Subscriber(
        Cluster(bootstrap),
        SubscriberConfig(
            stream=StreamConfig(name=topic),
            durable_id=durable_id,
            durable_registry=db_url,
            lease_timeout_ms=4_000,
            max_batch=10,
            on_live=lambda: print("LIVE", flush=True),
        ),
    )
    print("CONNECTED", flush=True)
    while True:  # until killed
        for record in sub.poll(100):
            print("READ", record.offset, int(record.replayed), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
