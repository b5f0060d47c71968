"""The retry tiers' ``Shelf`` on its own: a key whose finished copy is not confirmed yet stays
parked while its later records flow through the tier behind it, and is let go once the group
confirmed its copies."""

from __future__ import annotations

from bolide.facade import Record
from bolide.facade.receiving.shelf import Entry, Shelf


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
    assert shelf.safe_points() == {}  # j's copy at tier offset 0 is not done
    shelf.done(stuck)
    assert shelf.safe_points() == {(0, 0): 39}
    shelf.confirmed({(0, 0): 39})
    assert shelf.counts() == (0, 0)
    assert shelf.divert(source(40, b"k"), b"k") is None  # handled straight from the source
