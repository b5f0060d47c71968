"""librdkafka's own lines: each reaches the ``bolide.kafka`` logger (so it carries that name
wherever logging is set up), and a condition librdkafka retries by itself is logged at debug."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import Producer

from bolide.facade.kafka import PRODUCER_DEFAULTS
from tests.conftest import eventually

#: librdkafka's line on most first publishes to a fresh broker, as its client hands it over.
GETPID = (
    "%s [%s] %s",
    "GETPID",
    "rdkafka#producer-1",
    "[thrd:main]: Failed to acquire idempotence PID from broker 127.0.0.1:9092/1: Broker: "
    "Coordinator load in progress: retrying",
)


def test_a_clients_lines_reach_the_bolide_kafka_logger(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="bolide.kafka")
    producer = Producer({**PRODUCER_DEFAULTS, "bootstrap.servers": "127.0.0.1:1"})

    def refused() -> list[logging.LogRecord]:
        producer.poll(0.1)  # librdkafka's lines are handed over by poll
        return [r for r in caplog.records if "Connection refused" in r.getMessage()]

    lines = eventually(refused, 30)
    assert {r.name for r in lines} == {"bolide.kafka"}
    assert all(r.levelno >= logging.WARNING for r in lines)  # a fault: not hidden
    producer.flush(0)


def test_a_condition_librdkafka_retries_is_logged_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="bolide.kafka")
    PRODUCER_DEFAULTS["logger"].log(logging.WARNING, *GETPID)
    (record,) = caplog.records
    assert (record.name, record.levelno) == ("bolide.kafka", logging.DEBUG)
    assert record.getMessage().startswith("GETPID [rdkafka#producer-1]")
