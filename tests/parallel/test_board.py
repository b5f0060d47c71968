"""The parallel receiver's bookkeeping on its own: lanes, safe offsets, retries, revokes."""

from __future__ import annotations

import random
import threading

from bolide.facade import Record
from bolide.facade.receiving.lanes import NO_LANE, Board, Item


def rec(offset: int, key: bytes | None = b"a", partition: int = 0) -> Record:
    record = Record(b"%d" % offset, key=key)
    record.partition, record.offset = partition, offset
    return record


def drain(board: Board) -> list[Item]:
    out = []
    while (item := board.take_nowait()) is not None:
        out.append(item)
    return out


def test_a_key_runs_one_record_at_a_time_in_offset_order():
    board = Board(lambda r: r.key)
    board.add([rec(0, b"a"), rec(1, b"b"), rec(2, b"a"), rec(3, b"a"), rec(4, b"b")])
    first = drain(board)
    assert [i.record.offset for i in first] == [0, 1]  # the heads of a and b
    board.finish(first[0])
    assert [i.record.offset for i in drain(board)] == [2]
    assert board.tracks[0].safe() == 0  # 1 and 2 are not finished
    board.finish(first[1])
    assert [i.record.offset for i in drain(board)] == [4]
    assert board.in_flight == 3 and board.finished == 2


def test_a_lane_passed_on_lets_the_next_record_run_while_the_offset_stays_unfinished():
    board = Board(lambda r: r.key)
    board.add([rec(0), rec(1), rec(2)])
    (first,) = drain(board)
    board.pass_lane(first)  # its copy is queued behind its key's: the key's next may come
    (second,) = drain(board)
    assert second.record.offset == 1
    assert board.tracks[0].safe() is None  # nothing is finished: the position stays
    board.pass_lane(first)  # once only: a second pass hands nothing on
    assert drain(board) == []
    board.finish(first)  # the copy committed: its offset is finished, no lane handed on
    assert drain(board) == [] and board.tracks[0].safe() == 0
    board.finish(second)
    assert [i.record.offset for i in drain(board)] == [2]
    assert board.tracks[0].safe() == 1 and board.in_flight == 1


def test_a_record_finished_before_its_lane_is_passed_hands_its_lane_on_once():
    board = Board(lambda r: r.key)
    board.add([rec(0), rec(1), rec(2)])
    (first,) = drain(board)
    board.finish(first)  # a copy committed before the worker passed the lane on
    board.pass_lane(first)
    assert [i.record.offset for i in drain(board)] == [1]


def test_safe_offset_is_the_highest_finished_prefix_whatever_the_finish_order():
    rng = random.Random(1)
    board = Board(lambda r: NO_LANE)
    offsets = list(range(100, 400, 3))  # gaps between offsets, as compaction leaves them
    board.add([rec(o) for o in offsets])
    items = drain(board)
    rng.shuffle(items)
    finished: set[int] = set()
    for item in items:
        board.finish(item)
        finished.add(item.record.offset or 0)
        # Below the first unfinished offset (the gaps hold no record), never below the first.
        unfinished = [o for o in offsets if o not in finished]
        expected = unfinished[0] - 1 if unfinished else offsets[-1]
        assert board.tracks[0].safe() == (expected if expected >= offsets[0] else None)
    assert board.in_flight == 0 and board.finished == len(offsets)


def test_a_retry_keeps_its_lane_until_it_is_due():
    board = Board(lambda r: r.key)
    board.add([rec(0), rec(1)])
    (item,) = drain(board)
    board.later(item, 1.0)
    assert board.take_nowait() is None  # 1 waits behind 0, and 0 is not due yet
    again = board.take(timeout_s=30)
    assert again is item and board.retried == 1
    board.finish(item)
    assert [i.record.offset for i in drain(board)] == [1]


def test_revoke_abandons_queued_records_and_settle_the_running_ones():
    board = Board(lambda r: r.key)
    board.add([rec(0, b"a"), rec(1, b"b"), rec(2, b"a"), rec(3, b"c")])
    running = drain(board)  # 0, 1, 3 run; 2 waits behind 0
    board.finish(running[2])  # 3 finished
    track = board.revoke(0)
    assert track is not None and 0 not in board.tracks
    assert board.abandoned == 1 and board.in_flight == 2  # 2 dropped, 0 and 1 still run
    board.finish(running[0])  # finished in time: counted
    assert not board.wait_idle(track, 0.01)
    board.settle(track)  # 1 is abandoned
    assert board.abandoned == 2 and board.in_flight == 0 and board.finished == 2
    assert track.safe() == 0  # what a revoke confirms: 0, not 3 (1 and 2 are unfinished)
    board.finish(running[1])  # late: ignored
    assert board.finished == 2 and board.in_flight == 0
    assert board.take_nowait() is None


def test_reading_a_partition_again_starts_a_new_track():
    board = Board(lambda r: r.key)
    board.add([rec(5), rec(6)])
    (item,) = drain(board)
    board.add([rec(2)])  # a seek back: the old track is abandoned
    assert board.abandoned == 2 and board.in_flight == 1
    assert board.tracks[0].first == 2
    board.finish(item)  # a result of the old track: ignored
    (new,) = drain(board)
    board.finish(new)
    assert board.tracks[0].safe() == 2 and board.in_flight == 0


def test_ran_and_claim_for_records_handled_on_the_fetch_thread():
    board = Board(lambda r: r.key)
    board.ran([rec(0), rec(1), rec(2, partition=1)])
    assert board.tracks[0].safe() == 1 and board.tracks[1].safe() == 2
    item = board.claim(rec(3))
    board.add([rec(4)])  # same key: waits behind the claimed record
    assert board.take_nowait() is None
    board.finish(item)
    assert [i.record.offset for i in drain(board)] == [4]
    assert board.finished == 4


def test_workers_wait_for_work_and_stop():
    board = Board(lambda r: NO_LANE)
    taken: list[Item | None] = []
    worker = threading.Thread(target=lambda: taken.append(board.take()))
    worker.start()
    board.add([rec(0)])
    worker.join(30)
    assert taken and taken[0] is not None
    waiting = threading.Thread(target=lambda: taken.append(board.take()))
    waiting.start()
    board.stop()
    waiting.join(30)
    assert taken[-1] is None and not waiting.is_alive()
