"""The history's per-row work: records made into insert rows, and database rows made into
records with their headers grouped.

Written in Cython's pure-Python mode, as ``bolide.facade._record_cy`` is: setup.py compiles it
where a C compiler is at hand, and it runs as it is otherwise (``bolide.facade._cext``).
``bolide.stores._pages.read_page`` calls it once per page, ``SqlStore.store_all`` (the
archiver's writes) once per batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
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

__all__ = ["group_headers", "insert_rows", "is_compiled", "records_from_rows"]


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


def insert_rows(
    stream: str,
    key: str,
    records: Iterable[Record],
    rows: list[Any],
    headers: list[Any],
    mark: str,
    escape: Callable[[str], str],
    check: Callable[[str, object], object],
) -> None:
    """Append the insert rows of ``records`` to ``rows`` and ``headers`` under the topic
    incarnation's ``key``: ``(key, partition, offset, timestamp_ms, record key, payload)`` and
    ``(key, partition, offset, index, name, value)``. The first occurrence of a (partition,
    offset) wins; a header name holding U+0000 or starting with ``mark`` goes through
    ``escape``; ``check(what, value)`` raises for a partition or offset that is not a
    non-negative int.

    Raises:
        TypeError: An item of ``records`` is not a ``Record``.
        ValueError: A record has no partition or offset, or belongs to another stream.
    """
    seen: set[tuple[int, int]] = set()
    append, extend = rows.append, headers.extend
    for rec in records:
        if type(rec) is not Record and not isinstance(rec, Record):
            raise TypeError(f"records must hold Record objects, not {type(rec).__name__}")
        partition, offset = rec.partition, rec.offset
        if partition is None or offset is None:
            raise ValueError(f"records: {rec!r} has no partition/offset; publish it first")
        if rec.stream is not None and rec.stream != stream:
            raise ValueError(f"records: {rec!r} belongs to stream {rec.stream!r}, not {stream!r}")
        if type(partition) is not int or partition < 0:
            check("record partition", partition)
        if type(offset) is not int or offset < 0:
            check("record offset", offset)
        where = (partition, offset)
        if where in seen:
            continue
        seen.add(where)
        append((key, partition, offset, rec.timestamp_ms, rec.key, rec.data))
        pairs = rec.headers
        if pairs:
            extend(
                [
                    (
                        key,
                        partition,
                        offset,
                        i,
                        escape(name) if "\x00" in name or name[:1] == mark else name,
                        value,
                    )
                    for i, (name, value) in enumerate(pairs)
                ]
            )
