"""The Kafka side of an outbox relay: a publisher per stream (never creating a stream), the
records rows become, which failures are final, and a transactional relay's marker.

The marker is how a transactional relay knows, after a crash, which of its claimed batches
Kafka committed: every transaction also commits the batch's number as the offset of group
``bolide-outbox.<transactional_id>`` on partition 0 of ``bolide-outbox-markers``
(``send_offsets_to_transaction``), so the number and the records commit together or not at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

from bolide.facade.config import Cluster, PublisherConfig, StreamConfig
from bolide.facade.errors import PublishError
from bolide.facade.kafka import (
    CONSUMER_DEFAULTS,
    admin_client,
    committed_offsets,
    ensure_topic,
    new_client,
    partition_count,
)
from bolide.facade.publisher import Publisher
from bolide.facade.record import Record, trusted_record
from bolide.stores.outbox._claims import Row
from bolide.stores.schema import unpack_headers

__all__ = ["MARKER_TOPIC", "Marker", "Publishers", "final", "record_of"]

#: The topic whose committed offsets (one group per transactional relay) are the markers.
MARKER_TOPIC = "bolide-outbox-markers"

#: Delivery errors that no retry cures: the row itself, or its stream, is wrong.
_FINAL_CODES = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._INVALID_ARG,
    }
)


def final(error: PublishError) -> bool:
    """Whether publishing the row again can never succeed: Kafka refused the record or its
    stream (too large, unknown, forbidden), or the stream does not exist."""
    cause = error.cause
    if isinstance(cause, KafkaError):
        return cause.code() in _FINAL_CODES
    if isinstance(cause, str):  # refused before it reached Kafka: a partition that is not there
        return True
    return cause is None and error.retriable is False


def record_of(row: Row) -> Record:
    """The record a row publishes: its payload, key, headers and asked partition."""
    return trusted_record(
        row.payload, row.key, unpack_headers(row.headers), None, row.partition, None, None
    )


class Publishers:
    """The relay's publishers, one per stream, built on first use.

    Args:
        cluster: Where the streams live.
        producer_config: librdkafka settings for every publisher.
        transactional_id: A transactional relay's id: each stream's publisher gets
            ``<id>.<stream>``; ``None``: idempotent publishers.

    A stream whose topic does not exist is refused with ``PublishError`` (``retriable`` false):
    the outbox holds only a stream's name, not the partitions it should have.
    """

    def __init__(
        self,
        cluster: Cluster,
        producer_config: Mapping[str, Any],
        transactional_id: str | None,
    ) -> None:
        self.cluster = cluster
        self._settings = dict(producer_config)
        self._transactional_id = transactional_id
        self._publishers: dict[str, Publisher] = {}
        self._admin: AdminClient | None = None

    def has(self, stream: str) -> bool:
        """Whether the publisher of ``stream`` is built."""
        return stream in self._publishers

    def get(self, stream: str) -> Publisher:
        """The publisher of ``stream`` (built now if needed; a transactional one fences the
        previous holder of its transactional id).

        Raises:
            PublishError: The stream does not exist, or a transactional publisher could not
                start (``ProducerFencedError`` among them).
        """
        found = self._publishers.get(stream)
        if found is not None:
            return found
        self.require([stream])
        tid = self._transactional_id
        config = PublisherConfig(
            stream=StreamConfig(name=stream),
            producer_config=self._settings,
            transactional_id=None if tid is None else f"{tid}.{stream}",
        )
        publisher = self._publishers[stream] = Publisher(self.cluster, config)
        return publisher

    def require(self, streams: Iterable[str], first_rows: Mapping[str, int] | None = None) -> None:
        """Raise unless every stream in ``streams`` exists.

        Raises:
            PublishError: One does not; the message names it (and its first row).
        """
        for stream in streams:
            if stream in self._publishers:
                continue
            if self._admin is None:
                self._admin = admin_client(self.cluster)
            if partition_count(self._admin, stream) is not None:
                continue
            first = (first_rows or {}).get(stream)
            row = f" (the first is row {first})" if first is not None else ""
            raise PublishError(
                f"stream {stream!r} does not exist on {self.cluster.bootstrap_servers}: its "
                f"outbox rows{row} cannot be published. Create the stream (its partitions are "
                "yours to choose), or delete its rows, then start the relay again",
                stream=stream,
                retriable=False,
            )

    def drop(self, stream: str) -> None:
        """Close the publisher of ``stream`` (an open transaction is aborted); the next
        ``get`` builds a fresh one."""
        publisher = self._publishers.pop(stream, None)
        if publisher is not None:
            publisher.close(timeout_s=5.0)

    def reset(self) -> None:
        """Close every publisher (after a failure: the next round builds fresh ones)."""
        publishers, self._publishers = self._publishers, {}
        for publisher in publishers.values():
            publisher.close(timeout_s=5.0)

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush and close every publisher."""
        publishers, self._publishers = self._publishers, {}
        for publisher in publishers.values():
            publisher.close(timeout_s=timeout_s)


class _BatchNumber:
    """What ``Publisher.confirm`` sends with a transaction: the marker at ``batch``."""

    def __init__(self, batch: int, metadata: Any) -> None:
        self._batch = batch
        self._metadata = metadata

    def transaction_sources(
        self,
    ) -> list[Callable[[], tuple[list[TopicPartition], Any, Callable[[], None]]]]:
        place = [TopicPartition(MARKER_TOPIC, 0, self._batch)]
        return [lambda: (place, self._metadata, _nothing)]


def _nothing() -> None:
    return None


class Marker:
    """A transactional relay's marker: the number of its last batch Kafka committed.

    Raises:
        BrokerError: The marker topic could not be created.
    """

    def __init__(self, cluster: Cluster, transactional_id: str) -> None:
        ensure_topic(cluster, StreamConfig(name=MARKER_TOPIC, partitions=1))
        self.group = f"bolide-outbox.{transactional_id}"
        self._consumer = new_client(
            Consumer,
            cluster.client_config(CONSUMER_DEFAULTS, {"group.id": self.group}),
            "cluster setting",
        )
        # The group never has members: the broker takes commits of generation -1.
        self._metadata = self._consumer.consumer_group_metadata()

    def committed(self) -> int:
        """The last committed batch number (0: none yet); read once no transaction of the
        relay's id is open (a started publisher has aborted or finished it).

        Raises:
            KafkaException: The group's coordinator did not answer.
        """
        found = committed_offsets(self._consumer, [TopicPartition(MARKER_TOPIC, 0)])
        offset = found[0].offset if found else -1
        return max(int(offset), 0)

    def at(self, batch: int) -> _BatchNumber:
        """What ``Publisher.confirm`` takes to commit ``batch`` with the transaction."""
        return _BatchNumber(batch, self._metadata)

    def close(self) -> None:
        """Close the consumer (it never joined the group: nothing to leave)."""
        self._consumer.close()
