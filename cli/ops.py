"""``bolide lag``, ``bolide groups`` and ``bolide topics``: thin shims over ``bolide.facade.ops``.

Exit codes: 0 ok, 1 runtime failure or (``lag --fail-over N``) a lag above N, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from typing import Any

from bolide.cli.common import (
    add_cluster_arguments,
    add_db_argument,
    cluster_from_args,
    require_streams,
)
from bolide.facade.config import Cluster
from bolide.facade.ops import (
    LagReport,
    describe_groups,
    lag_report,
    list_groups,
    list_topics,
)
from bolide.facade.ops.text import table
from bolide.facade.ports import DurableClient, HistoryStore

__all__ = ["add_scope_arguments", "checked_cluster", "register", "report_from_args"]

_NONE = "-"


def add_scope_arguments(parser: argparse.ArgumentParser) -> None:
    """``--group``, ``--stream``, ``--db``/``--store``, the cluster and ``--json``: what
    ``lag`` and ``top`` both take."""
    parser.add_argument(
        "--group", action="append", default=None, metavar="G", help="consumer group (repeatable)"
    )
    parser.add_argument(
        "-t", "--stream", action="append", default=None, metavar="S", help="stream (repeatable)"
    )
    add_db_argument(
        parser,
        aliases=("--store",),
        help="history database (SQLAlchemy URL, default $BOLIDE_DB): adds the archive's lag "
        "and durable clients' backlogs",
    )
    add_cluster_arguments(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def checked_cluster(args: argparse.Namespace) -> Cluster:
    """``cluster_from_args``, and every ``--stream`` named exists (a usage error, exit 2,
    otherwise: nothing here creates a topic)."""
    cluster = cluster_from_args(args)
    require_streams(args, cluster, getattr(args, "stream", None) or [])
    return cluster


def register(subparsers: Any) -> None:
    """Add ``lag``, ``groups`` and ``topics`` to the ``bolide`` command line."""
    lag = subparsers.add_parser(
        "lag",
        help="consumer lag per group and partition, archive lag, durable backlogs",
        description="Per partition: the group's committed offset, the log end, the lag and "
        "the owner (member and client id, where the broker reports members). With --db: the "
        "archive's position and lag for the streams it holds, and durable clients with their "
        "backlog. --fail-over N exits 1 when any lag exceeds N (cron, health checks).",
    )
    add_scope_arguments(lag)
    lag.add_argument(
        "--fail-over", type=int, default=None, metavar="N", help="exit 1 when any lag exceeds N"
    )
    lag.set_defaults(func=_lag, parser=lag)

    groups = subparsers.add_parser(
        "groups",
        help="list consumer groups, or describe some (state, members, offsets, lag)",
        description="Without GROUP: every consumer group with its state, members and streams. "
        "With GROUP: its coordinator, members and assignments, and per partition its "
        "committed offset, log end and lag.",
    )
    groups.add_argument("names", nargs="*", metavar="GROUP", help="groups to describe")
    add_cluster_arguments(groups)
    groups.add_argument("--json", action="store_true", help="machine-readable output")
    groups.set_defaults(func=_groups, parser=groups)

    topics = subparsers.add_parser(
        "topics",
        help="list topics, or describe some (partitions, offsets, settings)",
        description="Without TOPIC: every topic with its partition and record counts (kcat "
        "-L). With TOPIC: each partition's leader, replicas, log start and end, and the "
        "topic's settings that are not the broker's defaults.",
    )
    topics.add_argument("names", nargs="*", metavar="TOPIC", help="topics to describe")
    add_cluster_arguments(topics)
    topics.add_argument("--json", action="store_true", help="machine-readable output")
    topics.set_defaults(func=_topics, parser=topics)


# -- lag ----------------------------------------------------------------------------------


def report_from_args(
    args: argparse.Namespace, cluster: Cluster, stack: ExitStack, *, all_streams: bool = False
) -> LagReport:
    """The ``LagReport`` that ``--group``, ``--stream`` and ``--db`` ask for (with
    ``all_streams`` and neither flag, every topic's end too: ``top``'s streams).

    ``stack`` closes the database handles once the caller is done with them (``top`` keeps
    them for every refresh).
    """
    store, clients = _database(args, stack)
    streams = set(args.stream) if args.stream else None
    archived: list[str] = []
    durable: list[DurableClient] = []
    if store is not None:
        archived = [s for s in store.streams() if streams is None or s in streams]
        durable = [
            c
            for c in clients()
            if (streams is None or streams & set(c.streams))
            and (args.group is None or c.group_id in args.group)
        ]
    return lag_report(
        cluster,
        groups=args.group,
        streams=streams,
        store=store,
        archived=archived,
        durable_clients=durable,
        all_streams=all_streams and args.group is None and args.stream is None,
    )


def _database(args: argparse.Namespace, stack: ExitStack) -> tuple[Any, Any]:
    """The history store and the durable registry's ``list`` on ``--db`` (or ``None, None``)."""
    if not args.db:
        return None, None
    from bolide.stores.durable_registry import SqlDurableRegistry
    from bolide.stores.store import SqlStore

    try:
        store = stack.enter_context(SqlStore(str(args.db)))
        registry = stack.enter_context(SqlDurableRegistry(store))
    except (ValueError, TypeError) as error:
        args.parser.error(str(error))
    checked: HistoryStore = store
    return checked, registry.list


def _lag(args: argparse.Namespace) -> int:
    if args.fail_over is not None and args.fail_over < 0:
        args.parser.error("--fail-over must be at least 0")
    cluster = checked_cluster(args)
    with ExitStack() as stack:
        report = report_from_args(args, cluster, stack)
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        print(render_lag(report))
    if args.fail_over is not None:
        over = report.over(args.fail_over)
        for line in over:
            print(f"bolide lag: over {args.fail_over}: {line}", file=sys.stderr)
        if over:
            return 1
    return 0


def _cell(value: Any) -> Any:
    return _NONE if value is None else value


def render_lag(report: LagReport) -> str:
    """The text tables of a lag report (groups, archive, durable clients, share groups)."""
    parts = []
    if report.partitions:
        rows: list[tuple[Any, ...]] = [
            (
                r.group,
                r.stream,
                r.partition,
                _cell(r.committed),
                r.log_end,
                r.lag,
                _cell(r.member_id),
                _cell(r.client_id),
            )
            for r in report.partitions
        ]
        columns: tuple[str, ...] = (
            "GROUP",
            "STREAM",
            "PARTITION",
            "COMMITTED",
            "LOG-END",
            "LAG",
            "OWNER",
        )
        parts.append(table((*columns, "CLIENT-ID"), rows))
    if report.archive:
        rows = [
            (a.stream, a.partition, _cell(a.archived), a.position, a.log_end, a.lag)
            for a in report.archive
        ]
        columns = ("ARCHIVE", "PARTITION", "ARCHIVED", "POSITION", "LOG-END", "LAG")
        parts.append(table(columns, rows))
    if report.durable:
        rows = [
            (d.durable_id, d.group_id, d.state, f"{d.away_s:.1f}s", f"{d.timeout_s:g}s", d.total)
            for d in report.durable
        ]
        columns = ("DURABLE", "GROUP", "STATE", "AWAY", "TIMEOUT", "BACKLOG")
        parts.append(table(columns, rows))
    if report.share:
        rows = [
            (q.group, q.stream, q.partition, q.start, q.log_end, q.backlog) for q in report.share
        ]
        columns = ("SHARE-GROUP", "STREAM", "PARTITION", "START", "LOG-END", "BACKLOG")
        parts.append(table(columns, rows))
    return "\n\n".join(parts) if parts else "no lag to report (no group reads these streams)"


# -- groups and topics --------------------------------------------------------------------


def _groups(args: argparse.Namespace) -> int:
    cluster = checked_cluster(args)
    names = args.names or list_groups(cluster)
    described = describe_groups(cluster, names)
    if not args.names:
        if args.json:
            print(json.dumps([g.to_dict() for g in described]))
        elif not described:
            print("no consumer groups")
        else:
            rows: list[tuple[Any, ...]] = [
                (g.group_id, g.state, len(g.members), ",".join(g.streams) or _NONE)
                for g in described
            ]
            print(table(("GROUP", "STATE", "MEMBERS", "STREAMS"), rows))
        return 0
    report = lag_report(cluster, groups=args.names)
    if args.json:
        lags = report.to_dict()["partitions"]
        out = [
            g.to_dict() | {"lag": [r for r in lags if r["group"] == g.group_id]} for g in described
        ]
        print(json.dumps(out))
        return 0
    blocks = []
    for g in described:
        lines = [
            f"group {g.group_id}: {g.state}, {len(g.members)} members, coordinator "
            f"{_cell(g.coordinator)}, assignor {_cell(g.assignor)}"
        ]
        if g.members:
            rows = [
                (m.member_id, m.client_id, m.host, " ".join(f"{s}[{p}]" for s, p in m.assignment))
                for m in g.members
            ]
            lines.append(table(("MEMBER", "CLIENT-ID", "HOST", "PARTITIONS"), rows))
        rows = [
            (r.stream, r.partition, _cell(r.committed), r.log_end, r.lag, _cell(r.member_id))
            for r in report.partitions
            if r.group == g.group_id
        ]
        if rows:
            columns: tuple[str, ...] = (
                "STREAM",
                "PARTITION",
                "COMMITTED",
                "LOG-END",
                "LAG",
                "OWNER",
            )
            lines.append(table(columns, rows))
        else:
            lines.append("no committed offsets")
        blocks.append("\n".join(lines))
    print("\n\n".join(blocks))
    return 0


def _topics(args: argparse.Namespace) -> int:
    cluster = checked_cluster(args)
    topics = list_topics(cluster, args.names or None, settings=bool(args.names))
    missing = sorted(set(args.names) - {t.name for t in topics})
    if args.json:
        print(json.dumps([t.to_dict() for t in topics]))
    elif not args.names:
        rows: list[tuple[Any, ...]] = [(t.name, len(t.partitions), t.records) for t in topics]
        print(table(("TOPIC", "PARTITIONS", "RECORDS"), rows) if rows else "no topics")
    else:
        blocks = []
        for t in topics:
            lines = [f"topic {t.name}: {len(t.partitions)} partitions, {t.records} records"]
            rows = [
                (
                    p.partition,
                    _cell(p.leader),
                    ",".join(map(str, p.replicas)),
                    ",".join(map(str, p.isrs)),
                    p.log_start,
                    p.log_end,
                    p.records,
                )
                for p in t.partitions
            ]
            columns: tuple[str, ...] = (
                "PARTITION",
                "LEADER",
                "REPLICAS",
                "ISRS",
                "LOG-START",
                "LOG-END",
            )
            lines.append(table((*columns, "RECORDS"), rows))
            settings = ", ".join(f"{k}={v}" for k, v in t.settings.items())
            lines.append(f"settings: {settings or '(broker defaults, or none reported)'}")
            blocks.append("\n".join(lines))
        print("\n\n".join(blocks))
    if missing:
        print(f"bolide topics: error: no such topic: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0
