"""The options of ``format("bolide")`` (Spark's Kafka source's names, plus ``bolide.*``) and
where they resolve offsets: ``SourceOptions``. Nothing here imports pyspark.

Offsets have the shape of Spark's Kafka source: ``{"topic": {"0": 23, "1": 40}}``, the next
offset to read per partition.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from confluent_kafka import Consumer

from bolide.facade.config import Cluster, HistoryStore
from bolide.facade.kafka import (
    CONSUMER_DEFAULTS,
    admin_client,
    log_ends,
    log_starts,
    topic_identity,
)
from bolide.facade.ports import Incarnations
from bolide.facade.redaction import redact, redact_url
from bolide.spark._java_settings import librdkafka_settings

__all__ = [
    "DEFAULT_GROUP_ID_PREFIX",
    "EARLIEST",
    "LATEST",
    "Offsets",
    "SourceOptions",
    "cluster_source_options",
    "source_consumer",
]

#: ``{"topic": {"partition": next_offset}}``: JSON-friendly, as Spark checkpoints it.
Offsets = dict[str, dict[str, int]]

EARLIEST, LATEST = -2, -1

#: ``groupIdPrefix``'s default: each consumer's group is ``bolide-spark-<random>``.
DEFAULT_GROUP_ID_PREFIX = "bolide-spark"

_stores: dict[str, HistoryStore] = {}


def _flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value not in {"true", "false"}:
        raise ValueError(f"option {name} must be 'true' or 'false', got {raw!r}")
    return value == "true"


def _positive(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name)
    if raw is None:
        return None
    try:
        value = int(str(raw))
    except ValueError:
        raise ValueError(f"option {name} must be a positive integer, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"option {name} must be a positive integer, got {raw!r}")
    return value


def _spec(options: Mapping[str, str], name: str, default: str, topics: list[str]) -> str:
    raw = str(options.get(name, default)).strip()
    if raw.lower() in {"earliest", "latest"}:
        return raw.lower()
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict) or not all(
        isinstance(t, str) and isinstance(parts, dict) for t, parts in parsed.items()
    ):
        raise ValueError(
            f"option {name} must be 'earliest', 'latest' or JSON like "
            f'{{"{topics[0]}": {{"0": 23}}}}, got {raw!r}'
        )
    for topic, parts in parsed.items():
        if topic not in topics:
            raise ValueError(f"option {name} names topic {topic!r}, which is not subscribed")
        for p, offset in parts.items():
            if not str(p).isdigit() or isinstance(offset, bool) or not isinstance(offset, int):
                raise ValueError(f"option {name}: {topic}[{p}]={offset!r} is not a position")
            if offset < EARLIEST:
                raise ValueError(f"option {name}: {topic}[{p}]={offset} is below -2 (earliest)")
    return raw


def _non_empty(raw: str | None, name: str) -> str | None:
    """``raw`` stripped, ``None`` when absent; an empty value is a ``ValueError`` naming it."""
    if raw is None:
        return None
    value = str(raw).strip()
    if not value:
        raise ValueError(f"option {name} must not be empty")
    return value


def _log_starts(options: Mapping[str, str], name: str) -> dict[str, dict[int, int]]:
    raw = options.get(name)
    if raw is None:
        return {}
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict) or not all(
        isinstance(parts, dict) for parts in parsed.values()
    ):
        raise ValueError(f'option {name} must be JSON like {{"orders": {{"0": 10}}}}, got {raw!r}')
    out: dict[str, dict[int, int]] = {}
    for topic, parts in parsed.items():
        for p, offset in parts.items():
            if not str(p).isdigit() or isinstance(offset, bool) or not isinstance(offset, int):
                raise ValueError(f"option {name}: {topic}[{p}]={offset!r} is not an offset")
            if offset < 0:
                raise ValueError(f"option {name}: {topic}[{p}]={offset} is negative")
        out[topic] = {int(p): offset for p, offset in parts.items()}
    return out


def cluster_source_options(cluster: Cluster) -> dict[str, str]:
    """The ``bolide.*`` options that carry ``cluster``'s own fields to ``format("bolide")``.

    ``kafka_options`` carries the librdkafka settings; these are the rest, which Spark's
    Python workers rebuild the ``Cluster`` from (``SourceOptions.cluster``).
    """
    options: dict[str, str] = {}
    if cluster.fetch_gap_settle_ms:
        options["bolide.fetchGapSettleMs"] = str(cluster.fetch_gap_settle_ms)
    starts = cluster.log_start_overrides
    if starts:
        options["bolide.logStartOverrides"] = json.dumps(
            {t: {str(p): o for p, o in parts.items()} for t, parts in starts.items()},
            separators=(",", ":"),
        )
    return options


@dataclass(frozen=True, repr=False)
class SourceOptions:
    """The options of ``format("bolide")``, by the Kafka source's names, checked once.

    Attributes:
        topics: ``subscribe`` (comma-separated topics).
        kafka: librdkafka settings from every ``kafka.<name>`` option.
        starting: ``startingOffsets``: ``earliest``, ``latest`` (default) or Spark's JSON.
        ending: ``endingOffsets`` (batch only): ``latest`` (default) or Spark's JSON.
        max_offsets_per_trigger: ``maxOffsetsPerTrigger``: most records per micro-batch.
        include_headers: ``includeHeaders``: add the ``headers`` column (default false).
        fail_on_data_loss: ``failOnDataLoss``: fail (default) or warn when a range is gone
            from both Kafka and the history store.
        store_url: ``bolide.store``: SQLAlchemy URL of the history to splice in.
        fetch_gap_settle_ms: ``bolide.fetchGapSettleMs``: the cluster's gap window
            (``Cluster(fetch_gap_settle_ms=...)``); default 0.
        log_start_overrides: ``bolide.logStartOverrides``: the cluster's assumed log starts
            (``Cluster.log_start_overrides``) as JSON ``{"topic": {"0": 10}}``; default none.
        group_id: ``kafka.group.id``: the consumer group of every consumer the source makes,
            as given (the source never joins or commits to it, so concurrent queries may
            share it); default none, see ``group_id_prefix``.
        group_id_prefix: ``groupIdPrefix``: without ``group_id``, each consumer's group is
            ``<prefix>-<random>`` (default ``bolide-spark``), as Spark's Kafka source names
            its own. librdkafka looks a consumer's group coordinator up, which a broker with
            ACLs allows on ``DESCRIBE`` of the group: grant it on this prefix.

    Secrets (``kafka.sasl.password``, the store URL's password...) stay out of ``repr``.
    """

    topics: list[str]
    kafka: dict[str, str]
    starting: str = "latest"
    ending: str = "latest"
    max_offsets_per_trigger: int | None = None
    include_headers: bool = False
    fail_on_data_loss: bool = True
    store_url: str | None = None
    fetch_gap_settle_ms: int = 0
    log_start_overrides: dict[str, dict[int, int]] = field(default_factory=dict)
    group_id: str | None = None
    group_id_prefix: str = DEFAULT_GROUP_ID_PREFIX

    @classmethod
    def parse(cls, options: Mapping[str, str], *, batch: bool) -> SourceOptions:
        """Check ``options`` (names are case-insensitive, as Spark's are).

        Raises:
            ValueError: A missing or malformed option, named in the message.
        """
        lowered = {str(k).lower(): str(v) for k, v in options.items()}
        for unsupported in ("assign", "subscribepattern"):
            if unsupported in lowered:
                raise ValueError(
                    f"option {unsupported} is not supported by format('bolide'); use subscribe"
                )
        kafka = {k[len("kafka.") :]: v for k, v in lowered.items() if k.startswith("kafka.")}
        kafka = librdkafka_settings(kafka)  # the Java client's names, as Spark's source has them
        group_id = _non_empty(kafka.pop("group.id", None), "kafka.group.id")
        prefix = _non_empty(lowered.get("groupidprefix"), "groupIdPrefix")
        if not kafka.get("bootstrap.servers"):
            raise ValueError("option kafka.bootstrap.servers is required (host:port,...)")
        topics = [t.strip() for t in lowered.get("subscribe", "").split(",") if t.strip()]
        if not topics:
            raise ValueError("option subscribe is required: the topic (stream) to read")
        starting = _spec(lowered, "startingoffsets", "earliest" if batch else "latest", topics)
        if batch and starting == "latest":
            raise ValueError("option startingOffsets='latest' is not valid for a batch read")
        ending = _spec(lowered, "endingoffsets", "latest", topics)
        if ending == "earliest":
            raise ValueError("option endingOffsets='earliest' is not valid")
        parsed = cls(
            topics=topics,
            kafka=kafka,
            starting=starting,
            ending=ending,
            max_offsets_per_trigger=_positive(lowered, "maxoffsetspertrigger"),
            include_headers=_flag(lowered, "includeheaders", False),
            fail_on_data_loss=_flag(lowered, "failondataloss", True),
            store_url=lowered.get("bolide.store") or None,
            fetch_gap_settle_ms=_positive(lowered, "bolide.fetchgapsettlems") or 0,
            log_start_overrides=_log_starts(lowered, "bolide.logstartoverrides"),
            group_id=group_id,
            group_id_prefix=prefix or DEFAULT_GROUP_ID_PREFIX,
        )
        try:
            parsed.cluster()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"options do not make a Cluster: {exc}") from None
        return parsed

    def __repr__(self) -> str:
        shown = {item.name: getattr(self, item.name) for item in fields(self)}
        shown["kafka"] = redact(self.kafka)
        if self.store_url is not None:
            shown["store_url"] = redact_url(self.store_url)
        return f"SourceOptions({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    def cluster(self) -> Cluster:
        """The ``Cluster`` these options name."""
        settings: dict[str, Any] = dict(self.kafka)
        bootstrap = settings.pop("bootstrap.servers")
        return Cluster(
            bootstrap,
            fetch_gap_settle_ms=self.fetch_gap_settle_ms,
            log_start_overrides=self.log_start_overrides,
            **settings,
        )

    def consumer_group(self) -> str:
        """The group of a new consumer: ``group_id``, else ``<group_id_prefix>-<random>``."""
        return self.group_id or f"{self.group_id_prefix}-{uuid.uuid4().hex}"

    def consumer(self, group: str | None = None) -> Consumer:
        """A consumer for lookups and reads, in ``group`` (default ``consumer_group()``),
        which it never joins or commits to."""
        return source_consumer(self.cluster(), group or self.consumer_group())

    def group_acl(self) -> str:
        """The group ACL the source's consumers need, as an admin grants it."""
        if self.group_id is not None:
            return f"DESCRIBE on group {self.group_id!r} (kafka.group.id)"
        return (
            f"DESCRIBE on groups prefixed {self.group_id_prefix + '-'!r} (PREFIXED; the "
            "prefix is the groupIdPrefix option, or name one group with kafka.group.id)"
        )

    def store(self) -> HistoryStore | None:
        """The history store (one per URL and process), or ``None``."""
        if self.store_url is None:
            return None
        store = _stores.get(self.store_url)
        if store is None:
            from bolide.stores import SqlStore

            store = _stores[self.store_url] = SqlStore(self.store_url)
        return store

    # -- planning (runs in Spark's planner process) ----------------------------------------

    def partitions(self) -> dict[str, list[int]]:
        """The current partitions of each topic (a missing topic has none yet)."""
        meta = admin_client(self.cluster()).list_topics(timeout=10)
        found: dict[str, list[int]] = {}
        for topic in self.topics:
            info = meta.topics.get(topic)
            ok = info is not None and info.error is None
            found[topic] = sorted(info.partitions) if ok and info is not None else []
        return found

    def earliest(self, topic: str, parts: list[int]) -> dict[int, int]:
        """First available offset per partition: the store's first when it reaches lower."""
        if not parts:
            return {}
        consumer = self.consumer()
        try:
            starts = log_starts(consumer, topic, parts, cluster=self.cluster())
        finally:
            consumer.close()
        store = self.store()
        if store is not None:
            key = self.stored_as(topic)
            which = {} if key is None else {"stored_as": key}
            for p in parts:
                first = store.smallest_offset(topic, p, **which)
                if first is not None and first < starts[p]:
                    starts[p] = first
        return starts

    def stored_as(self, topic: str) -> str | None:
        """The key of ``topic``'s current incarnation in the history store, recorded there
        first (a topic deleted and created again has none of the old one's history);
        ``None`` without a store, or a topic id to tell incarnations apart."""
        store = self.store()
        if not isinstance(store, Incarnations):
            return None
        identity = topic_identity(self.cluster(), topic)
        if identity is None:
            return None
        return store.identify(topic, identity)[0].stored_as

    def latest(self, topic: str, parts: list[int]) -> dict[int, int]:
        """The true end (next offset to be written) per partition."""
        if not parts:
            return {}
        consumer = self.consumer()
        try:
            return log_ends(self.cluster(), topic, parts, consumer=consumer)
        finally:
            consumer.close()

    def resolve(self, spec: str, omitted: int = EARLIEST) -> Offsets:
        """Offsets for ``earliest``/``latest``/JSON; partitions a JSON omits get ``omitted``."""
        explicit: dict[str, dict[str, int]] = (
            {} if spec in {"earliest", "latest"} else json.loads(spec)
        )
        out: Offsets = {}
        for topic, parts in self.partitions().items():
            given = {int(p): int(o) for p, o in explicit.get(topic, {}).items()}
            default = {"earliest": EARLIEST, "latest": LATEST}.get(spec, omitted)
            wanted = {p: given.get(p, default) for p in parts}
            early = self.earliest(topic, [p for p, o in wanted.items() if o == EARLIEST])
            late = self.latest(topic, [p for p, o in wanted.items() if o == LATEST])
            resolved = {p: early.get(p, late.get(p, o)) for p, o in wanted.items()}
            out[topic] = {str(p): resolved[p] for p in parts}
        return out


def source_consumer(cluster: Cluster, group_id: str) -> Consumer:
    """A consumer for the source's lookups and reads, in ``group_id``: it assigns partitions
    itself and never commits, so it never joins the group (``SourceOptions.consumer``)."""
    return Consumer(
        cluster.client_config(
            CONSUMER_DEFAULTS,
            {
                "group.id": group_id,
                "enable.partition.eof": True,
                "auto.offset.reset": "error",
            },
        )
    )
