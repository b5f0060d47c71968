"""Resequencing in Structured Streaming: per-sequence-group state with ``applyInPandasWithState``.

The rules are the facade Resequencer's (``bolide.facade.resequencer.core``): a group is its id
within one topic partition; headers are parsed by ``parse_sequence`` (numbers 0-based); batch
mode releases a group once complete, stream mode each record once its predecessor has gone;
a group must complete within ``timeout_s`` of its first record, then ``on_timeout`` releases
what it holds or marks it for the dead-letter stream; duplicates are dropped; records of a
timed-out group that arrive later are marked ``late``. Records without sequence headers pass
straight through.

What the facade keeps in memory lives here in Spark's state store (so it survives restarts
from the checkpoint): per group its status, size, next number, deadline, and the held rows as
one Arrow IPC blob.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from bolide.facade.deadletter import Reason
from bolide.facade.record import Record
from bolide.facade.resequencer.sequence import (
    NUMBER_HEADER,
    SEQUENCE_GROUP_HEADER,
    SIZE_HEADER,
    Invalid,
    parse_sequence,
)

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame

__all__ = ["OUTPUT_SCHEMA", "resequenced"]

_KAFKA_COLUMNS = [
    "key",
    "value",
    "topic",
    "partition",
    "offset",
    "timestamp",
    "timestampType",
    "headers",
]
#: What ``resequenced`` returns: the Kafka source's columns, then where each record stands.
OUTPUT_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int, headers array<struct<key:string,value:binary>>, seq_group string, "
    "seq_number int, timed_out boolean, reason string, detail string"
)
_STATE_SCHEMA = "status string, size int, next int, deadline_ms long, held binary"
_OPEN, _DONE, _EXPIRED = "open", "done", "expired"


@dataclass
class _Group:
    status: str
    size: int
    next: int
    deadline_ms: int
    held: dict[int, dict[str, Any]]

    @classmethod
    def load(cls, raw: tuple[Any, ...]) -> _Group:
        status, size, nxt, deadline, blob = raw
        held: dict[int, dict[str, Any]] = {}
        if blob:
            import pyarrow as pa

            for row in pa.ipc.open_stream(blob).read_all().to_pylist():
                held[int(row["seq_number"])] = row
        return cls(status, int(size), int(nxt), int(deadline), held)

    def dump(self) -> tuple[Any, ...]:
        blob = None
        if self.held:
            import pyarrow as pa

            table = pa.Table.from_pylist([self.held[n] for n in sorted(self.held)])
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            blob = sink.getvalue().to_pybytes()
        return (self.status, self.size, self.next, self.deadline_ms, blob)


def _headers(raw: Any) -> list[tuple[str, bytes]]:
    if raw is None:
        return []
    return [(h["key"], h["value"] if h["value"] is not None else b"") for h in raw]


def _out(row: dict[str, Any], **marks: Any) -> dict[str, Any]:
    result = {c: row[c] for c in _KAFKA_COLUMNS}
    result.update(
        seq_group=row.get("seq_group"),
        seq_number=row.get("seq_number"),
        timed_out=False,
        reason=None,
        detail=None,
    )
    result.update(marks)
    return result


class _Step:
    """One call of the state function for one group: rows in, rows out, state updated."""

    def __init__(self, mode: str, timeout_ms: int, on_timeout: str) -> None:
        self.batch = mode == "batch"
        self.timeout_ms = timeout_ms
        self.on_timeout = on_timeout

    def expire(self, group: _Group, name: str, now: int) -> list[dict[str, Any]]:
        """Close a timed-out group: release or mark what it holds; keep a tombstone."""
        out = []
        missing = group.size - group.next - len(group.held)
        detail = f"group {name!r} timed out after {self.timeout_ms / 1000}s, {missing} missing"
        for number in sorted(group.held):
            if self.on_timeout == "release":
                out.append(_out(group.held[number], timed_out=True))
            else:
                marks = {"reason": Reason.TIMEOUT.value, "detail": detail}
                out.append(_out(group.held[number], timed_out=True, **marks))
        group.held.clear()
        group.status, group.deadline_ms = _EXPIRED, now + self.timeout_ms
        return out

    def offer(
        self, group: _Group | None, rows: list[dict[str, Any]], now: int
    ) -> tuple[_Group | None, list[dict[str, Any]]]:
        out: list[dict[str, Any]] = []
        for raw in sorted(rows, key=lambda r: r["offset"]):
            row = dict(raw, headers=None if raw["headers"] is None else list(raw["headers"]))
            seq = parse_sequence(Record(b"", headers=_headers(row["headers"])))
            if seq is None:  # not sequenced: only reached when grouping put it here
                out.append(_out(row))
                continue
            if isinstance(seq, Invalid):
                out.append(_out(row, reason=seq.reason.value, detail=seq.detail))
                continue
            row = dict(row, seq_group=seq.group, seq_number=seq.number)
            if group is None:
                group = _Group(_OPEN, seq.size, 0, now + self.timeout_ms, {})
            if group.status == _EXPIRED:
                detail = f"group {seq.group!r} already timed out"
                out.append(_out(row, reason=Reason.LATE.value, detail=detail))
                continue
            if group.status == _DONE or seq.number < group.next or seq.number in group.held:
                continue  # a duplicate: dropped, as the facade does
            if seq.size != group.size:
                detail = f"size {seq.size} differs from the group's size {group.size}"
                out.append(_out(row, reason=Reason.SIZE_MISMATCH.value, detail=detail))
                continue
            group.held[seq.number] = row
            out.extend(self._release(group, now))
        return group, out

    def _release(self, group: _Group, now: int) -> list[dict[str, Any]]:
        out = []
        if self.batch:
            if len(group.held) == group.size:
                out = [_out(group.held[n]) for n in sorted(group.held)]
                group.held.clear()
                group.next = group.size
        else:
            while group.next in group.held:
                out.append(_out(group.held.pop(group.next)))
                group.next += 1
        if group.next == group.size:
            # A tombstone for one more timeout: later copies are recognised as duplicates.
            group.status, group.deadline_ms = _DONE, now + self.timeout_ms
        return out


def _state_function(mode: str, timeout_s: float, on_timeout: str) -> Any:
    timeout_ms = max(1, int(timeout_s * 1000))

    def step(key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: Any) -> Iterator[Any]:
        import warnings

        import pandas as pd

        # PySpark concatenates the frames of all groups; all-null columns (reason, detail)
        # make pandas 2 warn about a future dtype rule that does not affect these columns.
        warnings.filterwarnings(
            "ignore", "The behavior of DataFrame concatenation", category=FutureWarning
        )

        logic = _Step(mode, timeout_ms, on_timeout)
        now = int(state.getCurrentProcessingTimeMs())
        name = str(key[-1])
        group = _Group.load(state.get) if state.exists else None
        if state.hasTimedOut:
            out = []
            if group is not None and group.status == _OPEN:
                out = logic.expire(group, name, now)
                state.update(group.dump())
                state.setTimeoutDuration(timeout_ms)
            else:
                state.remove()
            if out:
                yield pd.DataFrame(out)
            return
        rows = [r for frame in frames for r in frame.to_dict("records")]
        if key[-1] is None:  # no usable group id: every row is malformed
            group = None
        group, out = logic.offer(group, rows, now)
        if group is not None and key[-1] is not None:
            state.update(group.dump())
            state.setTimeoutDuration(max(1, group.deadline_ms - now))
        if out:
            yield pd.DataFrame(out)

    return step


def _check_arguments(df: DataFrame, mode: object, timeout_s: object, on_timeout: object) -> None:
    """Refuse what ``resequenced`` cannot run with, before Spark plans anything."""
    if mode not in ("batch", "stream"):
        raise ValueError(f"mode must be 'batch' or 'stream', got {mode!r}")
    if on_timeout not in ("release", "dead_letter"):
        raise ValueError(f"on_timeout must be 'release' or 'dead_letter', got {on_timeout!r}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s <= 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    if "headers" not in df.columns:
        raise ValueError("the DataFrame has no headers column: read it with includeHeaders=true")


def resequenced(
    df: DataFrame,
    *,
    mode: Literal["batch", "stream"] = "batch",
    timeout_s: float = 30.0,
    on_timeout: Literal["release", "dead_letter"] = "release",
) -> DataFrame:
    """Records of each group in sequence order, from a streaming DataFrame of Kafka rows.

    Args:
        df: Rows with the Kafka source's columns, ``headers`` included (``includeHeaders``).
        mode: ``"batch"`` releases a group once complete; ``"stream"`` each record as soon as
            its predecessor has gone.
        timeout_s: A group must complete within this many seconds of its first record
            (processing time; checked at each trigger).
        on_timeout: ``"release"`` emits what a timed-out group holds, in order, with
            ``timed_out`` true; ``"dead_letter"`` emits it with ``reason = 'timeout'``.

    Returns:
        A streaming DataFrame (``OUTPUT_SCHEMA``): released rows have ``reason`` null; rows
        for the dead-letter stream carry ``reason`` (the ``bolide.reason`` tokens) and
        ``detail``. Within one micro-batch a group's rows come in sequence order; order
        them by ``seq_number`` after any shuffle.

    Raises:
        ValueError: An unknown ``mode`` or ``on_timeout``, a non-positive timeout, or a
            DataFrame without a ``headers`` column.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    _check_arguments(df, mode, timeout_s, on_timeout)
    names = ", ".join(f"'{n}'" for n in (SEQUENCE_GROUP_HEADER, SIZE_HEADER, NUMBER_HEADER))
    rows = df.select(*_KAFKA_COLUMNS).withColumn(
        "_sequenced", F.expr(f"coalesce(exists(headers, h -> h.key IN ({names})), false)")
    )
    last_group = f"element_at(filter(headers, h -> h.key = '{SEQUENCE_GROUP_HEADER}'), -1)"
    group_id = F.expr(f"cast({last_group}.value AS string)")
    plain = rows.where(~F.col("_sequenced")).select(
        *_KAFKA_COLUMNS,
        F.lit(None).cast("string").alias("seq_group"),
        F.lit(None).cast("int").alias("seq_number"),
        F.lit(False).alias("timed_out"),
        F.lit(None).cast("string").alias("reason"),
        F.lit(None).cast("string").alias("detail"),
    )
    sequenced = (
        rows.where(F.col("_sequenced"))
        .drop("_sequenced")
        .withColumn("_group", group_id)
        .groupBy("topic", "partition", "_group")
        .applyInPandasWithState(
            _state_function(mode, float(timeout_s), on_timeout),
            OUTPUT_SCHEMA,
            _STATE_SCHEMA,
            "append",
            GroupStateTimeout.ProcessingTimeTimeout,
        )
    )
    return sequenced.unionByName(plain)
