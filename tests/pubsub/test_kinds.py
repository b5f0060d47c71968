"""The kinds of subscriber: separate classes, each with the operations that make sense for it,
and one place (``new_subscriber``, which ``Subscriber(...)`` follows) that picks a kind from a
config. Share groups are built on the broker in tests/queues/test_share.py."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bolide.facade import (
    Cluster,
    InitialOffsetScheme,
    ShareSubscriber,
    StreamConfig,
    StreamsSubscriber,
    Subscriber,
    SubscriberConfig,
    new_subscriber,
)
from bolide.facade.subscribers.one_stream import OneStreamSubscriber

#: What a consumer group subscriber has and a share group member has not.
CONSUMER_ONLY = (
    "seek",
    "seek_to_time",
    "pause",
    "resume",
    "paused",
    "committed",
    "deactivate",
    "reactivate",
    "transaction_sources",
    "durable",
    "marker",
)
#: The asyncio steps (``SubscriberLike``): a one-stream subscriber's, no other kind's.
ASYNC_STEPS = ("poll_step", "give_back", "confirm_read")

NOWHERE = Cluster("127.0.0.1:1")  # never reached: each refusal comes before any connection


def test_each_kind_is_its_own_class_with_only_its_own_operations() -> None:
    assert not issubclass(ShareSubscriber, OneStreamSubscriber)
    assert not issubclass(StreamsSubscriber, OneStreamSubscriber)
    assert [name for name in CONSUMER_ONLY if hasattr(ShareSubscriber, name)] == []
    assert [name for name in ASYNC_STEPS if hasattr(ShareSubscriber, name)] == []
    assert [name for name in ASYNC_STEPS if hasattr(StreamsSubscriber, name)] == []
    assert all(hasattr(Subscriber, name) for name in CONSUMER_ONLY + ASYNC_STEPS)
    for kind in (Subscriber, StreamsSubscriber, ShareSubscriber):
        assert all(hasattr(kind, name) for name in ("poll", "confirm", "attach_receiver"))
        assert all(hasattr(kind, name) for name in ("health", "close", "closed", "streams"))


def test_a_class_given_another_kinds_config_says_which_class_reads_it() -> None:
    one = StreamConfig(name="orders")
    share = SubscriberConfig(stream=one, share_group="workers")
    with pytest.raises(ValueError, match=r"one stream \(stream=\): read it with Subscriber"):
        StreamsSubscriber(NOWHERE, SubscriberConfig(stream=one))
    with pytest.raises(ValueError, match="share group: read it with ShareSubscriber"):
        OneStreamSubscriber(NOWHERE, share)
    with pytest.raises(TypeError, match="with share_group"):
        ShareSubscriber(NOWHERE, SubscriberConfig(stream=one))
    with pytest.raises(TypeError, match="config must be a SubscriberConfig"):
        new_subscriber(NOWHERE, {"stream": one})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cluster must be a Cluster"):
        Subscriber("127.0.0.1:1", share)  # type: ignore[arg-type]


@pytest.mark.kafka
def test_new_subscriber_and_subscriber_pick_the_kind_the_config_names(
    cluster: Cluster, stream_factory: Callable[..., StreamConfig]
) -> None:
    a, b = stream_factory(), stream_factory()
    earliest = InitialOffsetScheme.EARLIEST
    one = SubscriberConfig(stream=a, initial_offset_scheme=earliest)
    several = SubscriberConfig(streams=[a, b], initial_offset_scheme=earliest)
    for build in (new_subscriber, Subscriber):
        with build(cluster, one) as sub:
            assert type(sub) is Subscriber
        with build(cluster, several) as subs:
            assert type(subs) is StreamsSubscriber
            assert subs.streams == (a.name, b.name)
    with StreamsSubscriber(cluster, several) as subs:
        assert len(subs.poll(0)) == 0
