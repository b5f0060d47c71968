"""``Subscriber`` and ``new_subscriber``: the kinds of subscriber, and the one place that
picks a kind from a config.

Three classes read streams, each with the operations that make sense for it and no other:

- ``Subscriber``: one stream through one Kafka consumer, ungrouped or in a subscriber group
  (a consumer group), durable or not (``bolide.facade.subscribers.one_stream``, where it is
  implemented);
- ``StreamsSubscriber``: several streams as one subscriber, ``SubscriberConfig(streams=...)``
  or ``pattern=`` (``bolide.facade.subscribers.streams``);
- ``ShareSubscriber``: one stream read as a queue in a Kafka share group,
  ``SubscriberConfig(share_group=...)`` (``bolide.facade.subscribers.share``).

Build the one you mean, or let ``new_subscriber(cluster, config)`` pick it from the config.
``Subscriber(cluster, config)`` picks the same way (see ``Subscriber.__new__``): it is how
applications have always built every kind, so it keeps doing so.
"""

from __future__ import annotations

from typing import Self

from bolide.facade.config import Cluster, SubscriberConfig
from bolide.facade.subscribers.one_stream import OneStreamSubscriber
from bolide.facade.subscribers.share import ShareSubscriber
from bolide.facade.subscribers.streams import StreamsSubscriber

__all__ = ["AnySubscriber", "Subscriber", "new_subscriber"]


class Subscriber(OneStreamSubscriber):
    """Reads records from one stream (``OneStreamSubscriber`` under its pinned name).

    Args:
        cluster: Where the stream lives.
        config: Stream, subscriber group, initial offset scheme and the other settings.

    Given a config that names several streams, a pattern or a share group, ``Subscriber(...)``
    returns a ``StreamsSubscriber`` or a ``ShareSubscriber`` instead, as ``new_subscriber``
    does; to a type checker it is a ``Subscriber`` all the same, so typed code builds those
    kinds by their own class or through ``new_subscriber``.

    Raises:
        InvalidInitialOffsetSchemeError: NONE on an ungrouped subscriber.
        OffsetLoadError: NONE on a grouped subscriber whose group confirmed nothing.
        StreamConfigMismatchError: The topic exists with another partition count.
    """

    def __new__(cls, cluster: Cluster, config: SubscriberConfig) -> Self:
        # The one constructor that may return another class: ``Subscriber(cluster, config)``
        # with a share group or several streams is a documented call (docs/queues.md,
        # docs/concepts.md). The choice is new_subscriber's, made here and nowhere else.
        if cls is Subscriber and isinstance(config, SubscriberConfig) and not _one_stream(config):
            return new_subscriber(cluster, config)  # type: ignore[return-value]
        return super().__new__(cls)


#: What ``new_subscriber`` returns: one of the three kinds.
AnySubscriber = Subscriber | StreamsSubscriber | ShareSubscriber


def new_subscriber(cluster: Cluster, config: SubscriberConfig) -> AnySubscriber:
    """The subscriber ``config`` describes: a ``ShareSubscriber`` for a ``share_group``, a
    ``StreamsSubscriber`` for ``streams=`` or ``pattern=``, else a ``Subscriber``.

    Raises:
        TypeError: ``config`` is not a ``SubscriberConfig`` (or ``cluster`` not a ``Cluster``).
        And what the chosen class's constructor raises.
    """
    if not isinstance(config, SubscriberConfig):
        raise TypeError("config must be a SubscriberConfig")
    if config.share_group is not None:
        return ShareSubscriber(cluster, config)
    if config.stream is None:
        return StreamsSubscriber(cluster, config)
    return Subscriber(cluster, config)


def _one_stream(config: SubscriberConfig) -> bool:
    """True when ``config`` describes a ``Subscriber`` proper (one stream, no share group)."""
    return config.stream is not None and config.share_group is None
