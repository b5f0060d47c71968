"""``Record.headers`` is a list the record owns, whether it was given, read or never set (an
empty one is made on first use)."""

from __future__ import annotations

import pickle

import pytest

from bolide.facade import (
    InitialOffsetScheme,
    Publisher,
    PublisherConfig,
    Record,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.record import headers_or_none
from tests.conftest import eventually


def test_a_record_without_headers_has_an_empty_list_of_its_own() -> None:
    first, second = Record(b"a"), Record(b"a")
    assert headers_or_none(first) is None
    assert first.headers == [] and first == second and first.header("x") is None
    first.headers.append(("x", b"1"))
    assert first.headers == [("x", b"1")] and first.header("x") == b"1"
    assert second.headers == [] and first != second
    assert headers_or_none(first) == [("x", b"1")]
    second.headers = [("y", b"2")]
    assert second.header("y") == b"2"
    given = Record(b"a", headers={"x": "1"})
    assert given == first and pickle.loads(pickle.dumps(given)) == given
    assert headers_or_none(Record(b"a", headers={})) is None  # empty given: none either


@pytest.mark.kafka
@pytest.mark.tansu
def test_records_read_without_headers_get_a_list_of_their_own(cluster, stream_factory):
    stream = stream_factory()
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        pub.publish_many([Record(b"plain"), Record(b"plain")]).result(30)
        pub.publish(Record(b"tagged", headers=[("n", b"1"), ("n", b"2")]))
    config = SubscriberConfig(stream=stream, initial_offset_scheme=InitialOffsetScheme.EARLIEST)
    got: list[Record] = []
    with Subscriber(cluster, config) as sub:
        eventually(lambda: got.extend(sub.poll(200)) or len(got) >= 3, 30)
    plain, other, tagged = got
    assert headers_or_none(plain) is None and plain.headers == [] and plain.group is None
    plain.headers.append(("added", b"yes"))
    assert plain.header("added") == b"yes" and other.headers == []
    assert tagged.headers == [("n", b"1"), ("n", b"2")] and tagged.header("n") == b"2"
