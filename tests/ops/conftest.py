"""Operations fixtures: the ``bolide`` command as a subprocess, and a group that lags."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

from bolide.facade import (
    Cluster,
    Publisher,
    PublisherConfig,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from tests.conftest import eventually, pg_admin
from tests.durable.conftest import durable

__all__ = ["bolide", "durable", "lagging_group", "pg_admin", "publish"]

#: Short leases: the embedded broker's group join takes half of it.
LEASE_MS = 4_000


def bolide(
    *args: str, cluster: Cluster | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``bolide ARGS`` (with ``--bootstrap`` from ``cluster`` in the environment)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOLIDE_")}
    if cluster is not None:
        env["BOLIDE_BOOTSTRAP"] = cluster.bootstrap_servers
    return subprocess.run(
        [sys.executable, "-m", "bolide.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


def publish(cluster: Cluster, stream: StreamConfig, count: int, start: int = 0) -> list[Record]:
    """Publish ``count`` records; return them with their offsets."""
    records = [Record(f"r-{start + i}".encode()) for i in range(count)]
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        futures = [pub.publish_async(r) for r in records]
        pub.flush(30)
        for f in futures:
            f.result(30)
    return records


def lagging_group(cluster: Cluster, stream: StreamConfig, *, read: int, confirm: int) -> str:
    """A fresh subscriber group that read ``read`` records of ``stream`` and confirmed the
    first ``confirm`` of them (committed offset ``confirm``), then left."""
    group = f"g-{uuid.uuid4().hex[:10]}"
    config = SubscriberConfig(stream=stream, group=group, lease_timeout_ms=LEASE_MS, max_batch=read)
    with Subscriber(cluster, config) as sub:
        got: list[Record] = []
        eventually(lambda: got.extend(sub.poll(200)) or len(got) >= read, timeout_s=60)
        sub.confirm(confirm - 1)
        eventually(lambda: sub.committed() == {0: confirm}, timeout_s=30)
    return group
