"""Meteor's streaming API on Kafka: publishers, streams, subscriber groups, receivers.

The borrowed terms and their Kafka mapping: docs/concepts.md (glossary).
"""

from bolide.facade.avro.registry import (
    Compatibility,
    ConfluentSchemaRegistry,
    MemorySchemaRegistry,
    RegisteredSchema,
    SchemaRegistry,
)
from bolide.facade.avro.serde import AvroSerde
from bolide.facade.broker import EmbeddedBroker
from bolide.facade.config import (
    Cluster,
    HistoryStore,
    InitialOffsetScheme,
    PublisherConfig,
    StreamConfig,
    SubscriberConfig,
)
from bolide.facade.deadletter import Reason
from bolide.facade.errors import (
    AuthenticationError,
    AuthorizationError,
    BolideError,
    BrokerError,
    DeadLetterError,
    DeadLetterFilterError,
    DeadLetterNotFoundError,
    DeadLetterSourceError,
    DurableClientBusyError,
    DurableClientError,
    FencedInstanceError,
    IllegalSubscriberStateError,
    IncompatibleBrokerError,
    InvalidInitialOffsetSchemeError,
    NotAssignedError,
    OffsetLoadError,
    OffsetOutOfRangeError,
    ProducerFencedError,
    PublishError,
    ReceiverAlreadyAttachedError,
    ResequencerFullError,
    SchemaIncompatibleError,
    SchemaNotFoundError,
    SchemaOutOfDateError,
    SerializationError,
    StoreError,
    StreamConfigMismatchError,
    TransactionError,
)
from bolide.facade.parallel import ParallelReceiver, ReceiverOptions
from bolide.facade.publisher import PublishCallback, Publisher
from bolide.facade.receiver import Receiver, ReceiverMetrics
from bolide.facade.record import Record, RecordBatch
from bolide.facade.resequencer.core import Resequencer, ResequencerMetrics, publish_sequence
from bolide.facade.resequencer.sequence import sequence_headers
from bolide.facade.retry import Retry, RetryTier
from bolide.facade.share import ShareSubscriber  # registers itself with Subscriber
from bolide.facade.share_receiver import ShareReceiver
from bolide.facade.streams import StreamsSubscriber  # registers itself with Subscriber
from bolide.facade.subscriber import Subscriber

__all__ = [
    "AuthenticationError",
    "AuthorizationError",
    "AvroSerde",
    "BolideError",
    "BrokerError",
    "Cluster",
    "Compatibility",
    "ConfluentSchemaRegistry",
    "DeadLetterError",
    "DeadLetterFilterError",
    "DeadLetterNotFoundError",
    "DeadLetterSourceError",
    "DurableClientBusyError",
    "DurableClientError",
    "EmbeddedBroker",
    "FencedInstanceError",
    "HistoryStore",
    "IllegalSubscriberStateError",
    "IncompatibleBrokerError",
    "InitialOffsetScheme",
    "InvalidInitialOffsetSchemeError",
    "MemorySchemaRegistry",
    "NotAssignedError",
    "OffsetLoadError",
    "OffsetOutOfRangeError",
    "ParallelReceiver",
    "ProducerFencedError",
    "PublishCallback",
    "PublishError",
    "Publisher",
    "PublisherConfig",
    "Reason",
    "Receiver",
    "ReceiverAlreadyAttachedError",
    "ReceiverMetrics",
    "ReceiverOptions",
    "Record",
    "RecordBatch",
    "RegisteredSchema",
    "Resequencer",
    "ResequencerFullError",
    "ResequencerMetrics",
    "Retry",
    "RetryTier",
    "SchemaIncompatibleError",
    "SchemaNotFoundError",
    "SchemaOutOfDateError",
    "SchemaRegistry",
    "SerializationError",
    "ShareReceiver",
    "ShareSubscriber",
    "StoreError",
    "StreamConfig",
    "StreamConfigMismatchError",
    "StreamsSubscriber",
    "Subscriber",
    "SubscriberConfig",
    "TransactionError",
    "publish_sequence",
    "sequence_headers",
]
