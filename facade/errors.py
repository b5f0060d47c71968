"""The exception tree of bolide.

::

    BolideError
    ├── InvalidInitialOffsetSchemeError (also ValueError)
    ├── OffsetLoadError
    ├── OffsetOutOfRangeError
    ├── NotAssignedError
    ├── IllegalSubscriberStateError
    │   └── NotForThisKindError (also AttributeError)
    ├── StreamConfigMismatchError (also ValueError)
    ├── PublishError
    │   └── TransactionError
    │       ├── ProducerFencedError
    │       └── TransactionInDoubtError
    ├── SerializationError (also ValueError)
    │   ├── SchemaIncompatibleError
    │   └── SchemaNotFoundError (also LookupError)
    ├── StoreError
    │   └── SchemaOutOfDateError
    ├── DurableClientError
    │   └── DurableClientBusyError
    ├── BrokerError
    │   └── IncompatibleBrokerError
    ├── AuthorizationError
    ├── AuthenticationError
    ├── FencedInstanceError
    ├── ReceiverAlreadyAttachedError
    ├── ResequencerFullError
    ├── DeadLetterError
    │   ├── DeadLetterNotFoundError (also LookupError)
    │   ├── DeadLetterFilterError (also ValueError)
    │   └── DeadLetterSourceError (also ValueError)
    └── ConnectorNotFoundError (also RuntimeError; in bolide.spark, needs PySpark)

Usage errors subclass ``ValueError``/``TypeError`` too, so callers that already catch those
keep working. Errors carry context (stream, partition, offset, cause) where it exists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bolide.facade.record import Record

__all__ = [
    "AuthenticationError",
    "AuthorizationError",
    "BolideError",
    "BrokerError",
    "ClusterMismatchError",
    "DeadLetterError",
    "DeadLetterFilterError",
    "DeadLetterNotFoundError",
    "DeadLetterSourceError",
    "DurableClientBusyError",
    "DurableClientError",
    "FencedInstanceError",
    "IllegalSubscriberStateError",
    "IncompatibleBrokerError",
    "InvalidInitialOffsetSchemeError",
    "NotAssignedError",
    "NotForThisKindError",
    "OffsetLoadError",
    "OffsetOutOfRangeError",
    "ProducerFencedError",
    "PublishError",
    "ReceiverAlreadyAttachedError",
    "ResequencerFullError",
    "SchemaIncompatibleError",
    "SchemaNotFoundError",
    "SchemaOutOfDateError",
    "SerializationError",
    "StoreError",
    "StreamConfigMismatchError",
    "TopicRecreatedError",
    "TransactionError",
    "TransactionInDoubtError",
]


class BolideError(Exception):
    """Root of every error bolide raises.

    Attributes:
        stream: The stream concerned, if any.
        partition: The partition concerned, if any.
        offset: The offset concerned, if any.
        retriable: True when repeating the operation may succeed.
    """

    retriable: bool = False

    def __init__(
        self,
        message: str,
        *,
        stream: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
        retriable: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.stream = stream
        self.partition = partition
        self.offset = offset
        if retriable is not None:
            self.retriable = retriable


class InvalidInitialOffsetSchemeError(BolideError, ValueError):
    """The initial offset scheme is not allowed for this kind of subscriber."""


class OffsetLoadError(BolideError):
    """A grouped subscriber with scheme NONE found no confirmed offset."""


class OffsetOutOfRangeError(BolideError):
    """A position lies past the end of the stream."""


class NotAssignedError(BolideError):
    """A grouped subscriber confirmed without holding the lease (its partition moved on)."""


class IllegalSubscriberStateError(BolideError):
    """The operation is not allowed for this kind of subscriber (grouped or not)."""


class NotForThisKindError(IllegalSubscriberStateError, AttributeError):
    """This kind of subscriber has no such operation at all (``seek`` on a share group
    member): also an ``AttributeError``, since the attribute does not exist (``hasattr`` is
    false), raised with the reason for code written against another kind."""


class StreamConfigMismatchError(BolideError, ValueError):
    """The stream's existing topic disagrees with its config."""


class PublishError(BolideError):
    """A record could not be published.

    Attributes:
        record: The record that was not published; its offset stays ``None``.
        cause: The underlying Kafka error, if any.
    """

    def __init__(
        self,
        message: str,
        *,
        record: Record | None = None,
        cause: Any = None,
        stream: str | None = None,
        retriable: bool | None = None,
    ) -> None:
        super().__init__(message, stream=stream, retriable=retriable)
        self.record = record
        self.cause = cause


class TransactionError(PublishError):
    """A transaction could not be begun, committed or aborted, or was used out of turn.

    Nothing published in a transaction that failed to commit is seen by ``read_committed``
    subscribers, and the input positions confirmed in it stay where they were; the one
    exception is ``TransactionInDoubtError``, a commit whose outcome the cluster never told.
    """


class TransactionInDoubtError(TransactionError):
    """A commit was sent and the cluster did not say how it ended, though it was asked again
    for the whole transaction timeout: its records and positions may be visible or not.

    Unlike any other ``TransactionError``, the transaction may have committed. The publisher
    is done: close it. The next publisher with the same ``transactional_id`` finishes or
    aborts the transaction when it starts, and ``read_committed`` readers then see that one
    outcome (with ``confirm(sub)``, the input positions moved with the outputs or did not).
    """


class ProducerFencedError(TransactionError):
    """Another publisher with the same ``transactional_id`` started: this one is fenced.

    Kafka lets one producer per transactional id write; the newer one aborted whatever this
    one had open. The fenced publisher cannot publish again: close it.
    """


class SerializationError(BolideError, ValueError):
    """A payload could not be encoded or decoded."""


class SchemaIncompatibleError(SerializationError):
    """A schema registry refused a schema that breaks the subject's compatibility rule.

    Attributes:
        subject: The subject the schema was registered under.
        reasons: Why the new schema and the latest one cannot read each other's data.
    """

    def __init__(self, message: str, *, subject: str, reasons: list[str]) -> None:
        super().__init__(message)
        self.subject = subject
        self.reasons = reasons


class SchemaNotFoundError(SerializationError, LookupError):
    """A schema id or subject is not known to the schema registry."""


class StoreError(BolideError):
    """The history store failed or is not usable."""


class SchemaOutOfDateError(StoreError):
    """The database schema is behind the code; the message names the command to run."""


class ClusterMismatchError(StoreError):
    """A history store that archived a stream from one Kafka cluster is used with another (a
    mirror after a failover, a staging cluster pointed at production's database): offsets of
    one cluster mean nothing on another. The message names both cluster ids and the command
    that adopts the new one (``bolide db adopt STREAM --cluster-id ID``).

    Attributes:
        stored_cluster_id: The cluster the store holds the stream's history of.
        cluster_id: The cluster met now.
    """

    def __init__(
        self, message: str, *, stream: str, stored_cluster_id: str, cluster_id: str
    ) -> None:
        super().__init__(message, stream=stream)
        self.stored_cluster_id = stored_cluster_id
        self.cluster_id = cluster_id


class TopicRecreatedError(BolideError):
    """The stream's Kafka topic was deleted and created again (its topic id changed): what
    was stored of the old topic (history, positions, a durable client's marker) is not used
    for the new one. Reported once to the error handler by whoever meets it; the new topic is
    read by the rule docs/history.md states.

    Attributes:
        old_topic_id: The topic id the store knew.
        topic_id: The topic id Kafka has now.
    """

    def __init__(self, message: str, *, stream: str, old_topic_id: str, topic_id: str) -> None:
        super().__init__(message, stream=stream)
        self.old_topic_id = old_topic_id
        self.topic_id = topic_id


class DurableClientError(BolideError):
    """A durable client operation failed."""


class DurableClientBusyError(DurableClientError):
    """The same durable id is already connected elsewhere."""


class BrokerError(BolideError):
    """The broker could not be started, reached or administered."""


class IncompatibleBrokerError(BrokerError):
    """The broker refuses what this client asks, and will every time: a lease shorter than
    its ``group.min.session.timeout.ms`` (the message names both), or a protocol version it
    does not speak. Change the setting the message names."""


class AuthorizationError(BolideError):
    """The broker refused an operation the user has no ACL for. Retrying cannot help: the
    message names the resource and the ACL to grant.

    Attributes:
        resource_type: ``"topic"``, ``"group"``, ``"transactional_id"`` or ``"cluster"``.
        resource: The topic, group or transactional id (``None`` for the cluster).
        cause: The Kafka error.
        record: The record that was not published, when a publish failed.
    """

    def __init__(
        self,
        message: str,
        *,
        resource_type: str,
        resource: str | None = None,
        cause: Any = None,
        record: Record | None = None,
        stream: str | None = None,
    ) -> None:
        super().__init__(message, stream=stream, retriable=False)
        self.resource_type = resource_type
        self.resource = resource
        self.cause = cause
        self.record = record


class AuthenticationError(BolideError):
    """The broker refused the client's credentials (a SASL user or password, or a TLS
    certificate). Retrying with the same settings cannot help.

    Attributes:
        cause: The Kafka error.
        record: The record that was not published, when a publish failed.
    """

    def __init__(
        self,
        message: str,
        *,
        cause: Any = None,
        record: Record | None = None,
        stream: str | None = None,
    ) -> None:
        super().__init__(message, stream=stream, retriable=False)
        self.cause = cause
        self.record = record


class FencedInstanceError(BolideError):
    """Two live members of the subscriber group use one ``group.instance.id`` (static
    membership). Under the classic protocol the one that joined last takes the partitions and
    the broker refuses the first from now on; under the consumer protocol (KIP-848) the broker
    refuses the newcomer and the first keeps reading. Give every live member an id of its own.

    Attributes:
        group: The subscriber group.
        instance_id: The ``group.instance.id`` both members use.
        cause: The Kafka error.
    """

    def __init__(
        self,
        message: str,
        *,
        group: str | None,
        instance_id: str | None,
        cause: Any = None,
        stream: str | None = None,
    ) -> None:
        super().__init__(message, stream=stream, retriable=False)
        self.group = group
        self.instance_id = instance_id
        self.cause = cause


class ReceiverAlreadyAttachedError(BolideError):
    """A subscriber already has a receiver; at most one may be attached."""


class ResequencerFullError(BolideError):
    """A resequencer holds ``capacity`` records and the offered one would have to wait too.

    The record was not taken: offer it again once timeouts (``tick()``) or completed groups
    have made room, or offer with ``timeout_s`` to wait for room.
    """

    retriable = True


class DeadLetterError(BolideError):
    """A dead-letter stream could not be listed, replayed or purged as asked
    (``bolide.stores.DeadLetters``)."""


class DeadLetterNotFoundError(DeadLetterError, LookupError):
    """No such dead letter (an unknown or purged id), or no such dead-letter stream (neither
    Kafka nor the history store holds it)."""


class DeadLetterFilterError(DeadLetterError, ValueError):
    """A ``where`` filter is not one read-only SQL expression over the dead letters' columns
    (several statements, a subquery, a comment, a change), or the database refused it.
    Nothing was sent."""


class DeadLetterSourceError(DeadLetterError, ValueError):
    """Dead letters without a ``bolide.source`` header were to be replayed to their source:
    name a target stream (``to=``). Nothing was sent.

    Attributes:
        ids: The dead letters that name no source.
    """

    def __init__(self, message: str, *, ids: list[str], stream: str | None = None) -> None:
        super().__init__(message, stream=stream)
        self.ids = ids
