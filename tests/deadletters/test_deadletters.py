"""DeadLetters on a real broker and real databases: list, show, replay, purge, and a replay
that died between its publish and its record."""

from __future__ import annotations

import datetime
import logging
import time
import uuid
from collections import Counter

import pytest
import sqlalchemy as sa

from bolide.facade import (
    DeadLetterFilterError,
    DeadLetterNotFoundError,
    DeadLetterSourceError,
    Publisher,
    PublisherConfig,
    Reason,
    Record,
)
from bolide.facade.deadletter import (
    REASON_HEADER,
    REPLAYED_FROM_HEADER,
    SOURCE_HEADER,
    letter,
)
from bolide.stores import DeadLetter, DeadLetters
from bolide.stores.schema import REPLAYS
from tests.deadletters.conftest import ARCHIVE_ONLY, Letters, end_of, log_start, read_all
from tests.deadletters.test_filter_guard import ENDLESS

pytestmark = [pytest.mark.kafka, pytest.mark.tansu]


def _origin(record: Record) -> str:
    return (record.header(REPLAYED_FROM_HEADER) or b"").decode()


def test_list_reads_the_archive_and_kafka_alike(letters: Letters) -> None:
    dead, source = letters.dead.name, letters.source.name
    found = letters.workbench.list(stream=dead)
    assert [d.id for d in found] == [f"{dead}/0/{o}" for o in range(8)]
    assert [d.archived for d in found] == [True] * 4 + [False] * 4
    by_source = {d.source_position: d for d in found}
    assert set(by_source) == {(source, 0, o) for o in letters.failed | letters.undecodable}
    for offset in letters.failed:
        failed = by_source[(source, 0, offset)]
        assert failed.reason is Reason.FAILED
        assert failed.detail is not None and "cannot bill order" in failed.detail
        assert "after 2 attempts" in failed.detail
        assert failed.header("trace") is not None  # the failed record's own headers stay
        assert failed.source == f"{source}/0/{offset}"
    for offset in letters.undecodable:
        assert by_source[(source, 0, offset)].reason == "undecodable"
        assert (by_source[(source, 0, offset)].value or b"").startswith(b"{not json")
    assert all(d.key in (b"k0", b"k1", b"k2") and d.timestamp is not None for d in found)
    # Filters: a Reason or its text, and a time (epoch ms or a datetime, naive meaning UTC).
    failed_ids = {d.id for d in found if d.reason is Reason.FAILED}
    assert {d.id for d in letters.workbench.list(dead, reason=Reason.FAILED)} == failed_ids
    assert {d.id for d in letters.workbench.list(dead, reason="undecodable")} == (
        {d.id for d in found} - failed_ids
    )
    later = [f"{dead}/0/{o}" for o in range(4, 8)]
    assert [d.id for d in letters.workbench.list(dead, since=letters.second_round_ms)] == later
    naive = datetime.datetime.fromtimestamp(letters.second_round_ms / 1000, tz=datetime.UTC)
    since = naive.replace(tzinfo=None)
    assert [d.id for d in letters.workbench.list(dead, since=since)] == later
    assert letters.workbench.list(dead, reason="timeout") == []


def test_show_reads_one_dead_letter_from_kafka_or_the_archive(letters: Letters) -> None:
    dead = letters.dead.name
    listed = {d.id: d for d in letters.workbench.list(dead)}
    for offset in (0, 3, 6):  # only archived, both, only in Kafka
        shown = letters.workbench.show(f"{dead}/0/{offset}")
        assert shown == listed[shown.id]
        assert shown.header(REASON_HEADER) is not None
    with pytest.raises(DeadLetterNotFoundError, match="no dead letter"):
        letters.workbench.show(f"{dead}/0/99")
    with pytest.raises(DeadLetterNotFoundError):
        letters.workbench.show(f"{dead}/5/0")
    with pytest.raises(ValueError, match="<stream>/<partition>/<offset>"):
        letters.workbench.show(f"{dead}-0-1")
    with pytest.raises(DeadLetterNotFoundError, match="no dead-letter stream") as missing:
        letters.workbench.list("no-such-stream-" + uuid.uuid4().hex[:8])
    assert isinstance(missing.value, LookupError)


def test_replay_to_the_source_once_then_to_another_stream(letters: Letters, stream_factory) -> None:
    dead, source = letters.dead.name, letters.source
    before = end_of(letters.cluster, source.name)
    failed = [d for d in letters.workbench.list(dead) if d.reason is Reason.FAILED]
    assert letters.workbench.replay(stream=dead, where="reason = 'failed'") == len(failed) == 4
    again = [r for r in read_all(letters.cluster, source) if (r.offset or 0) >= before]
    assert sorted(_origin(r) for r in again) == sorted(d.id for d in failed)
    for record in again:
        original = next(d for d in failed if d.id == _origin(record))
        assert (record.key, record.data) == (original.key, original.value)
        assert record.header("trace") == original.header("trace")
        assert record.header(REASON_HEADER) is None and record.header(SOURCE_HEADER) is None
    # Twice: nothing twice.
    assert letters.workbench.replay(stream=dead, where="reason = 'failed'") == 0
    assert end_of(letters.cluster, source.name) == before + 4
    replayed = {d.id: d.replayed_to for d in letters.workbench.list(dead)}
    assert {i for i, to in replayed.items() if to == (source.name,)} == {d.id for d in failed}
    # Every dead letter to another stream, undecodable ones included; once, too.
    other = stream_factory("orders-retry")
    assert letters.workbench.replay(stream=dead, to=other.name) == 8
    assert letters.workbench.replay(stream=dead, to=other.name) == 0
    assert sorted(_origin(r) for r in read_all(letters.cluster, other)) == sorted(replayed)


#: Filters, and the dead letters each chooses (``None``: what ``_python_choice`` says).
WHERES: list[tuple[str, set[int] | None]] = [
    ("kafka_offset >= 6", {6, 7}),
    ("archived = 1 AND reason = 'undecodable'", None),
    ("payload_text LIKE '{not json%'", None),
    ("key_text = 'k1' OR source_offset IN (0, 1)", None),
    ("timestamp_ms < 0", set()),
    ("lower(reason) = 'failed' AND detail LIKE '%after 2 attempts%'", None),
]


def test_where_selects_with_sql(letters: Letters, stream_factory) -> None:
    dead = letters.dead.name
    every = letters.workbench.list(dead)
    for where, offsets in WHERES:
        if offsets is None:  # the same choice made in Python, from the listed fields
            offsets = {d.offset for d in every if _python_choice(where, d)}
            assert 0 < len(offsets) < 8, where
        out = stream_factory("where")
        assert letters.workbench.replay(stream=dead, to=out.name, where=where) == len(offsets)
        ids = {_origin(r) for r in read_all(letters.cluster, out)}
        assert ids == {f"{dead}/0/{o}" for o in offsets}, where


def _python_choice(where: str, d: DeadLetter) -> bool:
    position = d.source_position
    assert position is not None
    return {
        "archived = 1 AND reason = 'undecodable'": d.archived and d.reason == "undecodable",
        "payload_text LIKE '{not json%'": (d.value or b"").startswith(b"{not json"),
        "key_text = 'k1' OR source_offset IN (0, 1)": d.key == b"k1" or position[2] in (0, 1),
        "lower(reason) = 'failed' AND detail LIKE '%after 2 attempts%'": d.reason == "failed",
    }[where]


REFUSED = [
    "reason = 'failed'; DELETE FROM bolide_records",
    "1 = 1) OR (1 = 1",
    "reason = 'failed' -- and more",
    "kafka_offset IN (SELECT kafka_offset FROM bolide_records)",
    "length(pg_read_file('/etc/passwd')) > 0",
    "no_such_column = 1",
    "reason = 'failed' AND",
    # SQLite reads [x'] and `x'` as names, where the text check sees a literal's start.
    "CAST(1 AS [x']) = 2 OR EXISTS(SELECT 1 FROM bolide_records) OR CAST(2 AS [y']) = 3",
    "CAST(1 AS `x'`) = 2 OR EXISTS(SELECT 1 FROM bolide_records) OR CAST(2 AS `y'`) = 3",
]


def test_a_where_that_is_not_one_read_only_expression_sends_nothing(
    letters: Letters, stream_factory
) -> None:
    out = stream_factory("refused")
    for where in REFUSED:
        with pytest.raises(DeadLetterFilterError) as refused:
            letters.workbench.replay(stream=letters.dead.name, to=out.name, where=where)
        assert isinstance(refused.value, ValueError)
        with pytest.raises(DeadLetterFilterError):
            letters.workbench.purge(stream=letters.dead.name, where=where)
    assert read_all(letters.cluster, out) == []  # never even created
    assert len(letters.workbench.list(letters.dead.name)) == 8  # nothing purged
    with letters.store.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(REPLAYS)).scalar() == 0
    assert letters.store.largest_offset(letters.dead.name, 0) == 3  # the archive is whole


def test_a_where_that_runs_too_long_is_stopped_and_nothing_is_purged(letters: Letters) -> None:
    # A billion rows of constants, disguised from the text check as a literal.
    where = f"CAST(1 AS [x']) = 2 OR {ENDLESS} OR CAST(2 AS [y']) = 3"
    workbench = DeadLetters(letters.store, letters.cluster, where_timeout_ms=300)
    with pytest.raises(DeadLetterFilterError) as stopped:
        workbench.purge(stream=letters.dead.name, where=where)
    if letters.db_url.startswith("sqlite"):
        assert "where_timeout_ms=300" in str(stopped.value)
    # (PostgreSQL reads no [x'] at all: a syntax error.)
    assert len(letters.workbench.list(letters.dead.name)) == 8  # nothing purged


def test_dead_letters_without_a_source_need_a_target(letters: Letters, stream_factory) -> None:
    dead, source = letters.dead, letters.source
    # What a resequencer's timeout sends: no bolide.source.
    with Publisher(letters.cluster, PublisherConfig(stream=dead)) as pub:
        pub.publish(letter(Record(b"part 2 of 3", key=b"seq-9"), Reason.TIMEOUT, "group timed out"))
    before = end_of(letters.cluster, source.name)
    with pytest.raises(DeadLetterSourceError, match="to=") as orphans:
        letters.workbench.replay(stream=dead.name)
    assert orphans.value.ids == [f"{dead.name}/0/8"]
    assert end_of(letters.cluster, source.name) == before  # nothing was sent
    assert letters.workbench.replay(stream=dead.name, where="source IS NOT NULL") == 8
    out = stream_factory("timeouts")
    assert letters.workbench.replay(stream=dead.name, to=out.name, where="reason = 'timeout'") == 1
    [again] = read_all(letters.cluster, out)
    assert (again.key, again.data, _origin(again)) == (b"seq-9", b"part 2 of 3", f"{dead.name}/0/8")


def test_purge_hides_deletes_and_trims_what_kafka_allows(
    letters: Letters, embedded_broker: bool
) -> None:
    dead = letters.dead.name
    undecodable = {d.offset for d in letters.workbench.list(dead, reason="undecodable")}
    assert letters.workbench.purge(stream=dead, reason=Reason.UNDECODABLE) == 4
    assert letters.workbench.purge(stream=dead, reason=Reason.UNDECODABLE) == 0
    left = letters.workbench.list(dead)
    assert {d.offset for d in left} == set(range(8)) - undecodable
    for offset in undecodable:
        with pytest.raises(DeadLetterNotFoundError):
            letters.workbench.show(f"{dead}/0/{offset}")
        assert letters.store.load(dead, 0, offset) is None  # the archived row is gone
    kept_archived = {d.offset for d in left if d.archived}
    assert kept_archived == set(range(4)) - undecodable
    # Kafka deletes a partition's oldest records only: up to the first dead letter kept.
    first_kept = min(d.offset for d in left if d.offset >= ARCHIVE_ONLY)
    assert _log_start(letters, dead) == (ARCHIVE_ONLY if embedded_broker else first_kept)
    # A replay skips what was purged.
    assert letters.workbench.replay(stream=dead) == 4
    assert letters.workbench.purge(stream=dead) == 4
    assert letters.workbench.list(dead) == []
    assert _log_start(letters, dead) == (ARCHIVE_ONLY if embedded_broker else 8)
    assert letters.workbench.purge(stream=dead, since=0) == 0


def _log_start(letters: Letters, stream: str) -> int:
    return log_start(letters.cluster, stream)


def test_a_replay_that_died_mid_way_publishes_nothing_twice(
    letters: Letters, stream_factory, caplog: pytest.LogCaptureFixture
) -> None:
    dead = letters.dead.name
    out = stream_factory("settled")
    assert letters.workbench.replay(stream=dead, to=out.name, where="kafka_offset < 6") == 6
    now = int(time.time() * 1000)
    r = REPLAYS.c
    with letters.store.engine.begin() as conn:
        # 4 and 5: published, then the replay died before recording them.
        conn.execute(
            sa.update(REPLAYS)
            .where(r.kafka_offset.in_([4, 5]))
            .values(target_offset=None, target_partition=None, replayed_ms=None, owner="gone")
        )
        # 6: claimed an hour ago, never published; 7: claimed now by a replay still running.
        for offset, claimed in ((6, now - 3_600_000), (7, now)):
            conn.execute(
                sa.insert(REPLAYS).values(
                    stream=dead,
                    kafka_partition=0,
                    kafka_offset=offset,
                    target_stream=out.name,
                    owner="gone" if offset == 6 else "running",
                    claimed_ms=claimed,
                )
            )
    with caplog.at_level(logging.WARNING, logger="bolide.stores.deadletters._replay"):
        assert letters.workbench.replay(stream=dead, to=out.name) == 1  # 6 only
    assert f"1 dead letters (first: {dead}/0/7) were claimed by another replay" in caplog.text
    counts = Counter(_origin(r) for r in read_all(letters.cluster, out))
    assert counts == Counter(f"{dead}/0/{o}" for o in range(7))
    with letters.store.engine.connect() as conn:
        settled = conn.execute(
            sa.select(r.kafka_offset, r.target_offset).where(r.kafka_offset.in_([4, 5]))
        ).all()
    assert sorted(settled) == [(4, 4), (5, 5)]  # found in the target, where they were
    # A claim older than claim_timeout_s whose record is not in the target is taken over.
    assert letters.workbench.replay(stream=dead, to=out.name, claim_timeout_s=0) == 1
    counts = Counter(_origin(r) for r in read_all(letters.cluster, out))
    assert counts == Counter(f"{dead}/0/{o}" for o in range(8))


def test_arguments_are_checked_before_anything_is_read(letters: Letters) -> None:
    workbench, dead = letters.workbench, letters.dead.name
    with pytest.raises(TypeError, match="store"):
        DeadLetters("sqlite://", letters.cluster)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="where_timeout_ms"):
        DeadLetters(letters.store, letters.cluster, where_timeout_ms=0)
    with pytest.raises(TypeError, match="where_timeout_ms"):
        DeadLetters(letters.store, letters.cluster, where_timeout_ms=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="stream"):
        workbench.list("bad/name")
    with pytest.raises(ValueError, match="to"):
        workbench.replay(dead, to="")
    with pytest.raises(ValueError, match="the dead-letter stream itself"):
        workbench.replay(dead, to=dead)
    with pytest.raises(ValueError, match="claim_timeout_s"):
        workbench.replay(dead, claim_timeout_s=-1)
    with pytest.raises(TypeError, match="since"):
        workbench.list(dead, since="yesterday")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="reason"):
        workbench.list(dead, reason=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="where"):
        workbench.replay(dead, where=1)  # type: ignore[arg-type]
    assert not any(d.replayed_to for d in workbench.list(dead))  # nothing was replayed
