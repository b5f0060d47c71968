"""What a delivery report does per record: stamp the record, resolve its future, call back.

Written in Cython's pure-Python mode, as ``bolide.facade._record_cy`` is: setup.py compiles it
where a C compiler is at hand, and it runs as it is otherwise (``bolide.facade._cext``).
``bolide.facade.producer.deliveries`` is where the names are imported from.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from bolide.facade.producer.future import DeliveryFuture

if TYPE_CHECKING:
    from confluent_kafka import Message

    from bolide.facade import _cython as cython
    from bolide.facade._record_cy import Record
    from bolide.facade.ports import PublishCallback
else:
    try:
        import cython  # the compiler needs this import by name
    except ModuleNotFoundError:  # Cython is a build requirement only
        from bolide.facade import _cython as cython
    if cython.compiled:  # the record's C layout: its fields are written directly
        from cython.cimports.bolide.facade._record_cy import Record
    else:
        from bolide.facade._record_cy import Record

__all__ = ["Delivery", "FutureDelivery", "Reports", "call_back", "is_compiled", "settle"]

log = logging.getLogger("bolide.facade.publisher")


class Reports(Protocol):
    """The deliveries a publisher awaits reports for (``deliveries.Outstanding``)."""

    def remove(self, delivery: Any, /) -> None:
        """Its report came; ``KeyError`` if ``close`` failed it first."""

    def error(self, rec: Record, err: Any) -> BaseException:
        """The error for a record the broker (or ``close``) did not accept."""


def is_compiled() -> bool:
    """True when this module runs as an extension module built by Cython."""
    return bool(cython.compiled)


def call_back(callback: PublishCallback, offset: int | None, error: BaseException | None) -> None:
    """Call a publish callback; what it raises is logged, never propagated."""
    try:
        callback(offset, error)
    except Exception:
        log.exception("publish callback raised")


@cython.locals(rec=Record)
def settle(
    outstanding: Reports,
    rec: Record,
    future: Future[int] | None,
    callback: PublishCallback | None,
    err: Any,
    msg: Message | None,
) -> None:
    """Stamp ``rec`` from its delivery report, resolve ``future`` and call ``callback``."""
    if err is not None or msg is None:
        error = outstanding.error(rec, err)
        if future is not None:
            future.set_exception(error)
        if callback is not None:
            call_back(callback, None, error)
        return
    # A delivered message always has them; the stubs allow None (no cast: a call per record).
    offset: int = msg.offset()  # type: ignore[assignment]
    rec.offset = offset
    rec.partition = msg.partition()
    rec.timestamp_ms = msg.timestamp()[1]
    if future is not None:
        future.set_result(offset)
    if callback is not None:
        call_back(callback, offset, None)


@cython.cclass
class Delivery:
    """Calls one record's callback from its delivery report (``produce``: no future)."""

    __slots__ = ("callback", "outstanding", "record")

    def __init__(
        self, outstanding: Reports, record: Record, callback: PublishCallback | None
    ) -> None:
        self.outstanding = outstanding
        self.record = record
        self.callback = callback

    def __call__(self, err: Any, msg: Message | None) -> None:
        try:
            self.outstanding.remove(self)
        except KeyError:
            return  # already failed by close
        settle(self.outstanding, self.record, None, self.callback, err, msg)

    def resolve(self, err: Any, msg: Message | None) -> None:
        """Stamp the record and call the callback (once: the caller owns the delivery)."""
        settle(self.outstanding, self.record, None, self.callback, err, msg)


class FutureDelivery(DeliveryFuture):
    """``publish_async``'s future, which is also its record's delivery report.

    One object per record where a future and a report object were two: with tens of
    thousands in flight, each object the garbage collector tracks costs more than the work
    it does. Only the publisher calls it; once resolved it lets go of the record, the callback
    and the publisher's bookkeeping, so a future kept by the caller holds nothing else.
    """

    def __init__(  # no super().__init__(): a DeliveryFuture starts at its class defaults
        self, outstanding: Reports, record: Record, callback: PublishCallback | None
    ) -> None:
        self._outstanding: Reports | None = outstanding
        self._record: Record | None = record
        self._callback = callback

    def __call__(self, err: Any, msg: Message | None) -> None:
        outstanding, rec, callback = self._outstanding, self._record, self._callback
        if outstanding is None or rec is None:
            return  # already resolved
        try:
            outstanding.remove(self)
        except KeyError:
            return  # already failed by close
        self._outstanding = self._record = self._callback = None
        settle(outstanding, rec, self, callback, err, msg)

    def resolve(self, err: Any, msg: Message | None) -> None:
        """Resolve this future and call the callback (once: the caller owns the delivery)."""
        outstanding, rec, callback = self._outstanding, self._record, self._callback
        if outstanding is None or rec is None:
            return
        self._outstanding = self._record = self._callback = None
        settle(outstanding, rec, self, callback, err, msg)
