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
        hold: ``fn(partitions)``: stop running their copies (the shelf's ``hold``).
        release: ``fn(partitions)``: run them again (the shelf's ``release``).
        prove: Asks the tiers' writer for a transaction soon (a proof, if nothing else).
    """

    def __init__(
        self,
        hold: Callable[[list[int]], None],
        release: Callable[[list[int]], None],
        prove: Callable[[], None],
    ) -> None:
        self._lock = threading.Lock()
        self._hold = hold
        self._release = release
        self._prove = prove
        self._held: set[int] = set()

    def suspect(self, partitions: Iterable[int]) -> None:
        """Another writer's copy of ``partitions`` arrived, or a transaction was refused:
        hold them until a transaction commits."""
        with self._lock:
            fresh = sorted(set(partitions) - self._held)
            self._held.update(fresh)
            if fresh:
                self._hold(fresh)
        self._prove()

    def holds(self, partition: int) -> bool:
        """Whether ``partition``'s copies wait for a proof."""
        with self._lock:
            return partition in self._held

    def proven(self) -> None:
        """A transaction with the group's metadata committed: this member's generation is
        current, the partitions it holds are its own."""
        with self._lock:
            held, self._held = sorted(self._held), set()
            if held:
                self._release(held)

    def forget(self, partitions: Iterable[int]) -> None:
        """``partitions`` were revoked: their copies were dropped with them."""
        with self._lock:
            self._held.difference_update(partitions)
