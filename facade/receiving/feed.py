"""``Feed``: what a parallel receiver puts on its board. Without a resequencer each polled
batch goes on as it is; with one, every record is offered to it in offset order and what it
releases goes on (records it refuses while full wait, in order, and are offered again), and
confirms stay below the groups it holds open."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from bolide.facade.errors import ResequencerFullError
from bolide.facade.receiving.lanes import Board
from bolide.facade.record import Record
from bolide.facade.resequencer.core import Resequencer

__all__ = ["Feed"]


class Feed:
    """The way from polled batches to ``board``, through ``resequencer`` when there is one."""

    __slots__ = ("_board", "_reseq", "_waiting")

    def __init__(self, board: Board, resequencer: Resequencer | None) -> None:
        self._board = board
        self._reseq = resequencer
        self._waiting: deque[Record] = deque()  # refused by a full resequencer

    def __len__(self) -> int:
        """Records taken but not yet on the board (refused by a full resequencer)."""
        return len(self._waiting)

    def take(self, batch: Iterable[Record]) -> None:
        """Put a polled batch on the board (what the resequencer releases of it)."""
        reseq, board = self._reseq, self._board
        if reseq is None:
            board.add(batch)
            return
        board.taken(batch)
        released: list[Record] = []
        records = list(batch)
        for index, record in enumerate(records):
            try:
                released += reseq.offer(record)
            except ResequencerFullError:
                self._waiting.extend(records[index:])
                break
        board.add(released, taken=True)

    def tick(self) -> None:
        """Offer the waiting records again, and release what the resequencer's timeouts let
        go (a no-op without one)."""
        reseq, waiting = self._reseq, self._waiting
        if reseq is None:
            return
        released: list[Record] = []
        while waiting:
            try:
                released += reseq.offer(waiting[0])
            except ResequencerFullError:
                break
            waiting.popleft()
        self._board.add(released, taken=True)
        self._board.add(reseq.tick(), taken=True)

    def clear(self) -> None:
        """Closing: the waiting records never started; the next reader reads them again."""
        self._waiting.clear()

    def safe(self, partition: int, safe: int | None) -> int | None:
        """``safe`` (the board's safe point) kept below the resequencer's open groups."""
        if self._reseq is None or safe is None:
            return safe
        held = self._reseq.safe_offset(partition)
        return None if held is None else min(safe, held)

    def rewind_points(self) -> dict[int, int]:
        """Per partition with records unfinished at close: the first offset to read again
        (below a group the resequencer still holds open, too)."""
        board = self._board
        points = board.unfinished_from()
        if self._reseq is not None:
            with board.lock:
                spans = {p: (t.first, t.last) for p, t in board.tracks.items()}
            for p, (first, last) in spans.items():
                held = self._reseq.safe_offset(p)
                again = first if held is None else held + 1
                if again <= last:
                    points[p] = min(points.get(p, again), again)
        return points

    def forget(self, partitions: list[int]) -> dict[int, int | None]:
        """Revoked ``partitions``: their resequencer state and waiting records go. Returns
        the safe offset the resequencer allowed on each (nothing without one)."""
        if self._reseq is None:
            return {}
        held: dict[int, int | None] = {}
        for p in partitions:
            held[p] = self._reseq.safe_offset(p)
            self._reseq.forget(p)
        gone = set(partitions)
        self._waiting = deque(r for r in self._waiting if r.partition not in gone)
        return held

    def bound(self, partition: int, safe: int | None, held: dict[int, int | None]) -> int | None:
        """``safe`` of a revoked ``partition`` kept below what ``forget`` said was held."""
        if self._reseq is None:
            return safe
        limit = held.get(partition)
        return None if safe is None or limit is None else min(safe, limit)
