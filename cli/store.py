"""``bolide db``, ``bolide archive`` and ``bolide sql``: thin shims over SqlStore and Archiver.

Exit codes: 0 ok, 1 runtime failure, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any, TextIO

import sqlalchemy as sa

from bolide.cli.common import (
    add_cluster_arguments,
    add_db_argument,
    cluster_from_args,
    require_streams,
)
from bolide.facade.config import StreamConfig
from bolide.facade.ops.text import json_cell, table
from bolide.stores.archive import Archiver, ArchiverStats
from bolide.stores.dialects import dialect_of
from bolide.stores.queries import run_query
from bolide.stores.store import SqlStore

__all__ = ["register"]

_PARAM_TYPES = ("str", "int", "float", "bytes", "hex", "null")


def register(subparsers: Any) -> None:
    """Add ``db``, ``archive`` and ``sql`` to the ``bolide`` command line."""
    db = subparsers.add_parser(
        "db", help="migrate the history database", description="Alembic migrations of bolide."
    )
    db_sub = db.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    up = db_sub.add_parser("upgrade", help="upgrade the schema (default: to head)")
    up.add_argument("revision", nargs="?", default="head", help="target revision (head)")
    down = db_sub.add_parser("downgrade", help="downgrade the schema (default: one step)")
    down.add_argument("revision", nargs="?", default="-1", help="target revision or -N (-1)")
    current = db_sub.add_parser("current", help="print the schema revision and the head")
    for parser, func in ((up, _db_upgrade), (down, _db_downgrade), (current, _db_current)):
        add_db_argument(parser)
        parser.set_defaults(func=func, parser=parser)
    _register_incarnations(db_sub)

    archive = subparsers.add_parser(
        "archive",
        help="copy streams from Kafka into the history database",
        description="Archive streams into the SQL history in the consumer group GROUP. "
        "Stops once caught up, or follows with --follow until SIGINT/SIGTERM.",
    )
    archive.add_argument(
        "--stream", action="append", required=True, metavar="NAME", help="stream (repeatable)"
    )
    add_db_argument(archive)
    add_cluster_arguments(archive)
    archive.add_argument("--follow", action="store_true", help="keep archiving new records")
    archive.add_argument("--json", action="store_true", help="machine-readable output")
    archive.add_argument("--group", default="bolide-archiver", help="consumer group")
    archive.add_argument("--batch-size", type=int, default=2_000, help="records per transaction")
    archive.add_argument(
        "--capacity", type=int, default=None, help="trim Kafka to about N records per partition"
    )
    archive.set_defaults(func=_archive, parser=archive)

    sql = subparsers.add_parser(
        "sql",
        help="run a SQL query on the history database",
        description="Run one SQL statement with bound parameters, on a read-only connection "
        "unless --write. Parameters: --param name=value, or name:TYPE=value with TYPE in "
        f"{', '.join(_PARAM_TYPES)} (bytes: UTF-8 of value; hex: bytes from hex digits).",
    )
    sql.add_argument("query", help='the statement, with :name placeholders ("SELECT ...")')
    add_db_argument(sql)
    sql.add_argument(
        "--param", action="append", default=[], metavar="NAME[:TYPE]=VALUE", help="bound value"
    )
    sql.add_argument("--json", action="store_true", help="print rows as a JSON array")
    sql.add_argument(
        "--write", action="store_true", help="allow changes and commit them (default: read-only)"
    )
    sql.set_defaults(func=_sql, parser=sql)


def _db_url(args: argparse.Namespace) -> str:
    if not args.db:
        args.parser.error("--db URL is required (or set $BOLIDE_DB)")
    return str(args.db)


def _store(args: argparse.Namespace, *, check_schema: bool) -> SqlStore:
    try:
        return SqlStore(_db_url(args), check_schema=check_schema)
    except (ValueError, TypeError) as error:
        args.parser.error(str(error))
        raise  # pragma: no cover - error() exits


def _db_upgrade(args: argparse.Namespace) -> int:
    with _store(args, check_schema=False) as store:
        store.upgrade(args.revision)
        print(f"{store.url}: at revision {store.current()} (head {store.head()})")
    return 0


def _db_downgrade(args: argparse.Namespace) -> int:
    with _store(args, check_schema=False) as store:
        store.downgrade(args.revision)
        print(f"{store.url}: at revision {store.current()} (head {store.head()})")
    return 0


def _db_current(args: argparse.Namespace) -> int:
    with _store(args, check_schema=False) as store:
        current, head = store.current(), store.head()
        state = "up to date" if current == head else "run `bolide db upgrade`"
        print(f"{current or 'none'} (head {head}): {state}")
    return 0


# -- topic incarnations -------------------------------------------------------------------------


def _register_incarnations(db_sub: Any) -> None:
    """``bolide db incarnations``, ``drop-incarnation`` and ``adopt``."""
    listing = db_sub.add_parser(
        "incarnations",
        help="list the topic incarnations the store has met",
        description="Each Kafka topic a stream's name has stood for (a topic deleted and "
        "created again is a new one): its topic id, cluster id, the key its rows carry in the "
        "stream column of bolide's tables, when it was first met and when it was retired.",
    )
    listing.add_argument("--stream", metavar="NAME", help="only this stream")
    listing.add_argument("--json", action="store_true", help="print a JSON array")
    drop = db_sub.add_parser(
        "drop-incarnation",
        help="delete a retired topic incarnation and what is stored of it",
        description="Delete the records, headers, positions and durable markers stored of a "
        "retired incarnation of STREAM (a topic deleted since), and its entry.",
    )
    drop.add_argument("stream", metavar="STREAM")
    drop.add_argument("topic_id", metavar="TOPIC_ID")
    adopt = db_sub.add_parser(
        "adopt",
        help="let a stream's history go on from another Kafka cluster",
        description="After a failover to a mirror (or a rebuilt cluster), let STREAM's history "
        "continue from the cluster ID: its topic there starts a new incarnation when first "
        "met. Until then the store refuses that cluster (ClusterMismatchError).",
    )
    adopt.add_argument("stream", metavar="STREAM")
    adopt.add_argument("--cluster-id", required=True, metavar="ID", help="the new cluster's id")
    for parser, func in ((listing, _db_incarnations), (drop, _db_drop), (adopt, _db_adopt)):
        add_db_argument(parser)
        parser.set_defaults(func=func, parser=parser)


def _db_incarnations(args: argparse.Namespace) -> int:
    with _store(args, check_schema=True) as store:
        found = store.incarnations(args.stream)
    if args.json:
        print(json.dumps([{**i.__dict__, "current": i.current} for i in found]))
        return 0
    columns = ("stream", "topic_id", "cluster_id", "stored_as", "first_seen_ms", "retired_ms")
    print(table(columns, [tuple(getattr(i, c) for c in columns) for i in found]))
    return 0


def _db_drop(args: argparse.Namespace) -> int:
    with _store(args, check_schema=True) as store:
        try:
            count = store.drop_incarnation(args.stream, args.topic_id)
        except (LookupError, ValueError) as error:
            print(f"bolide db drop-incarnation: {error}", file=sys.stderr)
            return 1
    print(f"dropped incarnation {args.topic_id} of {args.stream}: {count} records")
    return 0


def _db_adopt(args: argparse.Namespace) -> int:
    with _store(args, check_schema=True) as store:
        try:
            adopted = store.adopt(args.stream, args.cluster_id)
        except LookupError as error:
            print(f"bolide db adopt: {error}", file=sys.stderr)
            return 1
    print(
        f"{args.stream} now lives on cluster {adopted.cluster_id}: its topic there starts a "
        "new incarnation when first met"
    )
    return 0


# -- archive ------------------------------------------------------------------------------------


def _archive(args: argparse.Namespace) -> int:
    if not args.bootstrap:
        args.parser.error("--bootstrap HOST:PORT is required (or set $BOLIDE_BOOTSTRAP)")
    if args.batch_size < 1:
        args.parser.error("--batch-size must be >= 1")
    if args.capacity is not None and args.capacity < 1:
        args.parser.error("--capacity must be >= 1")
    cluster = cluster_from_args(args)
    require_streams(args, cluster, args.stream)  # archiving never creates a topic
    with _store(args, check_schema=True) as store:
        # The topics as they are (their partitions); the store holds what Kafka drops.
        streams = [StreamConfig(name=n, store=store, capacity=args.capacity) for n in args.stream]
        display = _Progress(sys.stderr, as_json=args.json)
        archiver = Archiver(
            cluster, store, streams, group=args.group, batch_size=args.batch_size, progress=display
        )
        stop = lambda *_: archiver.stop()  # noqa: E731  # signal handler: finish the batch, exit
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        stats = archiver.run(until_caught_up=not args.follow)
        display.finish()
    summary = {
        "records": stats.records,
        "inserted": stats.inserted,
        "batches": stats.batches,
        "elapsed_s": round(stats.elapsed_s, 3),
        "lag": stats.lag,
        "caught_up": stats.caught_up,
        "positions": {f"{t}[{p}]": o for (t, p), o in sorted(stats.positions.items())},
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"archived {stats.records} records ({stats.inserted} new) in {stats.batches} "
            f"batches, {stats.elapsed_s:.1f}s"
        )
    return 0


class _Progress:
    """Progress on stderr: one rewritten line on a terminal, a line per report otherwise."""

    def __init__(self, out: TextIO, *, as_json: bool) -> None:
        self.out = out
        self.as_json = as_json
        self.tty = out.isatty() and not as_json
        self._wrote = False

    def __call__(self, stats: ArchiverStats) -> None:
        if self.as_json:
            line = json.dumps(
                {
                    "records": stats.records,
                    "records_per_s": round(stats.records_per_s, 1),
                    "lag": stats.lag,
                    "caught_up": stats.caught_up,
                }
            )
        else:
            lag = "?" if stats.lag is None else str(stats.lag)
            line = (
                f"{stats.records} records, {stats.records_per_s:,.0f} records/s, lag {lag}"
                f"{', caught up' if stats.caught_up else ''}"
            )
        if self.tty:
            self.out.write(f"\r\x1b[K{line}")
        else:
            self.out.write(line + "\n")
        self.out.flush()
        self._wrote = True

    def finish(self) -> None:
        if self.tty and self._wrote:
            self.out.write("\n")
            self.out.flush()


# -- sql ----------------------------------------------------------------------------------------


def _sql(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {}
    for item in args.param:
        try:
            name, value = _param(item)
        except ValueError as error:
            args.parser.error(str(error))
        params[name] = value
    db = _db_url(args)
    if "://" in db:  # else the store's own check names the problem
        url = sa.make_url(db)
        dialect_of(url).check_exists(url)  # reading never creates a database
    with _store(args, check_schema=False) as store:
        try:
            result = run_query(
                store, args.query, params, write=args.write,
                read_only_hint="bolide sql reads only, pass --write to change data",
            )  # fmt: skip
        except ValueError as error:
            args.parser.error(str(error))
    columns, rows, affected, elapsed = result.columns, result.rows, result.changed, result.elapsed_s
    done = "committed" if args.write else "read-only"
    if args.json:
        print(json.dumps([dict(zip(columns, map(json_cell, row), strict=True)) for row in rows]))
    elif columns:
        print(table(columns, rows))
        plural = "s" if len(rows) != 1 else ""
        print(f"({len(rows)} row{plural}, {elapsed:.3f}s, {done})", file=sys.stderr)
    elif args.write:
        print(f"statement ran, {affected} rows affected, committed", file=sys.stderr)
    else:
        print("statement ran, read-only", file=sys.stderr)
    return 0


def _param(item: str) -> tuple[str, Any]:
    spec, sep, raw = item.partition("=")
    if not sep:
        raise ValueError(f"--param expects NAME[:TYPE]=VALUE, got {item!r}")
    name, _, kind = spec.partition(":")
    kind = kind or "str"
    if not name.isidentifier():
        raise ValueError(f"--param name {name!r} is not an identifier")
    try:
        if kind == "str":
            return name, raw
        if kind == "int":
            return name, int(raw)
        if kind == "float":
            return name, float(raw)
        if kind == "bytes":
            return name, raw.encode()
        if kind == "hex":
            return name, bytes.fromhex(raw)
        if kind == "null":
            return name, None
    except ValueError:
        raise ValueError(f"--param {name}: {raw!r} is not a valid {kind}") from None
    raise ValueError(f"--param {name}: type {kind!r} is not one of {', '.join(_PARAM_TYPES)}")
