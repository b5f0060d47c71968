"""The fetch loop's per-record work: a consumed batch's run of one partition made into records.

Written in Cython's pure-Python mode, as ``bolide.facade._record_cy`` is: setup.py compiles it
where a C compiler is at hand, and it runs as it is otherwise (``bolide.facade._cext``).
``Fetcher._take`` (``bolide.facade.consumer.fetch``) calls it once per run and handles what
ends a run (another partition, an error, a gap, a durable replay's marker) itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from confluent_kafka import Message

    from bolide.facade import _cython as cython
    from bolide.facade._record_cy import Record, record_from_message
else:
    try:
        import cython  # the compiler needs this import by name
    except ModuleNotFoundError:  # Cython is a build requirement only
        from bolide.facade import _cython as cython
    if cython.compiled:  # the record's C layout: its fields are read and written directly
        from cython.cimports.bolide.facade._record_cy import Record
    else:
        from bolide.facade._record_cy import Record
    from bolide.facade._record_cy import record_from_message

__all__ = ["is_compiled", "take_run"]


def is_compiled() -> bool:
    """True when this module runs as an extension module built by Cython."""
    return bool(cython.compiled)


@cython.locals(index=cython.Py_ssize_t, count=cython.Py_ssize_t, record=Record)
def take_run(
    msgs: list[Message],
    index: int,
    partition: int,
    expected: int | None,
    end: int | None,
    topic: str,
    out: list[Record],
) -> tuple[int, int, int | None, Record | None]:
    """Deliver ``msgs[index:]`` into ``out`` while they are a run of ``partition`` in order.

    Each message delivered is replaced by ``None`` in ``msgs`` (the collector never finds it);
    a message without an offset is passed over. The run stops at a message with an error or
    of another partition (left for the caller), or at a record above ``expected`` (a gap) or
    at or above ``end`` (a durable replay's marker; below it records are ``replayed``): that
    record is returned undelivered, for the caller to decide.

    Returns:
        Where the run stopped, the last offset delivered (-1: none), the offset expected next,
        and the record it stopped at (``None``: it stopped at a message, or at the end).
    """
    count = len(msgs)
    last = -1
    append = out.append
    while index < count:
        msg = msgs[index]
        if msg.error() is not None or msg.partition() != partition:
            break
        record = record_from_message(msg, topic)
        offset = record.offset
        if offset is None:
            index += 1
            continue
        if (expected is not None and offset > expected) or (end is not None and offset >= end):
            return index, last, expected, record
        if end is not None:
            record.replayed = True
        msgs[index] = None  # type: ignore[call-overload]  # let go at once
        append(record)
        last = offset
        expected = offset + 1
        index += 1
    return index, last, expected, None
