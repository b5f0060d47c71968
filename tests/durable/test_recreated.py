"""A durable client whose topic was deleted and created again while it was away: its queue was
the old topic's. It is told (``TopicRecreatedError``), its marker is taken on the new topic
and kept under that topic's incarnation, and it reads the new topic from the start, as a new
client would; nothing of the new topic is taken for the old queue's."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bolide.facade import Cluster, StreamConfig, Subscriber, TopicRecreatedError
from bolide.facade.kafka import topic_identity
from bolide.stores.durable_registry import SqlDurableRegistry
from tests.durable.conftest import LIVE, Events, publish
from tests.history.test_incarnations import recreate

pytestmark = pytest.mark.kafka


def test_a_resumed_client_is_told_its_topic_was_recreated(
    bolide_backend: tuple[str, Cluster],
    stream_factory: Callable[..., StreamConfig],
    durable: Callable[..., Subscriber],
    registry: SqlDurableRegistry,
) -> None:
    if bolide_backend[0] == "tansu":
        pytest.skip("the embedded Tansu engine reports no topic ids")
    cluster = bolide_backend[1]
    stream = stream_factory(partitions=1)
    publish(cluster, stream, 4, "old")
    first = Events()
    sub = durable(stream, "c1", registry, on_live=first.on_live)
    first.drain(sub, lambda: first.live_count() == 1)
    sub.close()
    old = topic_identity(cluster, stream.name)
    new_id = recreate(cluster, stream.name)
    publish(cluster, stream, 3, "new")
    errors: list[BaseException | None] = []
    events = Events()
    sub = durable(
        stream,
        "c1",
        registry,
        on_live=events.on_live,
        error_handler=lambda summary, error: errors.append(error),
    )
    events.drain(sub, lambda: events.live_count() == 1)
    told = [e for e in errors if isinstance(e, TopicRecreatedError)]
    assert len(told) == 1 and told[0].topic_id == new_id
    assert old is not None and told[0].old_topic_id == old.topic_id
    assert [e[3] for e in events.items if e != LIVE] == [b"new-0", b"new-1", b"new-2"]
    stored = registry.get("c1")
    assert stored is not None
    assert stored.markers == {f"{stream.name}@{new_id}": {0: 3}}
