"""Meteor's streaming API on Kafka: publishers, streams, subscriber groups, receivers.

The borrowed terms and their Kafka mapping: docs/concepts.md (glossary). ``__all__`` names
what an application constructs and catches; every error is in ``bolide.facade.errors``, and
the other names imported here stay importable from this package as before.
"""

# First: it decides whether the compiled ``_cy`` modules or their sources are imported.
from bolide.facade import _cext
from bolide.facade._cext import describe as describe_record_path
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
    ClusterMismatchError,
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
    TopicRecreatedError,
    TransactionError,
    TransactionInDoubtError,
)
from bolide.facade.publisher import PublishCallback, Publisher
from bolide.facade.receiver import Receiver, ReceiverHost, ReceiverMetrics
from bolide.facade.receiving.parallel import (
    ParallelReceiver,
    ReceiverOptions,
)
from bolide.facade.receiving.share import ShareReceiver
from bolide.facade.record import Record, RecordBatch
from bolide.facade.resequencer.core import (
    Resequencer,
    ResequencerMetrics,
    publish_sequence,
)
from bolide.facade.resequencer.sequence import sequence_headers
from bolide.facade.retry import Retry, RetryTier
from bolide.facade.schemas.avro import AvroSerde
from bolide.facade.schemas.json_schema import JsonSchemaSerde
from bolide.facade.schemas.protobuf import ProtobufSerde
from bolide.facade.schemas.registry import (
    Compatibility,
    ConfluentSchemaRegistry,
    MemorySchemaRegistry,
    RegisteredSchema,
    Schema,
    SchemaReference,
    SchemaRegistry,
)
from bolide.facade.subscriber import Subscriber, new_subscriber
from bolide.facade.subscribers.share import ShareSubscriber
from bolide.facade.subscribers.streams import StreamsSubscriber

__all__ = [
    "AvroSerde",
    "BolideError",
    "BrokerError",
    "Cluster",
    "ClusterMismatchError",
    "ConfluentSchemaRegistry",
    "EmbeddedBroker",
    "FencedInstanceError",
    "HistoryStore",
    "IllegalSubscriberStateError",
    "InitialOffsetScheme",
    "InvalidInitialOffsetSchemeError",
    "JsonSchemaSerde",
    "MemorySchemaRegistry",
    "NotAssignedError",
    "OffsetLoadError",
    "OffsetOutOfRangeError",
    "ProducerFencedError",
    "ProtobufSerde",
    "PublishCallback",
    "PublishError",
    "Publisher",
    "PublisherConfig",
    "Receiver",
    "ReceiverAlreadyAttachedError",
    "ReceiverHost",
    "ReceiverMetrics",
    "Record",
    "RecordBatch",
    "Resequencer",
    "Retry",
    "RetryTier",
    "Schema",
    "SchemaReference",
    "SerializationError",
    "ShareSubscriber",
    "StoreError",
    "StreamConfig",
    "StreamConfigMismatchError",
    "StreamsSubscriber",
    "Subscriber",
    "SubscriberConfig",
    "TopicRecreatedError",
    "TransactionError",
    "TransactionInDoubtError",
    "describe_record_path",
    "new_subscriber",
    "publish_sequence",
    "sequence_headers",
]
