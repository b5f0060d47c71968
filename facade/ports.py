"""The seams between the core facade and the packages that plug into it.

The core (publisher, subscriber, durable clients, the Avro serde) depends only on these
interfaces; ``bolide.stores`` implements them (``SqlStore``, ``DurableRegistry``,
``SqlSchemaRegistry``), and an application may bring its own. Value types that cross a seam
(a registry row, a registered schema) live here too, so neither side imports the other.
``PositionStore`` keeps a subscriber's positions in the application's own database
(``bolide.stores.SqlPositions``), written in the application's transaction.

Where the core is handed a database URL or a store instead of an implementation, it builds
one through ``open_plugin``: packages register their implementations as entry points
(``bolide.schema_registries``, ``bolide.durable_registries``), as SQLAlchemy finds dialects.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from bolide.facade.support import Closing

if TYPE_CHECKING:
    from bolide.facade.record import Record, RecordBatch

__all__ = [
    "SCHEMA_TYPES",
    "ArchiveStore",
    "Claim",
    "ClaimState",
    "Closing",
    "Compatibility",
    "DurableClient",
    "DurableRegistry",
    "FramedSerde",
    "HistoryStore",
    "Incarnation",
    "Incarnations",
    "Polled",
    "PositionStore",
    "PublishCallback",
    "PublisherLike",
    "RecordDecoder",
    "RegisteredSchema",
    "Schema",
    "SchemaReference",
    "SchemaRegistry",
    "Serde",
    "SubscriberLike",
    "TopicIdentity",
    "TypedSchemaRegistry",
    "TypedSerde",
    "decode_with",
    "now_ms",
    "open_plugin",
]


# -- history ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TopicIdentity:
    """Which Kafka topic a stream's name stands for now (``bolide.facade.kafka.identity``).

    Attributes:
        topic_id: Its Kafka topic id (KIP-516; base64, as Kafka's tools print it).
        cluster_id: Its cluster's id.
    """

    topic_id: str
    cluster_id: str


@dataclass(frozen=True)
class Incarnation:
    """One incarnation of a stream's topic, as a history store knows it
    (``bolide.stores.incarnations``).

    Attributes:
        stream: The stream's (the topic's) name.
        topic_id: Its Kafka topic id.
        cluster_id: The id of the cluster it lives on.
        stored_as: The key its rows carry in the ``stream`` columns of bolide's tables.
        first_seen_ms: When the store first met it (Unix milliseconds).
        retired_ms: When the store found the topic replaced by another (``None``: current).
    """

    stream: str
    topic_id: str
    cluster_id: str
    stored_as: str
    first_seen_ms: int
    retired_ms: int | None

    @property
    def current(self) -> bool:
        """True for the incarnation the stream's name stands for now."""
        return self.retired_ms is None


@runtime_checkable
class HistoryStore(Protocol):
    """Where a stream's records live once Kafka no longer holds them, per stream and partition.

    Hazelcast calls this contract a RingbufferStore: the ring (here, the Kafka log) is backed by
    a store that keeps what the ring has dropped. ``SqlStore`` implements it.
    """

    def store_all(self, stream: str, records: Sequence[Record]) -> int:
        """Store records (idempotent on stream, partition, offset); return rows inserted."""
        ...

    def load(self, stream: str, partition: int, offset: int) -> Record | None:
        """Return one record, or ``None``."""
        ...

    def read(
        self,
        stream: str,
        partition: int,
        from_offset: int,
        limit: int,
        *,
        stored_as: str | None = None,
    ) -> list[Record]:
        """Return up to ``limit`` records at or after ``from_offset``, in offset order, of the
        stream's current topic incarnation (or of the one ``stored_as`` names)."""
        ...

    def largest_offset(
        self, stream: str, partition: int, *, stored_as: str | None = None
    ) -> int | None:
        """Return the largest stored offset, or ``None`` when nothing is stored."""
        ...

    def smallest_offset(
        self, stream: str, partition: int, *, stored_as: str | None = None
    ) -> int | None:
        """Return the smallest stored offset, or ``None`` when nothing is stored."""
        ...


@runtime_checkable
class Incarnations(Protocol):
    """A store that keeps what it holds of a topic per incarnation (``SqlStore``,
    ``SqlPositions``, ``SqlDurableRegistry``: docs/history.md). A store without it keeps
    rows by stream name only, as before topic identity."""

    def identify(
        self, stream: str, identity: TopicIdentity
    ) -> tuple[Incarnation, Incarnation | None]:
        """Record that ``stream`` is the topic ``identity`` now: its current incarnation (its
        rows' key, ``stored_as``), and the one this call retired (the topic was deleted and
        created again since the store last met it), else ``None``."""
        ...


@runtime_checkable
class ArchiveStore(HistoryStore, Incarnations, Protocol):
    """A history store the archiver can write in bulk, with typed tables beside the raw one."""

    def check_schema(self) -> None:
        """Raise ``SchemaOutOfDateError`` unless the store's schema is current."""
        ...

    def store_batches(
        self,
        batches: Mapping[str, Sequence[Record]],
        *,
        also: Any = None,
        stored_as: Mapping[str, str] | None = None,
    ) -> int:
        """Store several streams' records in one transaction, each under its topic
        incarnation's key (``stored_as``; the current one by default); ``also(connection)``
        runs in it (the typed tables). Returns the rows inserted."""
        ...

    def same_store(self, other: object) -> bool:
        """True when ``other`` writes to the same place (so one archive serves both)."""
        ...


# -- serialization ----------------------------------------------------------------------------


@runtime_checkable
class Serde(Protocol):
    """Turns objects into record payloads and back (``AvroSerde`` is one)."""

    def encode(self, obj: Any, *, stream: str) -> bytes:
        """The payload for ``obj``; raises ``SerializationError`` when it cannot."""
        ...

    def decode(self, data: bytes, *, stream: str, partition: int | None, offset: int | None) -> Any:
        """The object in ``data``; raises ``SerializationError`` naming the record's place."""
        ...


@runtime_checkable
class TypedSerde(Serde, Protocol):
    """A serde whose payloads name their schema, so the archive can keep a typed table of them
    (``AvroSerde``, ``ProtobufSerde`` and ``JsonSchemaSerde`` are: Confluent's framing carries
    the schema id)."""

    def payload_schema_id(self, data: bytes, headers: Any = None, stream: str | None = None) -> int:
        """The schema id ``data`` (with its record's ``headers``, of ``stream``) was written
        with; ``SerializationError`` if it names none."""
        ...

    def value_schema(self, schema_id: int) -> Any:
        """The Avro-shaped schema the ``plain`` values decoded from ``schema_id`` follow."""
        ...

    def plain(self, value: Any) -> Any:
        """A decoded value as dicts, lists and scalars (what the typed archive stores)."""
        ...


@runtime_checkable
class FramedSerde(TypedSerde, Protocol):
    """A serde that may carry the schema id in a header (Confluent's header framing): a
    publisher asks it for whole records, and a subscriber gives it each record's headers."""

    def encode_record(self, obj: Any, *, stream: str) -> Record:
        """The record for ``obj``: its payload, and the schema id header if framed so."""
        ...

    def decode(
        self,
        data: bytes,
        *,
        stream: str,
        partition: int | None,
        offset: int | None,
        headers: Any = None,
    ) -> Any:
        """The object in ``data``, its schema found in ``headers`` first."""
        ...


@runtime_checkable
class RecordDecoder(Protocol):
    """Decodes a whole record, not just its payload: Confluent's header framing puts the
    schema id in a header (bolide's schema serdes and ``SchemaReader`` are such decoders)."""

    def decode_record(self, record: Record, stream: str) -> Any:
        """``record``'s value; ``SerializationError`` naming its place when it cannot."""
        ...


def decode_with(serde: Serde) -> Callable[[Record, str], Any]:
    """How to decode a record's payload with ``serde``, chosen once: the whole record to a
    ``RecordDecoder`` (its schema id may be in a header), the payload to any other serde.

    The one place a record meets its serde: a subscriber's decoder, the typed archive and
    ``bolide tail`` call what this returns as ``decode(record, stream)``.
    """
    if isinstance(serde, RecordDecoder):
        return serde.decode_record

    def plain(record: Record, stream: str) -> Any:
        return serde.decode(
            record.data,  # type: ignore[arg-type]
            stream=stream,
            partition=record.partition,
            offset=record.offset,
        )

    return plain


class Compatibility(enum.Enum):
    """What a new schema version must be able to do (Confluent's levels and names).

    BACKWARD: the new schema reads data written with the latest one (consumers upgrade first).
    FORWARD: the latest schema reads data written with the new one (producers upgrade first).
    FULL: both. NONE: no check. ``*_TRANSITIVE``: against every version, not only the latest.
    """

    BACKWARD = "BACKWARD"
    BACKWARD_TRANSITIVE = "BACKWARD_TRANSITIVE"
    FORWARD = "FORWARD"
    FORWARD_TRANSITIVE = "FORWARD_TRANSITIVE"
    FULL = "FULL"
    FULL_TRANSITIVE = "FULL_TRANSITIVE"
    NONE = "NONE"

    @classmethod
    def of(cls, level: Compatibility | str) -> Compatibility:
        """Accept a member or its name (any case).

        Raises:
            ValueError: ``level`` names no compatibility level.
        """
        if isinstance(level, Compatibility):
            return level
        try:
            return cls(str(level).upper())
        except ValueError:
            names = ", ".join(m.value for m in cls)
            raise ValueError(f"compatibility level {level!r} is not one of {names}") from None


#: The schema formats a registry knows, by Confluent's ``schemaType`` names.
SCHEMA_TYPES = ("AVRO", "PROTOBUF", "JSON")


@dataclass(frozen=True)
class SchemaReference:
    """A schema another one uses: ``name`` as the referring schema writes it (a ``.proto`` file
    name, a JSON Schema ``$ref``, an Avro full name), found as ``version`` of ``subject``."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True)
class Schema:
    """A schema as a registry keeps it: its text, its format and the schemas it references.

    ``text`` is Avro or JSON Schema JSON, or for Protobuf the base64 of a serialized
    ``FileDescriptorProto`` (what confluent-kafka's ``ProtobufSerializer`` registers).
    """

    text: str
    schema_type: str = "AVRO"
    references: tuple[SchemaReference, ...] = ()


@dataclass(frozen=True)
class RegisteredSchema:
    """One version of a subject."""

    subject: str
    version: int
    schema_id: int
    schema: str
    schema_type: str = "AVRO"
    references: tuple[SchemaReference, ...] = ()

    def as_schema(self) -> Schema:
        """The schema this version holds."""
        return Schema(self.schema, self.schema_type, self.references)


@runtime_checkable
class SchemaRegistry(Protocol):
    """What ``AvroSerde`` needs from a registry."""

    def register(self, subject: str, schema: Any) -> int:
        """Register ``schema`` under ``subject`` (idempotent) and return its global id.

        Raises:
            SchemaIncompatibleError: The schema breaks the subject's compatibility level.
        """
        ...

    def get_schema(self, schema_id: int) -> str:
        """Return the schema text of ``schema_id``.

        Raises:
            SchemaNotFoundError: No schema has this id.
        """
        ...

    def latest(self, subject: str) -> RegisteredSchema | None:
        """Return the subject's latest version, or ``None`` when it has none."""
        ...

    def compatibility(self, subject: str) -> Compatibility:
        """Return the subject's compatibility level (BACKWARD unless set)."""
        ...

    def set_compatibility(self, subject: str, level: Compatibility | str) -> None:
        """Set the subject's compatibility level."""
        ...


@runtime_checkable
class TypedSchemaRegistry(SchemaRegistry, Protocol):
    """A registry of every format (``Schema``), with references and schema GUIDs: what
    ``ProtobufSerde`` and ``JsonSchemaSerde`` need, and the header framing of any serde.
    ``register`` takes a ``Schema`` as well as Avro text."""

    def schema(self, schema_id: int) -> Schema:
        """The schema of ``schema_id`` with its format and references.

        Raises:
            SchemaNotFoundError: No schema has this id.
        """
        ...

    def version(self, subject: str, version: int) -> RegisteredSchema:
        """One version of a subject (how references are resolved).

        Raises:
            SchemaNotFoundError: The subject has no such version.
        """
        ...

    def guid(self, schema_id: int) -> str:
        """The GUID of ``schema_id`` (what the header framing carries)."""
        ...

    def id_of_guid(self, guid: str, subject: str | None = None) -> int:
        """The schema id of a GUID (``subject``: where the payload's schema is registered, for
        registries that look GUIDs up per subject, as Confluent's API does).

        Raises:
            SchemaNotFoundError: No schema has this GUID.
        """
        ...


# -- durable clients --------------------------------------------------------------------------

ClaimState = Literal["new", "resumed", "expired"]


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds (the durable registry's clock)."""
    return int(time.time() * 1000)


@dataclass(frozen=True)
class DurableClient:
    """One durable registry row.

    Attributes:
        durable_id: The client's durable id.
        group_id: Its Kafka consumer group (where its position lives).
        streams: The streams it has read.
        timeout_s: How long it may stay away before it is forgotten.
        created_ms: When it first connected.
        last_seen_ms: When it was last seen connected (renewed while connected).
        connected: It holds a claim whose lease had not lapsed when the row was read.
        owner: The claim's owner token (``None`` when released).
        lease_until_ms: When the claim lapses unless renewed.
        connections: How many times it has connected.
        marker_ms: When the latest marker was taken.
        markers: The latest marker: stream -> partition -> end offset.
    """

    durable_id: str
    group_id: str
    streams: tuple[str, ...]
    timeout_s: float
    created_ms: int
    last_seen_ms: int
    connected: bool
    owner: str | None
    lease_until_ms: int | None
    connections: int
    marker_ms: int | None
    markers: dict[str, dict[int, int]] = field(default_factory=dict)

    def away_s(self, at_ms: int | None = None) -> float:
        """Seconds since the client was last seen (0 while it is connected)."""
        if self.connected:
            return 0.0
        return max(0, (at_ms if at_ms is not None else now_ms()) - self.last_seen_ms) / 1000

    def expired(self, at_ms: int | None = None) -> bool:
        """True when the client is not connected and has been away past its timeout."""
        return not self.connected and self.away_s(at_ms) > self.timeout_s


@dataclass(frozen=True)
class Claim:
    """The outcome of ``DurableRegistry.register``: the row now held and what it was before.

    Attributes:
        client: The registry row after the claim.
        state: ``"new"`` (never seen or unregistered), ``"resumed"`` (its queue was kept) or
            ``"expired"`` (away past its timeout: its queue must be dropped).
        previous: The row before the claim, ``None`` for a new client.
    """

    client: DurableClient
    state: ClaimState
    previous: DurableClient | None


@runtime_checkable
class DurableRegistry(Protocol):
    """Who is durable, who is connected, and when each was last seen (GemFire's server side).

    A durable client (GemFire's term: a subscriber whose queue outlives its connection) claims
    its id here with a lease while connected; ``bolide.stores.DurableRegistry`` keeps the rows
    in SQL.
    """

    def register(
        self,
        durable_id: str,
        *,
        group_id: str,
        stream: str,
        timeout_s: float,
        owner: str,
        lease_ms: int,
    ) -> Claim:
        """Claim ``durable_id`` for ``owner``; raises ``DurableClientBusyError`` when held."""
        ...

    def touch(self, durable_id: str, owner: str, lease_ms: int) -> bool:
        """Renew the claim and last-seen time; ``False`` when ``owner`` no longer holds it."""
        ...

    def mark(self, durable_id: str, stream: str, marker: Mapping[int, int]) -> None:
        """Store the marker of the latest connect: each partition's end, where replay stops
        (``stream``: the key of the topic incarnation it was taken on, ``identify``)."""
        ...

    def release(self, durable_id: str, owner: str) -> bool:
        """Give up the claim, keeping the client (its queue)."""
        ...

    def unregister(self, durable_id: str, owner: str | None = None) -> bool:
        """Forget the client."""
        ...

    def expire(self, at_ms: int | None = None) -> list[DurableClient]:
        """Forget every client away past its timeout; return them."""
        ...

    def close(self) -> None:
        """Release what the registry holds."""
        ...


# -- positions in the application's database ---------------------------------------------------


@runtime_checkable
class PositionStore(Protocol):
    """Where a subscriber keeps its positions so that they commit with the application's own
    writes: the sink pattern of Kafka Connect and Spark checkpoints. ``SqlPositions`` in
    ``bolide.stores`` keeps them in SQL.

    A position is the next offset to read, keyed by ``(group, stream, partition)``. Each row
    has an owner: the subscriber that took the partition last claims it before reading its
    position, and only the claimant's writes land, so a member that lost its partition fails
    instead of writing. A write never moves a position
    back.

    Attributes:
        group: The key the positions are kept under; ``None`` takes the subscriber's group
            (an ungrouped subscriber must name one).
    """

    group: str | None

    def load(self, group: str, stream: str, partitions: Sequence[int]) -> dict[int, int]:
        """The stored positions of ``partitions``, claiming nothing; a partition without one
        is left out."""
        ...

    def claim(
        self, group: str, stream: str, partitions: Sequence[int], owner: str
    ) -> dict[int, int]:
        """Make ``owner`` the only writer of ``partitions``, then read their positions (as
        ``load``)."""
        ...

    def save(
        self,
        conn: Any,
        group: str,
        stream: str,
        positions: Mapping[int, int],
        *,
        owners: Mapping[int, str],
        on_commit: Callable[[], None],
        finished: Mapping[int, Collection[int]] | None = None,
    ) -> None:
        """Write ``positions`` (each only forward) through ``conn``, the application's open
        transaction, with the records ``finished`` above each (added to those stored);
        ``on_commit`` runs once that transaction has committed.

        Raises:
            NotAssignedError: A partition is claimed by another owner than ``owners`` names:
                the application's transaction must roll back.
        """
        ...

    def finished(self, group: str, stream: str, partitions: Sequence[int]) -> dict[int, str]:
        """The finished sets written with the positions of ``partitions`` (encoded); a
        partition without one is left out."""
        ...

    def close(self) -> None:
        """Release what the store holds."""
        ...


# -- plugins ----------------------------------------------------------------------------------

#: Entry-point groups: implementations built from a URL or a store object.
SCHEMA_REGISTRIES = "bolide.schema_registries"
DURABLE_REGISTRIES = "bolide.durable_registries"


def open_plugin(group: str, source: object) -> Any:
    """Build ``source`` (a URL, or a store object) into the first implementation registered in
    the entry-point ``group`` that accepts it.

    Raises:
        TypeError: No installed implementation accepts ``source``.
    """
    refused = []
    for entry in sorted(entry_points(group=group), key=lambda e: e.name):
        factory = entry.load()
        try:
            return factory(source)
        except (TypeError, ValueError) as exc:
            refused.append(f"{entry.name}: {exc}")
    detail = "; ".join(refused) or "none is installed (pip install bolide)"
    raise TypeError(f"no {group} implementation accepts a {type(source).__name__}: {detail}")


# -- the sync clients as the asyncio API drives them -------------------------------------------

#: ``callback(offset, error)``: a record's delivery report (the offset, or the error).
PublishCallback = Callable[[int | None, BaseException | None], None]


@dataclass(slots=True)
class Polled:
    """What one poll step handed over, kept so that it can be given back.

    Attributes:
        batch: The records returned; ``None`` when the step raised, or found the subscriber
            closed by another caller while it waited.
        error: What the step raised, or ``None``.
        last_read: The last offset read per partition as it was before the step.
    """

    batch: RecordBatch | None
    error: Exception | None
    last_read: dict[int, int]


class SubscriberLike(Protocol):
    """What ``bolide.facade.aio`` needs of a subscriber beyond its public reading API: a poll
    in steps that never wait (the event loop awaits between them), undoing a step whose
    outcome never reached the application, and confirming what an iteration handed out.
    ``Subscriber`` (one stream) implements it; the other kinds have no asyncio API."""

    def poll_step(self, *, first: bool) -> Polled:
        """One step of a poll that never waits; closed before the ``first`` step, it raises."""
        ...

    def give_back(self, polled: Polled) -> None:
        """Undo a ``poll_step`` whose outcome never reached the application."""
        ...

    def confirm_read(
        self,
        offset: int | None,
        partition: int | None,
        *,
        conn: Any,
        read: Mapping[int, int] | None,
    ) -> None:
        """``confirm`` against ``read``, the last record handed out per partition."""
        ...


class PublisherLike(Protocol):
    """What ``bolide.facade.aio`` needs of a publisher: the record a publish would send, and
    handing it to the producer without waiting for room."""

    def to_record(self, item: Record | Any) -> Record:
        """The record ``publish_async(item)`` would send (its serde applied)."""
        ...

    def offer(self, rec: Record, on_delivery: PublishCallback) -> bool:
        """``produce`` without waiting: ``False`` (nothing accepted) when the queue is full."""
        ...
