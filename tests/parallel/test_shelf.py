"""The retry tiers' ``Shelf`` on its own: a key whose finished copy is not confirmed yet stays
parked while its later records flow through the tier behind it, and is let go once the group
confirmed its copies (in the finished set above another key's unfinished copy); and what the
tiers commit of it."""

from __future__ import annotations

import random

from bolide.facade import Record
from bolide.facade.consumer.ledger import encode_finished
from bolide.facade.receiving.shelf import Entry, Shelf
from bolide.facade.receiving.tiers import to_confirm


def source(offset: int, key: bytes) -> Record:
    record = Record(b"%d" % offset, key=key, partition=0)
    record.offset = offset
    return record


def run(shelf: Shelf, key: bytes) -> Entry:
    """Take lane heads until ``key``'s comes (other keys' heads stay running)."""
    while True:
        entry = shelf.take(1.0)
        assert entry is not None, "no head of a lane was due"
        if entry.lane == key:
            return entry


def test_a_key_stays_parked_until_its_finished_copies_are_confirmed():
    shelf = Shelf(1)
    shelf.hold([0])
    shelf.release([0])
    stuck = shelf.shelve(source(0, b"j"), b"j", 1)
    assert stuck is not None
    shelf.arrived(0, 0, source(0, b"j"), 1, 0.0, b"j")  # never finishes: holds tier 0 up
    shelf.shelve(source(1, b"k"), b"k", 1)
    shelf.arrived(0, 1, source(1, b"k"), 1, 0.0, b"k")
    shelf.done(run(shelf, b"k"))
    for offset in range(2, 40):  # k's next records: parked behind its unconfirmed copy
        entry = shelf.divert(source(offset, b"k"), b"k")
        assert entry is not None and entry.tier == 0, offset
        shelf.arrived(0, offset, source(offset, b"k"), 0, 0.0, b"k")
        shelf.done(run(shelf, b"k"))
    assert shelf.counts() == (1, 2)  # j's record; j's and k's lanes
    # j's copy at tier offset 0 is not done: k's copies are confirmed above it
    points = shelf.confirm_points()
    assert points == {(0, 0): (0, list(range(1, 40)))}
    shelf.confirmed(points)
    assert shelf.counts() == (1, 1)  # j's record and lane: k is parked no more
    assert shelf.divert(source(40, b"k"), b"k") is None  # handled straight from the source
    shelf.done(stuck)
    assert shelf.confirm_points() == {(0, 0): (40, [])}
    shelf.confirmed({(0, 0): (40, [])})
    assert shelf.counts() == (0, 0)


def test_a_key_whose_copies_cross_two_tiers_is_let_go_once_both_are_confirmed():
    """a's records are in tier 0 then tier 1, b's the other way round, each behind the
    other's copy: every copy finished counts at once, both tiers confirm to their ends."""
    shelf = Shelf(2)
    shelf.hold([0])
    for tier, offset, origin, key in ((0, 0, 1, b"b"), (0, 1, 2, b"a"), (1, 0, 3, b"a")):
        shelf.arrived(tier, offset, source(origin, key), 1, 0.0, key)
    shelf.arrived(1, 1, source(0, b"b"), 1, 0.0, b"b")
    shelf.release([0])
    ran = []
    while (entry := shelf.take(0.5)) is not None:
        ran.append((entry.lane, entry.origin))
        shelf.done(entry)
    assert [o for k, o in ran if k == b"a"] == [2, 3]
    assert [o for k, o in ran if k == b"b"] == [0, 1]
    points = shelf.confirm_points()
    assert points == {(0, 0): (2, []), (1, 0): (2, [])}
    shelf.confirmed(points)
    assert shelf.counts() == (0, 0)


def test_copies_confirmed_as_finished_are_skipped_and_confirmed_again():
    """A tier partition confirmed at 0 with its copy 1 finished: read again, copy 1 is not
    run, and the next confirm writes it again."""
    shelf = Shelf(1)
    shelf.hold([0], {(0, 0): {1}})
    for offset, key in ((0, b"j"), (1, b"k")):
        shelf.arrived(0, offset, source(offset, key), 1, 0.0, key)
    shelf.release([0])
    assert shelf.counts() == (1, 1)  # j's record only
    assert shelf.confirm_points() == {(0, 0): (0, [1])}
    shelf.done(run(shelf, b"j"))
    assert shelf.confirm_points() == {(0, 0): (2, [])}


def test_a_source_partition_s_tiers_are_confirmed_together_or_not_at_all():
    """A finished set that does not fit the commit's metadata holds back every tier of its
    source partition (a key's copy in another tier would be confirmed without its earlier
    one); other partitions' go, unless committed already."""
    rng = random.Random(7)
    wide = sorted(rng.sample(range(1, 200_000), 20_000))  # far too many to encode
    assert encode_finished(0, wide) is None
    points = {(0, 0): (0, wide), (1, 0): (5, [7]), (0, 1): (3, []), (1, 1): (2, [4])}
    sent = {(1, 1): (2, encode_finished(2, [4]) or "")}
    moved, unfit = to_confirm(points, sent)
    assert unfit == {0}
    assert moved == {(0, 1): (3, "")}
    assert to_confirm({(0, 1): (3, [])}, moved) == ({}, set())  # sent already


def test_copies_read_after_their_partition_went_are_neither_taken_nor_run():
    """A revoke drops the partition from the shelf; copies the tiers' reader had read before
    it let go of their tier partitions must not bring the partition's lanes back: on a member
    that no longer owns it they would run while the new owner runs the keys' earlier
    records."""
    shelf = Shelf(1)
    shelf.hold([0, 1])
    shelf.release([0, 1])
    shelf.shelve(source(3, b"k"), b"k", 1)
    shelf.drop([0])
    shelf.arrived(0, 0, source(3, b"k"), 1, 0.0, b"k")
    shelf.arrived(0, 1, source(7, b"j"), 0, 0.0, b"j")
    assert shelf.counts() == (0, 0)
    assert shelf.take(0.05) is None
    assert shelf.confirm_points() == {}
    # The partition still held goes on as before.
    other = Record(b"x", key=b"m", partition=1)
    other.offset = 4
    assert shelf.shelve(other, b"m", 1) is not None
    shelf.arrived(0, 0, other, 1, 0.0, b"m")
    assert run(shelf, b"m").record is other
