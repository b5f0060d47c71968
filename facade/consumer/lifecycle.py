"""``Lifecycle``: what every kind of subscriber shares, whatever it reads and however.

The subscriber kinds (``bolide.facade.subscribers``: one stream, several streams, a share
group's member) are separate classes: each has the operations that make sense for it and no
other. What they do have in common lives here: the arguments checked at construction, open
until ``close``, at most one running receiver, and ``with sub:`` closing it.
"""

from __future__ import annotations

from bolide.facade.config import Cluster, SubscriberConfig
from bolide.facade.errors import IllegalSubscriberStateError, ReceiverAlreadyAttachedError
from bolide.facade.receiver import Receiver
from bolide.facade.support import Closing

__all__ = ["Lifecycle", "check_arguments"]


def check_arguments(cluster: object, config: object) -> None:
    """What every subscriber's constructor checks first, the async one too.

    Raises:
        TypeError: ``cluster`` is not a ``Cluster`` or ``config`` not a ``SubscriberConfig``.
    """
    if not isinstance(cluster, Cluster):
        raise TypeError("cluster must be a Cluster")
    if not isinstance(config, SubscriberConfig):
        raise TypeError("config must be a SubscriberConfig")


class Lifecycle(Closing):
    """The base of every subscriber kind: its cluster and config, open until closed.

    Args:
        cluster: Where the streams live.
        config: What to read and how.

    Raises:
        TypeError: ``cluster`` is not a ``Cluster`` or ``config`` not a ``SubscriberConfig``.
    """

    def __init__(self, cluster: Cluster, config: SubscriberConfig) -> None:
        check_arguments(cluster, config)
        self.cluster = cluster
        self.config = config
        self._closed = False
        self._receiver: Receiver | None = None

    @property
    def closed(self) -> bool:
        """True after ``close``."""
        return self._closed

    def _named(self) -> str | None:
        """The stream errors name: the one read, or none for several."""
        stream = self.config.stream
        return stream.name if stream is not None else None

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalSubscriberStateError("subscriber is closed", stream=self._named())

    def _check_no_receiver(self) -> None:
        """Refuse a second receiver while one runs (called under the kind's own lock, so
        that a second caller finds the first one running)."""
        self._check_open()
        if self._receiver is not None and self._receiver.running:
            raise ReceiverAlreadyAttachedError(
                "a receiver is already attached", stream=self._named()
            )

    def _stop_receiver(self) -> None:
        """Close the attached receiver, if any (first thing ``close`` does)."""
        receiver = self._receiver
        if receiver is not None:
            receiver.close()
