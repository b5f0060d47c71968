"""``DeadLetterSink`` and ``check_dead_letter``: one place a ``dead_letter`` option (a publisher
or a function) is told apart, sent to and checked. The function cases need no broker."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from bolide.facade import Cluster, Publisher, PublisherConfig, Record, StreamConfig
from bolide.facade.deadletter import (
    REASON_HEADER,
    SOURCE_HEADER,
    DeadLetterSink,
    Reason,
    check_dead_letter,
)
from bolide.facade.errors import PublishError

Outcomes = list[BaseException | None]


def _record() -> Record:
    record = Record(b"payload", key=b"k")
    record.stream, record.partition, record.offset = "orders", 0, 7
    return record


def test_a_function_gets_the_record_and_the_cause_then_done_hears_of_it() -> None:
    got: list[tuple[Record, BaseException]] = []
    outcomes: Outcomes = []
    sink = DeadLetterSink(lambda r, e: got.append((r, e)))
    record, error = _record(), RuntimeError("poison")
    pending = sink.send_async(record, error, outcomes.append, reason=Reason.FAILED, detail="x")
    assert pending is None and got == [(record, error)] and outcomes == [None]
    assert sink.stream is None


def test_a_function_that_raises_is_a_failed_dead_letter() -> None:
    def refuse(record: Record, error: BaseException) -> None:
        raise OSError("full")

    outcomes: Outcomes = []
    sink = DeadLetterSink(refuse)
    sink.send_async(_record(), ValueError(), outcomes.append, reason=Reason.FAILED, detail="x")
    assert len(outcomes) == 1 and isinstance(outcomes[0], OSError)
    with pytest.raises(OSError, match="full"):
        sink.send(_record(), ValueError(), reason=Reason.FAILED, detail="x")


def test_an_async_function_s_awaitable_is_handed_back_for_the_caller_to_await() -> None:
    got: list[Reason] = []

    async def later(record: Record, reason: Reason) -> None:
        got.append(reason)

    outcomes: Outcomes = []
    sink: DeadLetterSink[Reason] = DeadLetterSink(later)
    pending = sink.send_async(
        _record(), Reason.TIMEOUT, outcomes.append, reason=Reason.TIMEOUT, detail="x"
    )
    assert pending is not None and outcomes == []  # done is the caller's, once awaited

    async def await_it() -> None:
        await pending

    asyncio.run(await_it())
    assert got == [Reason.TIMEOUT]


@pytest.mark.parametrize(("takes", "value"), [("error", "dlq"), ("reason", 5)])
def test_check_refuses_what_is_neither_a_publisher_nor_callable(takes: str, value: object) -> None:
    with pytest.raises(TypeError, match=rf"dead_letter must be .*callable\(record, {takes}\)"):
        check_dead_letter(value, takes)
    check_dead_letter(None)
    check_dead_letter(lambda r, e: None)


@pytest.mark.kafka
def test_a_publisher_gets_the_letter_and_done_hears_its_acknowledgement(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    stream = stream_factory(name_prefix="dlq")
    with Publisher(cluster, PublisherConfig(stream=stream)) as publisher:
        sink = DeadLetterSink(publisher)
        assert sink.stream == stream.name
        acked = threading.Event()
        outcomes: Outcomes = []

        def done(error: BaseException | None) -> None:
            outcomes.append(error)
            acked.set()

        record = _record()
        pending = sink.send_async(
            record, RuntimeError(), done, reason=Reason.FAILED, detail="x", source="orders/0/7"
        )
        assert pending is None
        assert acked.wait(30) and outcomes == [None]
        sink.send(record, RuntimeError(), reason=Reason.FAILED, detail="x")  # waits for the ack
        assert record.header(REASON_HEADER) is None  # the record itself is left as it was
        assert record.header(SOURCE_HEADER) is None
    outcomes.clear()
    sink.send_async(record, RuntimeError(), outcomes.append, reason=Reason.FAILED, detail="x")
    assert len(outcomes) == 1 and isinstance(outcomes[0], PublishError)  # closed: refused
    with pytest.raises(PublishError):
        sink.send(record, RuntimeError(), reason=Reason.FAILED, detail="x")
