"""``Retry``: how often a receiver calls its handler on one record before giving it up, and
``RetryTier``: a delayed retry on a stream of its own that keeps each key's order."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from bolide.facade.cluster import TOPIC_NAME
from bolide.facade.validate import check_int, check_seconds

__all__ = ["ATTEMPTS_HEADER", "ORIGIN_HEADER", "WRITER_HEADER", "Retry", "RetryTier"]

#: On a record in a retry tier: ``<stream>/<partition>/<offset>`` of the original record.
ORIGIN_HEADER = "bolide.retry.origin"
#: On a record in a retry tier: handler calls so far, as decimal text ("0": parked behind an
#: earlier record of its key, never called yet).
ATTEMPTS_HEADER = "bolide.retry.attempts"
#: On a record in a retry tier: the transactional id of the receiver that wrote it.
WRITER_HEADER = "bolide.retry.writer"


@dataclass(frozen=True, slots=True)
class RetryTier:
    """A delayed retry: a record that still fails is moved to this tier's stream and called
    again ``delay_s`` after it got there (the delay is in Kafka: it survives restarts).

    Args:
        delay_s: Seconds between a record's arrival in the tier and its next call; > 0.
        stream: The tier's stream; default ``<stream>.retry-<delay>`` (``orders.retry-10s``),
            created on demand with the source stream's partition count.

    Raises:
        TypeError: A value of the wrong type.
        ValueError: A delay that is not positive and finite, or a bad stream name.
    """

    delay_s: float
    stream: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.delay_s, bool) or not isinstance(self.delay_s, int | float):
            raise TypeError(f"delay_s must be a number, not {type(self.delay_s).__name__}")
        if not (self.delay_s > 0 and math.isfinite(self.delay_s)):
            raise ValueError(f"delay_s must be a positive number of seconds, not {self.delay_s}")
        if self.stream is not None and (
            not isinstance(self.stream, str) or not TOPIC_NAME.match(self.stream)
        ):
            raise ValueError(f"stream {self.stream!r} is not a valid Kafka topic name")

    def stream_for(self, source: str) -> str:
        """This tier's stream for records of stream ``source``."""
        if self.stream is not None:
            return self.stream
        delay = f"{self.delay_s:g}".replace(".", "_")
        return f"{source}.retry-{delay}s"


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
        tiers: Delayed retries after the last attempt in the worker (docs/retries.md): the
            record moves to the first tier's stream, then the next; every later record of its
            key is parked behind it until it succeeds or is given up, so no key is
            reordered and other keys flow. Grouped subscribers only.
        transactional_id: The tiers' ``transactional.id`` (their writes are Kafka
            transactions, fenced by the group's generation); default
            ``<group>.retry-tiers.<group.instance.id or a random suffix>``. One per running
            receiver.

    Raises:
        TypeError: A value of the wrong type.
        ValueError: ``attempts`` below 1, a negative wait, ``max_backoff_s < backoff_s``,
            or two tiers on one stream.
    """

    attempts: int = 3
    backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    tiers: Sequence[RetryTier] = field(default=())
    transactional_id: str | None = None

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
        if isinstance(self.tiers, str | bytes) or not isinstance(self.tiers, Sequence):
            raise TypeError("tiers must be a sequence of RetryTier")
        tiers = tuple(self.tiers)
        for tier in tiers:
            if not isinstance(tier, RetryTier):
                raise TypeError(f"tiers must hold RetryTier objects, not {type(tier).__name__}")
        names = [t.stream_for("") for t in tiers]
        if len(set(names)) != len(names):
            raise ValueError("two retry tiers share one stream (give each its own delay_s)")
        object.__setattr__(self, "tiers", tiers)
        if self.transactional_id is not None and (
            not isinstance(self.transactional_id, str) or not self.transactional_id
        ):
            raise ValueError("transactional_id must be a non-empty string or None")

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1 is the first retry)."""
        ceiling = min(self.max_backoff_s, self.backoff_s * 2.0 ** min(retry - 1, 64))
        return random.uniform(ceiling / 2, ceiling)
