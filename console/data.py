"""What the console's pages and API show, gathered from the cluster and the history store
through the library (``bolide.facade.ops``, ``bolide.stores``); no HTML or HTTP here.

A search answers from the archive's indexes first and reads Kafka only where the archive
holds nothing (``search.py``).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from bolide.console.search import Found, search
from bolide.console.settings import ConsoleSettings
from bolide.facade.errors import BolideError, SerializationError
from bolide.facade.ops.inventory import TopicInfo, describe_groups, list_groups, list_topics
from bolide.facade.ops.lag import DurableBacklog, LagReport, durable_backlogs, lag_report
from bolide.facade.ops.text import render_bytes
from bolide.facade.record import Record
from bolide.facade.schemas.reader import SchemaReader
from bolide.stores import DeadLetter, DeadLetters, QueryResult, Search, SqlStore, run_query
from bolide.stores.durable_registry import SqlDurableRegistry

__all__ = ["Console", "LagSampler", "NoStoreError", "record_row"]


class NoStoreError(BolideError):
    """The console runs without a history store (``--db``), and this needs one."""


def record_row(record: Record, decoded: Any = None) -> dict[str, Any]:
    """A record as JSON-ready text (keys, payloads and header values as ``render_bytes``),
    with its value ``decoded`` (any schema format) when it was."""
    return {
        "partition": record.partition,
        "offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
        "key": None if record.key is None else render_bytes(record.key),
        "value": None if record.data is None else render_bytes(record.data),
        "decoded": None if decoded is None else json.loads(json.dumps(decoded, default=str)),
        "headers": [[name, render_bytes(value)] for name, value in record.headers],
    }


def group_lags(report: LagReport) -> dict[str, int]:
    """Each group's total lag in ``report``."""
    totals: dict[str, int] = collections.Counter()
    for row in report.partitions:
        totals[row.group] += row.lag
    return totals


@dataclass
class LagSampler:
    """Total lag per group, sampled every ``every_s`` while the console runs (the charts)."""

    settings: ConsoleSettings
    keep: int = 720  # samples per group (an hour at 5 s)
    samples: dict[str, collections.deque[tuple[int, int]]] = field(default_factory=dict)
    error: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bolide-console-lag", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def sample(self) -> None:
        """One sample of every group's total lag."""
        report = lag_report(self.settings.cluster)
        totals = group_lags(report)
        with self._lock:
            for group, lag in totals.items():
                series = self.samples.setdefault(group, collections.deque(maxlen=self.keep))
                series.append((report.taken_ms, lag))

    def series(self, group: str) -> list[tuple[int, int]]:
        with self._lock:
            return list(self.samples.get(group, ()))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
                self.error = None
            except BolideError as exc:  # shown on the group pages; sampled again
                self.error = str(exc)
            self._stop.wait(self.settings.sample_s)


class Console:
    """The console's data: one per running console (the store opened once)."""

    def __init__(self, settings: ConsoleSettings) -> None:
        self.settings = settings
        self.store = SqlStore(settings.db) if settings.db else None
        self.lags = LagSampler(settings)
        # Decodes Confluent-framed values of any format through the store's schema registry.
        self._reader = SchemaReader(self.store) if self.store else None

    def close(self) -> None:
        self.lags.stop()
        if self.store is not None:
            self.store.close()

    def need_store(self) -> SqlStore:
        if self.store is None:
            raise NoStoreError("this console runs without a history store: start it with --db")
        return self.store

    # -- the cluster ------------------------------------------------------------------------

    def streams(self) -> list[dict[str, Any]]:
        """Every stream: partitions, records in Kafka, and (with a store) archive coverage."""
        topics = list_topics(self.settings.cluster, settings=False)
        archive: dict[tuple[str, int], tuple[int | None, int]] = {}
        if self.store is not None:
            archived = set(self.store.streams()) & {t.name for t in topics}
            if archived:
                report = lag_report(
                    self.settings.cluster, streams=archived, store=self.store, groups=[]
                )
                archive = {(a.stream, a.partition): (a.archived, a.lag) for a in report.archive}
        return [_stream_row(t, archive) for t in topics if not t.name.startswith("__")]

    def stream(self, name: str) -> dict[str, Any] | None:
        """One stream's partitions: log start, log end, archived frontier and lag; a stream
        Kafka no longer has (or does not show this user) but the archive holds has only its
        archived partitions; ``None`` when neither knows it."""
        rows = [s for s in self.streams() if s["stream"] == name]
        if rows:
            return rows[0]
        if self.store is None or name not in self.store.streams():
            return None
        parts = [
            {"partition": p, "log_start": None, "log_end": None, "archive_lag": None,
             "archived": self.store.largest_offset(name, p)}
            for p in self.store.partitions(name)
        ]  # fmt: skip
        return {"stream": name, "partitions": parts, "records": 0, "end": 0,
                "archived": True, "archive_lag": None}  # fmt: skip

    def groups(self) -> dict[str, list[dict[str, Any]]]:
        """Consumer groups (state, members, total lag) and share groups (backlog), from one
        snapshot."""
        report = lag_report(self.settings.cluster)
        totals = group_lags(report)
        backlogs: dict[str, int] = collections.Counter()
        for queue in report.share:
            backlogs[queue.group] += queue.backlog
        groups = [
            {
                "group": g.group_id,
                "state": g.state,
                "protocol": g.protocol,
                "members": len(g.members),
                "lag": totals.get(g.group_id, 0),
                "streams": list(g.streams),
            }
            for g in report.groups
        ]
        shares = [{"group": name, "backlog": n} for name, n in sorted(backlogs.items())]
        return {"groups": groups, "share_groups": shares}

    def group(self, group: str) -> dict[str, Any] | None:
        """One group: members and their assignment, and per partition its lag."""
        if group not in list_groups(self.settings.cluster):
            return None
        report: LagReport = lag_report(self.settings.cluster, groups=[group])
        info = describe_groups(self.settings.cluster, [group])[0]
        partitions = [
            {
                "stream": p.stream,
                "partition": p.partition,
                "committed": p.committed,
                "end": p.log_end,
                "lag": p.lag,
                "member": p.member_id,
            }
            for p in report.partitions
        ]
        return {
            "group": group,
            "state": info.state,
            "assignor": info.assignor,
            "coordinator": info.coordinator,
            "protocol": info.protocol,
            "members": [
                {
                    "member_id": m.member_id,
                    "instance_id": m.instance_id,
                    "client_id": m.client_id,
                    "host": m.host,
                    "assignment": [[s, p] for s, p in m.assignment],
                }
                for m in info.members
            ],
            "lag": sum(p["lag"] for p in partitions),
            "partitions": partitions,
        }

    # -- records ----------------------------------------------------------------------------

    def search(self, stream: str, wanted: Search, limit: int) -> Found | None:
        """Records of ``stream`` matching ``wanted``: the archive's, then Kafka's where the
        archive has none (``console/search.py``); ``None`` when neither knows the stream (or
        Kafka does not show it to this user and nothing of it is archived)."""
        topics = list_topics(self.settings.cluster, [stream], settings=False)
        if not topics and (self.store is None or stream not in self.store.streams()):
            return None
        topic = topics[0] if topics else None
        found = search(self.settings, self.store, topic, stream, wanted, limit)
        return dataclasses.replace(found, decoded=[self.decode(r) for r in found.records])

    def decode(self, record: Record) -> Any:
        """``record``'s value decoded when it is framed the Confluent way (Avro, Protobuf or
        JSON Schema) and its schema is in the store's registry; else ``None`` (shown as
        bytes)."""
        data, reader = record.data, self._reader
        if reader is None or data is None:
            return None
        try:
            return reader.decode(
                data,
                stream=record.stream or "",
                partition=record.partition,
                offset=record.offset,
                headers=record.headers,
            )
        except SerializationError:
            return None

    # -- the store --------------------------------------------------------------------------

    def sql(self, query: str) -> QueryResult:
        """A read-only query on the store, time-bounded."""
        return run_query(
            self.need_store(),
            query,
            timeout_ms=self.settings.query_timeout_ms,
            max_rows=self.settings.max_rows,
            read_only_hint="the console's queries read only",
        )

    def dead_letters(self, stream: str, where: str | None = None) -> list[DeadLetter]:
        letters = DeadLetters(self.need_store(), self.settings.cluster)
        if where:
            return letters.select(stream, where)
        return letters.list(stream)

    def replay(self, stream: str, ids: list[str] | None, to: str | None, where: str | None) -> int:
        """Replay dead letters (``ids``, or those ``where`` picks, or all) to their source
        or to ``to``."""
        letters = DeadLetters(self.need_store(), self.settings.cluster)
        return letters.replay(stream, to=to, where=_where_ids(stream, ids) or where)

    def purge(self, stream: str, ids: list[str] | None, where: str | None) -> int:
        letters = DeadLetters(self.need_store(), self.settings.cluster)
        return letters.purge(stream, where=_where_ids(stream, ids) or where)

    def durable(self) -> list[DurableBacklog]:
        """Durable clients: state (connected, away, expired), expiry, backlog per partition."""
        registry = SqlDurableRegistry(self.need_store())
        return durable_backlogs(self.settings.cluster, registry.list())


def _stream_row(
    topic: TopicInfo, archive: dict[tuple[str, int], tuple[int | None, int]]
) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    for p in topic.partitions:
        archived, lag = archive.get((topic.name, p.partition), (None, None))
        parts.append(
            {
                "partition": p.partition,
                "log_start": p.log_start,
                "log_end": p.log_end,
                "archived": archived,
                "archive_lag": lag,
            }
        )
    covered = [p for p in parts if p["archive_lag"] is not None]
    return {
        "stream": topic.name,
        "partitions": parts,
        "records": sum(p["log_end"] - p["log_start"] for p in parts),
        "end": sum(p["log_end"] for p in parts),
        "archived": bool(covered),
        "archive_lag": sum(p["archive_lag"] for p in covered) if covered else None,
    }


def _where_ids(stream: str, ids: list[str] | None) -> str | None:
    """A filter choosing dead letters by id (``<stream>/<partition>/<offset>``).

    Raises:
        ValueError: An id of another stream, or not of that form.
    """
    if not ids:
        return None
    terms = []
    for item in ids:
        name, _, rest = item.rpartition("/")
        head, _, partition = name.rpartition("/")
        if head != stream or not partition.isdigit() or not rest.isdigit():
            raise ValueError(f"{item!r} is not a dead letter of {stream}")
        terms.append(f"(kafka_partition = {int(partition)} AND kafka_offset = {int(rest)})")
    return " OR ".join(terms)
