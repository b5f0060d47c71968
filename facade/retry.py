"""``Retry``: how often a receiver calls its handler on one record before giving it up."""

from __future__ import annotations

import random
from dataclasses import dataclass

from bolide.facade.validate import check_int, check_seconds

__all__ = ["Retry"]


@dataclass(frozen=True, slots=True)
class Retry:
    """How often a receiver calls its handler on one record before giving the record up.

    The wait before retry ``n`` (1, 2, ...) is ``min(max_backoff_s, backoff_s * 2 ** (n - 1))``
    with jitter: a random share between half and all of it, so records that failed together
    do not all come back at once (Spring Kafka's ``ExponentialBackOff``, AWS's "equal jitter").

    Args:
        attempts: Calls in all, the first included (1 means no retry).
        backoff_s: The wait before the first retry; 0 retries at once.
        max_backoff_s: The longest wait.

    Raises:
        TypeError: A value of the wrong type.
        ValueError: ``attempts`` below 1, a negative wait, or ``max_backoff_s < backoff_s``.
    """

    attempts: int = 3
    backoff_s: float = 0.1
    max_backoff_s: float = 5.0

    def __post_init__(self) -> None:
        check_int("attempts", self.attempts, minimum=1)
        for name in ("backoff_s", "max_backoff_s"):
            value = getattr(self, name)
            if value != 0:
                object.__setattr__(self, name, check_seconds(name, value))
        if self.max_backoff_s < self.backoff_s:
            raise ValueError(
                f"max_backoff_s ({self.max_backoff_s}) must be >= backoff_s ({self.backoff_s})"
            )

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1 is the first retry)."""
        ceiling = min(self.max_backoff_s, self.backoff_s * 2.0 ** min(retry - 1, 64))
        return random.uniform(ceiling / 2, ceiling)
