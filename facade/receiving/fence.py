"""``Fence``: which source partitions' retry-tier copies a member must leave alone for now.

Kafka fences a member's tier writes by itself: every write goes out in a transaction whose
offsets carry the group's metadata (KIP-447), and a member whose generation is over (it lost
its partitions and has not heard yet: paused, or past its lease) has the transaction refused,
so nothing it wrote is ever seen by ``read_committed`` readers. What Kafka cannot stop is
such a member *calling the handler* on copies that the partition's new owner wrote. A copy
written by another writer past what this member loaded is the sign: its partition is held
(no copy of it runs) until a transaction of this member commits, which proves its generation
current, or until the rebalance takes the partition away. A refused transaction holds every
partition the same way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

__all__ = ["Fence"]


class Fence:
    """The held partitions of one receiver's tiers; every method takes its lock.

    Args:
        hold: ``fn(partitions)``: stop running their copies (the shelf's ``fence``).
        release: ``fn(partitions)``: run them again (the shelf's ``unfence``).
        prove: Asks the tiers' writer for a transaction soon (a proof, if nothing else).
    """

    def __init__(
        self,
        hold: Callable[[Iterable[int]], None],
        release: Callable[[Iterable[int]], None],
        prove: Callable[[], None],
    ) -> None:
        self._lock = threading.Lock()
        self._hold = hold
        self._release = release
        self._prove = prove
        self._seq = 0  # suspicions so far
        self._held: dict[int, int] = {}  # partition: the suspicion that holds it

    def suspect(self, partitions: Iterable[int]) -> None:
        """Another writer's copy of ``partitions`` arrived, or a transaction was refused:
        hold them until a transaction whose offsets went out after this commits."""
        with self._lock:
            self._seq += 1
            fresh = sorted(set(partitions) - set(self._held))
            for p in fresh:
                self._held[p] = self._seq
            if fresh:
                self._hold(fresh)
        self._prove()

    def mark(self) -> int:
        """The suspicions so far: a round notes it before it sends its offsets."""
        with self._lock:
            return self._seq

    def holds(self, partition: int) -> bool:
        """Whether ``partition``'s copies wait for a proof."""
        with self._lock:
            return partition in self._held

    def proven(self, mark: int) -> None:
        """A transaction whose offsets (with the group's metadata) went out after suspicion
        ``mark`` committed: this member's generation was current then, the partitions
        suspected until that mark are its own. Later suspicions wait for a later round."""
        with self._lock:
            free = sorted(p for p, seq in self._held.items() if seq <= mark)
            for p in free:
                del self._held[p]
            if free:
                self._release(free)

    def forget(self, partitions: Iterable[int]) -> None:
        """``partitions`` were revoked: their copies were dropped with them."""
        with self._lock:
            for p in partitions:
                self._held.pop(p, None)
