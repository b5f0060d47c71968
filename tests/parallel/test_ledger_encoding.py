"""The finished set's encoding: compact, bounded, and never misreading what it did not write."""

from __future__ import annotations

import logging
import random

import pytest

from bolide.facade.consumer.ledger import (
    MAX_ENCODED,
    PREFIX,
    Ledger,
    decode_finished,
    encode_finished,
)


def test_a_finished_set_comes_back_as_it_was_written() -> None:
    finished = {101, 102, 105, 164, 999}
    text = encode_finished(100, finished)
    assert text is not None and text.startswith(PREFIX)
    assert decode_finished(100, text, where="t") == finished


def test_offsets_below_the_position_are_left_out() -> None:
    assert encode_finished(10, [3, 9]) == ""
    assert decode_finished(10, encode_finished(10, [3, 12]), where="t") == {12}


def test_a_thousand_in_flight_fit_in_kafka_commit_metadata() -> None:
    """Half of 1,000 records above the frontier finished, in any pattern: well under the
    metadata bound (a bitset of 125 bytes before compression)."""
    finished = set(random.Random(7).sample(range(1, 1001), 500))
    text = encode_finished(0, finished)
    assert text is not None and len(text) < 400
    assert decode_finished(0, text, where="t") == finished


def test_a_set_too_large_to_encode_is_left_out() -> None:
    finished = set(random.Random(3).sample(range(1, 10_000_000), 20_000))
    assert encode_finished(0, finished) is None


@pytest.mark.parametrize(
    "text",
    [
        "written by another client",
        "bolide:f9:AAAA",
        PREFIX + "!!! not base64",
        PREFIX + "AAAA",  # base64, not zlib
        PREFIX + "x" * MAX_ENCODED,
    ],
)
def test_metadata_not_in_bolides_encoding_is_ignored_with_a_warning(
    text: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="bolide.subscriber"):
        assert decode_finished(5, text, where="topic[0]") == set()
    assert "topic[0]" in caplog.text


def test_the_frontier_passes_the_finished_records_that_follow_it() -> None:
    ledger = Ledger(0, [2, 3, 7])
    ledger.advance(2)
    assert ledger.frontier == 4 and ledger.finished == {7}
    ledger.advance(1)  # never back
    assert ledger.frontier == 4
    assert ledger.above(4, also=5) == [5, 7]
