"""The steady-state reading clock every consuming side of ``bench_peers`` uses, bolide's own and
the peers' alike (also the ones that run in a virtualenv of their own, without bolide): only the
standard library here."""

from __future__ import annotations

import time

__all__ = ["SteadyClock"]


class SteadyClock:
    """Records/s of a reader in its steady state: from the batch that brings the ``warm``-th
    record (a tenth of the run, at most 1,000) to the ``total``-th, so that connecting, joining
    a group and the first fetches are left out of every side alike (a reader whose first batch
    waits to fill up and one that returns the first record at once start equal)."""

    def __init__(self, total: int, timeout_s: float) -> None:
        self.total = total
        self.timeout_s = timeout_s
        self.warm = max(1, min(1000, total // 10))
        self.seen = 0
        self.warm_at = 0.0
        self.warm_count = 0
        self.deadline = time.monotonic() + timeout_s
        self.started = time.perf_counter()

    def count(self, records: int) -> bool:
        """Count a batch; true once ``total`` records were seen (``TimeoutError`` past the
        timeout)."""
        self.seen += records
        if not self.warm_count and self.seen >= self.warm:
            self.warm_at, self.warm_count = time.perf_counter(), self.seen
        if time.monotonic() > self.deadline:
            raise TimeoutError(f"{self.seen} of {self.total} records read in {self.timeout_s} s")
        return self.seen >= self.total

    def rate(self) -> float:
        """Records/s after the warm-up; since the start when one batch brought them all."""
        now = time.perf_counter()
        if self.seen > self.warm_count:
            return (self.seen - self.warm_count) / (now - self.warm_at)
        return self.seen / (now - self.started)
