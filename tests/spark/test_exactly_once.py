"""Exactly-once end to end with Spark: ``format("bolide")``, a checkpoint, and the archive's
idempotent SQL sink, with the streaming query stopped mid-stream and restarted."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from bolide.facade import Cluster, Record
from bolide.spark import BatchReport, archive
from bolide.stores import SqlStore
from tests.conftest import eventually

from .conftest import publish

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

TOTAL = 600
PARTITIONS = 2


def records(start: int, stop: int) -> list[Record]:
    return [Record(b"%d" % i, key=f"k{i % 5}") for i in range(start, stop)]


def test_a_query_stopped_mid_stream_and_restarted_writes_every_record_once(
    spark: Any, cluster: Cluster, stream_factory, store_url: str, tmp_path: Path
) -> None:
    stream = stream_factory(partitions=PARTITIONS, global_order=False)
    publish(cluster, stream, records(0, TOTAL // 2))
    checkpoint = str(tmp_path / "ckpt")
    reports: list[BatchReport] = []
    query = archive(
        spark,
        stream,
        store_url,
        checkpoint,
        bootstrap=cluster,
        max_offsets_per_trigger=40,
        until_caught_up=False,
        trigger_interval_s=0.2,
        on_batch=reports.append,
    )
    # More records arrive while the query runs; it is stopped once some batches are in,
    # wherever it then is (a batch may be cut between its database commit and Spark's).
    writer = threading.Thread(target=publish, args=(cluster, stream, records(TOTAL // 2, TOTAL)))
    writer.start()
    try:
        eventually(lambda: sum(r.rows for r in reports) >= 120, 120)
    finally:
        query.stop()
        writer.join(60)
    before = sum(r.written for r in reports)
    assert before < TOTAL, "stopped mid-stream"

    reports.clear()
    archive(
        spark,
        stream,
        store_url,
        checkpoint,
        bootstrap=cluster,
        max_offsets_per_trigger=40,
        on_batch=reports.append,
    )
    assert before + sum(r.written for r in reports) == TOTAL, "each record written once"
    with SqlStore(store_url) as store:
        stored = [r for p in range(PARTITIONS) for r in store.read(stream.name, p, 0, TOTAL)]
        for p in range(PARTITIONS):
            offsets = [r.offset for r in stored if r.partition == p]
            assert offsets == list(range(len(offsets))), f"partition {p}: hole"
    assert sorted(int(r.data) for r in stored) == list(range(TOTAL))
