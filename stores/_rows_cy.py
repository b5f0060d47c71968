"""The history pages' per-row work: database rows made into records and their headers grouped.

Written in Cython's pure-Python mode, as ``bolide.facade._record_cy`` is: setup.py compiles it
where a C compiler is at hand, and it runs as it is otherwise (``bolide.facade._cext``).
``bolide.stores._pages.read_page`` calls it once per page.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from bolide.facade.record import Headers, Record, trusted_record

if TYPE_CHECKING:
    _COMPILED = False
else:
    try:
        import cython  # inside compiled code, always there; at run time, only with Cython

        _COMPILED = cython.compiled
    except ModuleNotFoundError:  # Cython is a build requirement only: this is the Python one
        _COMPILED = False

__all__ = ["group_headers", "is_compiled", "records_from_rows"]


def is_compiled() -> bool:
    """True when this module runs as an extension module built by Cython."""
    return bool(_COMPILED)


def group_headers(
    rows: Sequence[Sequence[Any]], mark: str, unescape: Callable[[str], str]
) -> dict[int, Headers]:
    """``(offset, name, value)`` header rows grouped by offset, in order, as ``(str, bytes)``
    pairs; a name starting with ``mark`` is stored escaped and goes through ``unescape``."""
    headers: dict[int, Headers] = {}
    for off, name, value in rows:
        if name[:1] == mark:  # rare: an escaped name (no call per header otherwise)
            name = unescape(name)
        pair = (name, value if type(value) is bytes else bytes(value))
        found = headers.get(off)
        if found is None:
            headers[off] = [pair]
        else:
            found.append(pair)
    return headers


def records_from_rows(
    rows: Sequence[Sequence[Any]], headers: dict[int, Headers], stream: str, partition: int
) -> list[Record]:
    """``(offset, timestamp_ms, key, payload)`` rows of ``stream``'s ``partition`` as records
    (from our own tables: the trusted constructor skips the checks)."""
    out: list[Record] = []
    append = out.append
    for off, ts, key, payload in rows:
        append(
            trusted_record(
                payload if payload is None or type(payload) is bytes else bytes(payload),
                key if key is None or type(key) is bytes else bytes(key),
                headers.get(off, []),
                stream,
                partition,
                off,
                ts,
            )
        )
    return out
