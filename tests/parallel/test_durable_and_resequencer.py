"""The parallel receiver on a durable client (its queue keeps what was not finished) and
with a resequencer (a sequence group is one key; confirms stay below open groups)."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from bolide.facade import (
    Publisher,
    PublisherConfig,
    Record,
    Resequencer,
    Subscriber,
    SubscriberConfig,
    sequence_headers,
)
from bolide.facade.resequencer.sequence import NUMBER_HEADER, SEQUENCE_GROUP_HEADER
from tests.conftest import eventually, upgraded_db_url
from tests.parallel.conftest import LEASE_MS, Log, fresh_group, publish_keyed

pytestmark = pytest.mark.kafka


@pytest.fixture
def sqlite_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return upgraded_db_url("sqlite", tmp_path, request)


def test_durable_client_keeps_unfinished_records_for_its_reconnect(
    cluster, stream_factory, sqlite_url
):
    stream = stream_factory()
    published = publish_keyed(cluster, stream, 40, keys=4)
    release = threading.Event()
    log = Log()

    def handler(record: Record) -> None:
        log.start(record, record.key)
        if record.offset == 12:
            release.wait(120)  # never released before the close
        log.end(record, record.key)

    durable_id = fresh_group()
    config = SubscriberConfig(
        stream=stream,
        durable_id=durable_id,
        durable_registry=sqlite_url,
        lease_timeout_ms=LEASE_MS,
    )
    sub = Subscriber(cluster, config)
    receiver = sub.attach_receiver(handler, concurrency=4)
    # All but 12 and the 6 records of its key behind it.
    eventually(lambda: receiver.metrics().finished >= len(published) - 7, 120)
    receiver.close(timeout_s=0.5)
    assert receiver.metrics().abandoned == 7
    sub.close()  # keep_alive: commits what was finished below the first unfinished record
    release.set()

    again: list[tuple[int, bool]] = []
    sub = Subscriber(cluster, config)
    try:
        receiver = sub.attach_receiver(
            lambda r: again.append((r.offset or 0, r.replayed)), concurrency=4
        )
        eventually(lambda: len(again) >= len(published) - 12, 120)
    finally:
        sub.close()
    # Replayed from the first unfinished record: 12 and everything after it, nothing below.
    assert sorted(o for o, _ in again) == list(range(12, len(published)))
    assert all(replayed for _, replayed in again)


def _publish_groups(
    cluster, stream, groups: int, rng: random.Random, *, open_first: bool
) -> dict[str, int]:
    """Publish sequence groups of 2-8 records, interleaved and shuffled within each group;
    with ``open_first`` a first group ``open`` misses its last record. Returns group sizes."""
    sizes = {f"g{i}": rng.randint(2, 8) for i in range(groups)}
    pending = {g: rng.sample(range(size), size) for g, size in sizes.items()}
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        if open_first:
            pub.publish(Record(b"0", headers=sequence_headers("open", 2, 0), group="open"))
        while pending:
            group = rng.choice(sorted(pending))
            number = pending[group].pop()
            headers = sequence_headers(group, sizes[group], number)
            pub.publish_async(Record(b"%d" % number, headers=headers, group=group))
            if not pending[group]:
                del pending[group]
        assert pub.flush(60) == 0
    return sizes


@pytest.mark.parametrize("open_first", [False, True], ids=["complete", "open-group"])
def test_resequenced_groups_in_order_and_confirms_below_open_groups(
    cluster, stream_factory, open_first
):
    stream = stream_factory()
    sizes = _publish_groups(cluster, stream, 60, random.Random(11), open_first=open_first)
    total = sum(sizes.values()) + int(open_first)
    log = Log()
    numbers: dict[str, list[int]] = {}
    lock = threading.Lock()

    def handler(record: Record) -> None:
        group = (record.header(SEQUENCE_GROUP_HEADER) or b"").decode()
        log.start(record, group)
        with lock:
            numbers.setdefault(group, []).append(int(record.header(NUMBER_HEADER) or b"-1"))
        log.end(record, group)

    reseq = Resequencer(mode="batch", timeout_s=600)
    config = SubscriberConfig(stream=stream, group=fresh_group(), lease_timeout_ms=LEASE_MS)
    with Subscriber(cluster, config) as sub:
        receiver = sub.attach_receiver(handler, concurrency=8, resequencer=reseq)
        eventually(lambda: receiver.metrics().finished >= sum(sizes.values()), 120)
        if open_first:
            eventually(lambda: receiver.metrics().safe == {}, 10)  # offset 0 is held
            assert sub.committed() == {0: None}
        else:
            eventually(lambda: sub.committed() == {0: total}, 60)
    assert log.overlaps == []
    assert numbers == {g: list(range(size)) for g, size in sizes.items()}
