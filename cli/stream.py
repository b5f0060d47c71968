"""``bolide publish`` and ``bolide tail``: kcat-like shims over Publisher and Subscriber.

``publish`` sends one value, or one record per line of standard input, with an optional key
or message group, headers, and Avro encoding through the SQL schema registry. ``tail`` prints
records (partition, offset, key, headers, value) from the end, the beginning, an offset or a
point in time, ungrouped by default or in a subscriber group, and decodes Avro (or, with a
schema registry, any of Avro, Protobuf and JSON Schema).

Exit codes: 0 ok, 1 runtime failure, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bolide.cli.common import (
    add_cluster_arguments,
    add_db_argument,
    cluster_from_args,
    existing_partitions,
    missing_stream,
    parse_time_ms,
)
from bolide.facade.errors import SerializationError
from bolide.facade.ops.text import render_bytes
from bolide.facade.ports import decode_with

#: How a record's value is decoded (``decode_with``).
Decode = Callable[[Any, str], Any]

if TYPE_CHECKING:
    from bolide.facade.config import Cluster
    from bolide.facade.subscriber import Subscriber

__all__ = ["parse_time_ms", "register"]

log = logging.getLogger("bolide.cli")


def register(subparsers: Any) -> None:
    """Add ``bolide publish`` and ``bolide tail``."""
    _register_publish(subparsers)
    _register_tail(subparsers)


def _register_publish(subparsers: Any) -> None:
    pub = subparsers.add_parser(
        "publish",
        help="publish records to a stream (kcat -P)",
        description="Publish VALUE, or one record per line of standard input when VALUE is "
        "'-' or absent. Prints stream[partition]@offset per record. The stream's topic is "
        "created if missing (with --partitions, default 1).",
    )
    pub.add_argument("value", nargs="?", default="-", help="the value; '-' reads stdin lines")
    _stream_args(pub)
    pub.add_argument("-k", "--key", default=None, help="Kafka key of every record")
    pub.add_argument(
        "-K",
        dest="key_delimiter",
        default=None,
        metavar="DELIM",
        help="each line is KEY DELIM VALUE, split at the first DELIM (a line without it has "
        "no key)",
    )
    pub.add_argument(
        "-p",
        "--partition",
        type=int,
        default=None,
        metavar="N",
        help="publish to partition N (default: the key, or the publisher, picks it)",
    )
    pub.add_argument("--group", default=None, help="message group (becomes the key)")
    pub.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="header for every record (repeatable; names may repeat)",
    )
    pub.add_argument(
        "--partitions", type=int, default=None, help="partitions of a new topic (default 1)"
    )
    pub.add_argument("--json", action="store_true", help="print one JSON object per record")
    _kcat_mode_flag(pub, "-P", "producer")
    pub.set_defaults(func=_publish, parser=pub)


def _register_tail(subparsers: Any) -> None:
    tail = subparsers.add_parser(
        "tail",
        help="print records of a stream (kcat -C)",
        description="Print each record's partition, offset, key, headers and value. Starts "
        "at the end unless told otherwise; stops after --count records, at the end with "
        "--exit-at-end, or on Ctrl-C.",
    )
    _stream_args(tail)
    _start_args(tail)
    tail.add_argument("-p", "--partition", type=int, default=None, help="only this partition")
    tail.add_argument(
        "-c", "--count", type=int, default=None, metavar="N", help="stop after N records"
    )
    tail.add_argument(
        "-K",
        dest="key_delimiter",
        default=None,
        metavar="DELIM",
        help="print each record as KEY DELIM VALUE (kcat -K)",
    )
    tail.add_argument(
        "-e", "--exit-at-end", action="store_true", help="stop once the end is reached"
    )
    tail.add_argument(
        "--group",
        default=None,
        help="read in this subscriber group (resumes from its confirmed offsets; confirms "
        "what it prints)",
    )
    tail.add_argument(
        "--lease-timeout-ms",
        type=int,
        default=10_000,
        help="with --group: the member's lease (session timeout), default 10000",
    )
    tail.add_argument("--json", action="store_true", help="print one JSON object per record")
    tail.add_argument(
        "-r",
        "--schema-registry",
        default=None,
        metavar="URL",
        help="decode Confluent-framed values (Avro, Protobuf, JSON Schema) with this schema "
        "registry (kcat -r); a database URL names the SQL registry",
    )
    tail.add_argument(
        "--decode",
        action="store_true",
        help="decode Confluent-framed values with the SQL schema registry of --db",
    )
    _kcat_mode_flag(tail, "-C", "consumer")
    tail.set_defaults(func=_tail, parser=tail)


def _start_args(tail: argparse.ArgumentParser) -> None:
    """Where ``tail`` starts: one of these, or the end."""
    start = tail.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="from the first record")
    start.add_argument(
        "--from-offset", type=int, default=None, metavar="N", help="from offset N (each partition)"
    )
    start.add_argument(
        "--from-time",
        default=None,
        metavar="WHEN",
        help="from the first record at or after WHEN: ISO 8601 (UTC unless it has an "
        "offset) or epoch milliseconds",
    )
    start.add_argument(
        "--last",
        type=int,
        default=None,
        metavar="N",
        help="from the last N records of each partition",
    )
    start.add_argument(
        "-o",
        dest="kcat_offset",
        default=None,
        metavar="beginning|end|N|-N",
        help="kcat's start: the first record, the end, offset N, or the last N records of "
        "each partition",
    )


def _kcat_mode_flag(parser: argparse.ArgumentParser, flag: str, mode: str) -> None:
    """kcat's mode flag, accepted where the command already is that mode."""
    parser.add_argument(flag, action="store_true", help=f"kcat's {mode} mode: this command")


def _stream_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-t", "--stream", required=True, help="the stream (topic)")
    add_cluster_arguments(parser)
    parser.add_argument(
        "--avro-schema",
        default=None,
        metavar="FILE",
        help="Avro schema file: values are JSON encoded to (or decoded from) Avro with the "
        "SQL schema registry of --db",
    )
    add_db_argument(parser)


def _serde(args: argparse.Namespace) -> Any:
    if args.avro_schema is None:
        return None
    if not args.db:
        args.parser.error("--avro-schema needs --db (the SQL schema registry), or $BOLIDE_DB")
    from bolide.facade.schemas.avro import AvroSerde

    try:
        schema = Path(args.avro_schema).read_text(encoding="utf-8")
    except OSError as exc:
        args.parser.error(f"cannot read --avro-schema: {exc}")
    return AvroSerde(schema, registry=args.db)


def _reader(args: argparse.Namespace) -> Any:
    """``tail``'s decoder of any schema format: ``--schema-registry``, or ``--decode`` with
    the SQL registry of ``--db``; ``None`` for neither."""
    url = args.schema_registry or (args.db if args.decode else None)
    if args.decode and not url:
        args.parser.error("--decode needs --db (the SQL schema registry) or --schema-registry")
    if url is None:
        return None
    from bolide.facade.schemas.reader import SchemaReader

    return SchemaReader(url)


def _stream(args: argparse.Namespace, cluster: Any, partitions: int | None, *, create: bool) -> Any:
    """The stream named by ``--stream``: the topic as it is; a missing one is created with
    ``partitions`` (default 1) when ``create``, else a usage error (exit 2) naming similar
    streams."""
    from bolide.facade.config import StreamConfig

    try:
        StreamConfig(name=args.stream)  # a usage error before any network round trip
    except (ValueError, TypeError) as exc:
        args.parser.error(str(exc))
    count = existing_partitions(args, cluster, args.stream)
    if count is None and not create:
        args.parser.error(missing_stream(args, cluster, args.stream))
    try:
        return StreamConfig(name=args.stream, partitions=partitions or count)
    except (ValueError, TypeError) as exc:
        args.parser.error(str(exc))


# -- publish ------------------------------------------------------------------------------


def _publish(args: argparse.Namespace) -> int:
    from bolide.facade.config import PublisherConfig
    from bolide.facade.publisher import Publisher
    from bolide.facade.record import Record

    headers = _check_publish_args(args)
    cluster = cluster_from_args(args)
    serde = _serde(args)
    stream = _stream(args, cluster, args.partitions, create=True)
    count = stream.partitions or 1
    if args.partition is not None and args.partition >= count:
        args.parser.error(f"--partition {args.partition}: {stream.name!r} has {count}")
    values = _lines(sys.stdin) if args.value == "-" else iter([args.value])
    log.info(
        "publishing to %s (%d partitions) at %s%s",
        stream.name,
        count,
        cluster.bootstrap_servers,
        " from standard input" if args.value == "-" else "",
    )
    sent = 0
    with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
        for line in values:
            key, text = args.key, line
            if args.key_delimiter is not None:
                found, sep, rest = line.partition(args.key_delimiter)
                key, text = (found, rest) if sep else (None, line)
            data = _encode(serde, text, stream.name)
            record = Record(
                data, key=key, headers=headers, group=args.group, partition=args.partition
            )
            offset = pub.publish(record)
            sent += 1
            if args.json:
                print(
                    json.dumps(
                        {"stream": stream.name, "partition": record.partition, "offset": offset}
                    ),
                    flush=True,
                )
            else:
                print(f"{stream.name}[{record.partition}]@{offset}", flush=True)
    if sent == 0:
        print("bolide publish: no input lines, nothing published", file=sys.stderr)
    return 0


def _check_publish_args(args: argparse.Namespace) -> list[tuple[str, bytes]]:
    """Refuse contradictory ``publish`` options (exit 2); the ``--header`` pairs."""
    if args.key is not None and args.group is not None:
        args.parser.error("--key and --group contradict each other: a group is the key")
    if args.key_delimiter is not None and (args.key is not None or args.group is not None):
        args.parser.error("-K takes each record's key from its line: no --key or --group")
    if args.key_delimiter == "":
        args.parser.error("-K needs a non-empty delimiter")
    if args.partition is not None and args.partition < 0:
        args.parser.error("--partition must be >= 0")
    if args.partition is not None and args.group is not None:
        args.parser.error(
            "--partition and --group contradict each other: a group's partition is its key's"
        )
    if args.partitions is not None and args.partitions < 1:
        args.parser.error("--partitions must be at least 1")
    headers = []
    for item in args.header:
        name, sep, value = item.partition("=")
        if not sep or not name:
            args.parser.error(f"--header expects NAME=VALUE, got {item!r}")
        headers.append((name, value.encode()))
    return headers


def _lines(stream: Any) -> Iterator[str]:
    for line in stream:
        yield line.rstrip("\r\n")


def _encode(serde: Any, text: str, stream: str) -> bytes:
    if serde is None:
        return text.encode()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SerializationError(f"with --avro-schema each value must be JSON: {exc}") from None
    data: bytes = serde.encode(value, stream=stream)
    return data


# -- tail ---------------------------------------------------------------------------------


def _tail(args: argparse.Namespace) -> int:
    from bolide.facade.config import InitialOffsetScheme, SubscriberConfig
    from bolide.facade.subscriber import Subscriber

    when = _check_tail_args(args)
    cluster = cluster_from_args(args)
    serde = _serde(args) or _reader(args)
    decode = None if serde is None else decode_with(serde)  # chosen once, not per record
    stream = _stream(args, cluster, None, create=False)
    count = stream.partitions or 1
    if args.partition is not None and args.partition >= count:
        args.parser.error(f"--partition {args.partition}: {stream.name!r} has {count}")
    parts = [args.partition] if args.partition is not None else list(range(count))
    scheme = InitialOffsetScheme.EARLIEST if args.from_beginning else InitialOffsetScheme.LATEST
    if args.group is not None:
        scheme = InitialOffsetScheme.AUTO
    config = SubscriberConfig(
        stream=stream,
        group=args.group,
        initial_offset_scheme=scheme,
        lease_timeout_ms=args.lease_timeout_ms,
    )
    with Subscriber(cluster, config) as sub:
        starts, ends = _tail_bounds(args, cluster, sub, stream.name, parts, when)
        log.info(
            "tailing %s at %s from %s%s",
            stream.name,
            cluster.bootstrap_servers,
            starts or ("the group's confirmed offsets" if args.group else "the end"),
            f" to {ends}" if ends else "",
        )
        return _print_records(args, sub, decode, starts, ends)


def _check_tail_args(args: argparse.Namespace) -> int | None:
    """Refuse contradictory or negative ``tail`` options (exit 2); the ``--from-time`` in
    epoch milliseconds, if given."""
    if args.kcat_offset is not None:
        _kcat_offset(args)
    chosen = (
        args.from_beginning,
        args.from_offset is not None,
        args.from_time is not None,
        args.last is not None,
    )
    if args.group is not None and (any(chosen) or args.exit_at_end):
        args.parser.error(
            "--group resumes from the group's confirmed offsets: it takes no --from-* "
            "or --exit-at-end"
        )
    for name in ("count", "from_offset", "partition", "last"):
        value = getattr(args, name)
        if value is not None and value < 0:
            args.parser.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.lease_timeout_ms < 1_000:
        args.parser.error("--lease-timeout-ms must be at least 1000")
    if args.from_time is None:
        return None
    try:
        return parse_time_ms(args.from_time)
    except ValueError as exc:
        args.parser.error(str(exc))
    return None  # not reached: error() exits


def _kcat_offset(args: argparse.Namespace) -> None:
    """Turn kcat's ``-o beginning|end|N|-N`` into the start flag it means (exit 2 if none)."""
    text = args.kcat_offset.strip()
    if text == "beginning":
        args.from_beginning = True
    elif text.lstrip("-").isdigit() and text.count("-") <= 1:
        if text.startswith("-"):
            args.last = int(text[1:])
        else:
            args.from_offset = int(text)
    elif text != "end":  # the end is where tail starts anyway
        args.parser.error(f"-o {text!r}: expected beginning, end, an offset N or -N (the last N)")


def _tail_bounds(
    args: argparse.Namespace,
    cluster: Cluster,
    sub: Subscriber,
    name: str,
    parts: list[int],
    when: int | None,
) -> tuple[dict[int, int], dict[int, int]]:
    """Seek ``sub`` where the options start; return where each partition starts and where it
    ends now (for ``--exit-at-end``)."""
    from bolide.facade.kafka import log_ends, log_starts, offsets_for_time, probe_consumer

    ends = log_ends(cluster, name, parts) if args.exit_at_end else {}
    starts = dict(ends)
    if args.from_offset is not None:
        starts = {p: min(args.from_offset, ends.get(p, args.from_offset)) for p in parts}
        for p in parts:
            sub.seek(args.from_offset, partition=p)
    elif when is not None:
        starts = offsets_for_time(cluster, name, parts, when)
        for p, offset in starts.items():
            sub.seek(offset, partition=p)
    elif args.last is not None or (args.from_beginning and ends):
        consumer = probe_consumer(cluster)
        try:
            firsts = log_starts(consumer, name, parts, cluster=cluster)
        finally:
            consumer.close()
        starts = firsts
        if args.last is not None:
            last_ends = ends or log_ends(cluster, name, parts)
            starts = {p: max(firsts[p], last_ends[p] - args.last) for p in parts}
            for p, offset in starts.items():
                sub.seek(offset, partition=p)
    return starts, ends


def _print_records(
    args: argparse.Namespace,
    sub: Any,
    decode: Decode | None,
    positions: dict[int, int],
    ends: dict[int, int],
) -> int:
    """Print records until ``--count`` or, with ``ends``, until every position reaches it."""
    printed = 0
    while args.count is None or printed < args.count:
        if ends and all(positions[p] >= end for p, end in ends.items()):
            break
        shown: dict[int, int] = {}  # partition -> last offset printed in this batch
        for record in sub.poll(200):
            if args.partition is not None and record.partition != args.partition:
                continue
            positions[record.partition] = record.offset + 1
            print(
                _render(record, decode, as_json=args.json, delimiter=args.key_delimiter), flush=True
            )
            shown[record.partition] = record.offset
            printed += 1
            if args.count is not None and printed >= args.count:
                break
        if args.group is not None:
            for partition, offset in shown.items():  # only what was printed: not the batch
                sub.confirm(offset, partition=partition)
    return 0


def _render(
    record: Any, decode: Decode | None, *, as_json: bool, delimiter: str | None = None
) -> str:

    value: Any
    if record.data is None:
        value = None  # a tombstone: printed as NULL, JSON null
    elif decode is not None:
        try:
            value = decode(record, record.stream)
        except SerializationError as exc:
            print(f"bolide tail: warning: {exc}", file=sys.stderr)
            value = render_bytes(record.data)
    else:
        value = render_bytes(record.data)
    key = render_bytes(record.key) if record.key is not None else None
    headers = [[name, render_bytes(raw)] for name, raw in record.headers]
    if as_json:
        return json.dumps(
            {
                "stream": record.stream,
                "partition": record.partition,
                "offset": record.offset,
                "timestamp_ms": record.timestamp_ms,
                "key": key,
                "headers": headers,
                "value": value,
            },
            default=str,
        )
    if value is None:
        shown = "NULL"
    else:
        shown = value if isinstance(value, str) else json.dumps(value, default=str)
    if delimiter is not None:
        return f"{key if key is not None else ''}{delimiter}{shown}"
    header_text = ",".join(f"{n}={v}" for n, v in headers)
    return (
        f"{record.partition}:{record.offset} key={key if key is not None else '-'} "
        f"headers={header_text or '-'} {shown}"
    )
