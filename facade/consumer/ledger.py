"""``Ledger``: one partition's completions, and their compact encoding.

A partition's confirmed position (its frontier: every record below it is finished) and the
records above it finished already (a parallel receiver's handlers confirm their own records
in any order). The finished set is written with the position (in Kafka's commit metadata, or
in the position store's row) so that the next owner of the partition skips those records
instead of handing them out again; the frontier passing them drops them.

The encoding is bolide's own and versioned: ``bolide:f1:`` then the URL-safe base64 of a
zlib-compressed bitset whose bit ``i`` is the offset ``frontier + i``. Anything else (another
client's metadata) decodes to nothing, with a warning: it is never misread as finished work.
"""

from __future__ import annotations

import base64
import binascii
import logging
import zlib
from collections.abc import Iterable

__all__ = ["MAX_ENCODED", "PREFIX", "Ledger", "decode_finished", "encode_finished"]

log = logging.getLogger("bolide.subscriber")

#: What starts bolide's encoding of a finished set (the version is its last part).
PREFIX = "bolide:f1:"

#: The longest encoding written (Kafka's default ``offset.metadata.max.bytes`` is 4096):
#: a finished set whose encoding is longer is left out, its records run again.
MAX_ENCODED = 4000

_MAX_BITS = 1 << 20  # bytes of bitset a decoded set may span (8 Mi offsets)


class Ledger:
    """One partition's frontier (the next offset to confirm, ``-1`` while none is known) and
    the finished offsets above it."""

    __slots__ = ("finished", "frontier", "high")

    def __init__(self, frontier: int = -1, finished: Iterable[int] = ()) -> None:
        self.frontier = frontier
        self.finished: set[int] = {o for o in finished if o >= frontier}
        #: At least the highest offset ever finished: a reader below it may meet one.
        self.high = max(self.finished, default=-1)

    def finish(self, offset: int) -> None:
        """``offset`` finished (its effects are committed)."""
        if offset >= self.frontier:
            self.finished.add(offset)
            self.high = max(self.high, offset)

    def advance(self, position: int) -> None:
        """The position confirmed is ``position``: the frontier never moves back, and passes
        the finished offsets that follow it without a gap."""
        frontier = max(self.frontier, position)
        finished = self.finished
        while frontier in finished:
            frontier += 1
        self.frontier = frontier
        self.finished = {o for o in finished if o >= frontier}

    def above(self, position: int, also: int | None = None) -> list[int]:
        """The finished offsets at or above ``position`` (and ``also``, when it is), sorted."""
        finished = {o for o in self.finished if o >= position}
        if also is not None and also >= position:
            finished.add(also)
        return sorted(finished)


def encode_finished(position: int, finished: Iterable[int]) -> str | None:
    """The encoding of ``finished`` (offsets at or above ``position``): ``""`` when there are
    none, ``None`` when it would be longer than ``MAX_ENCODED`` (then the position alone is
    written and those records run again)."""
    offsets = sorted(o for o in finished if o >= position)
    if not offsets:
        return ""
    bits = bytearray((offsets[-1] - position) // 8 + 1)
    for o in offsets:
        i = o - position
        bits[i >> 3] |= 1 << (i & 7)
    text = PREFIX + base64.urlsafe_b64encode(zlib.compress(bytes(bits), 9)).decode("ascii")
    return text if len(text) <= MAX_ENCODED else None


def decode_finished(position: int, text: str | None, *, where: str) -> set[int]:
    """The finished offsets ``encode_finished`` wrote with ``position``; nothing (with a
    warning naming ``where``) for text that is not bolide's encoding."""
    if not text:
        return set()
    if not text.startswith(PREFIX) or len(text) > MAX_ENCODED:
        log.warning("%s: commit metadata not written by bolide is ignored: %.60r", where, text)
        return set()
    inflate = zlib.decompressobj()
    try:
        bits = inflate.decompress(base64.urlsafe_b64decode(text[len(PREFIX) :]), _MAX_BITS)
    except (binascii.Error, ValueError, zlib.error):
        bits = b""
    if not bits or inflate.unconsumed_tail or not inflate.eof:
        log.warning("%s: malformed finished set ignored: %.60r", where, text)
        return set()
    return {
        position + (i << 3) + b for i, byte in enumerate(bits) for b in range(8) if byte >> b & 1
    }
