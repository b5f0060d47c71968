"""The compiled record path: in use where it was built, and not when the run-time switch asks
for the Python sources (docs/performance.md#compiled-record-path)."""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message

import bolide.facade._record_cy as record_cy
import bolide.facade.consumer._fetch_cy as fetch_cy
import bolide.facade.producer._delivery_cy as delivery_cy
from bolide.facade import _cext
from bolide.facade.consumer import fetch
from bolide.facade.producer import deliveries
from bolide.facade.record import Record, record_from_message, trusted_record
from bolide.stores import _pages
from bolide.stores import _rows_cy as rows_cy


def _built(module_name: str) -> bool:
    """True when an extension module for ``module_name`` sits beside its source."""
    module = importlib.import_module(module_name)
    folder = Path(module.__file__ or "").parent
    tail = module_name.rpartition(".")[2]
    return any(
        (folder / f"{tail}{suffix}").exists() for suffix in importlib.machinery.EXTENSION_SUFFIXES
    )


def _version(switch: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != _cext.RUNTIME_SWITCH}
    if switch is not None:
        env[_cext.RUNTIME_SWITCH] = switch
    done = subprocess.run(
        [sys.executable, "-m", "bolide.cli", "--version"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def test_the_compiled_modules_run_where_they_were_built() -> None:
    if _cext.pure_python_forced():
        pytest.skip(f"{_cext.RUNTIME_SWITCH} is set: the sources run (checked below)")
    built = {name: _built(name) for name in _cext.MODULES}
    assert _cext.compiled_modules() == built
    if all(built.values()):
        assert record_cy.is_compiled()
        assert "compiled record path" in _version(None)


def test_the_runtime_switch_runs_the_sources() -> None:
    line = _version("1")
    assert f"pure-Python record path ({_cext.RUNTIME_SWITCH} is set)" in line
    # "0" or empty leaves the choice to the build
    assert _version("0") == _version("")


def test_this_process_runs_what_the_switch_says() -> None:
    if _cext.pure_python_forced():
        assert not any(_cext.compiled_modules().values())
        for name in _cext.MODULES:
            source = importlib.import_module(name).__file__
            assert source is not None and source.endswith(".py")
    assert Record.__module__ == record_cy.__name__
    assert trusted_record is record_cy.trusted_record
    assert record_from_message is record_cy.record_from_message


def test_the_delivery_reports_come_from_their_module() -> None:
    assert deliveries.Delivery is delivery_cy.Delivery
    assert deliveries.FutureDelivery is delivery_cy.FutureDelivery
    assert deliveries.call_back is delivery_cy.call_back
    # compiled or not, the module runs what the switch and the build say
    assert delivery_cy.is_compiled() == (
        _built(delivery_cy.__name__) and not _cext.pure_python_forced()
    )


def _msg(partition: int, offset: int | None, error: KafkaError | None = None) -> Message:
    at = {} if offset is None else {"offset": offset}  # a message made without one has none
    return Message(topic="t", partition=partition, value=b"v", timestamp=(1, 7), error=error, **at)


def test_a_run_of_one_partition_is_delivered_and_let_go() -> None:
    assert fetch.take_run is fetch_cy.take_run
    msgs = [_msg(0, 5), _msg(0, None), _msg(0, 6), _msg(1, 7)]
    out: list[Record] = []
    assert fetch_cy.take_run(msgs, 0, 0, None, None, "t", out) == (3, 6, 7, None)
    assert [(r.stream, r.partition, r.offset, r.replayed) for r in out] == [
        ("t", 0, 5, False),
        ("t", 0, 6, False),
    ]
    # delivered messages are let go; the one without an offset and the next run's stay
    assert msgs[0] is None and msgs[2] is None
    assert msgs[1] is not None and msgs[3] is not None


def test_a_run_stops_at_an_error_a_gap_and_a_replay_marker() -> None:
    out: list[Record] = []
    error = KafkaError(KafkaError._PARTITION_EOF)
    msgs = [_msg(0, 5), _msg(0, 6, error)]
    assert fetch_cy.take_run(msgs, 0, 0, 5, None, "t", out) == (1, 5, 6, None)
    gap = [_msg(0, 6), _msg(0, 9)]
    index, last, expected, record = fetch_cy.take_run(gap, 0, 0, 6, None, "t", out)
    assert (index, last, expected) == (1, 6, 7)
    assert record is not None and record.offset == 9 and gap[1] is not None
    replay = [_msg(0, 7), _msg(0, 8)]
    index, last, expected, record = fetch_cy.take_run(replay, 0, 0, 7, 8, "t", out)
    assert (index, last, expected) == (1, 7, 8)
    assert record is not None and record.offset == 8 and not record.replayed
    assert [(r.offset, r.replayed) for r in out] == [(5, False), (6, False), (7, True)]


def test_history_rows_become_records_with_their_headers() -> None:
    assert _pages.records_from_rows is rows_cy.records_from_rows
    header_rows = [
        (3, "a", b"1"),
        (3, _pages.stored_name("n\x00"), memoryview(b"2")),
        (5, "g", b""),
    ]
    headers = rows_cy.group_headers(header_rows, _pages.ESCAPED_NAME_MARK, _pages.header_name)
    assert headers == {3: [("a", b"1"), ("n\x00", b"2")], 5: [("g", b"")]}
    rows = [(3, 70, memoryview(b"k"), b"v"), (4, 71, None, None), (5, 72, b"k", bytearray(b"w"))]
    records = rows_cy.records_from_rows(rows, headers, "s", 2)
    assert [
        (r.stream, r.partition, r.offset, r.timestamp_ms, r.key, r.data, r.headers) for r in records
    ] == [
        ("s", 2, 3, 70, b"k", b"v", [("a", b"1"), ("n\x00", b"2")]),
        ("s", 2, 4, 71, None, None, []),
        ("s", 2, 5, 72, b"k", b"w", [("g", b"")]),
    ]
    assert all(
        type(r.data) in (bytes, type(None)) and type(r.key) in (bytes, type(None)) for r in records
    )
