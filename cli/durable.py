"""``bolide durable list`` and ``bolide durable expire``: thin shims over the durable registry.

Registered by ``bolide.cli.store``. Exit codes: 0 ok, 1 runtime failure, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from bolide.cli.common import add_cluster_arguments, add_db_argument, cluster_from_args
from bolide.facade.config import Cluster
from bolide.facade.ops.durables import client_backlog, expire_clients
from bolide.facade.ports import DurableClient, now_ms
from bolide.stores.durable_registry import SqlDurableRegistry

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``durable list`` and ``durable expire`` to the ``bolide`` command line."""
    durable = subparsers.add_parser(
        "durable",
        help="inspect and expire durable clients",
        description="Durable clients keep their queue while away; these commands read the "
        "registry in the database and the clients' positions in Kafka.",
    )
    sub = durable.add_subparsers(dest="durable_command", metavar="ACTION", required=True)
    listing = sub.add_parser(
        "list", help="clients, streams, last seen and backlog (records waiting)"
    )
    expire = sub.add_parser(
        "expire", help="forget clients away past their timeout and drop their positions"
    )
    for parser, func in ((listing, _list), (expire, _expire)):
        add_db_argument(parser)
        add_cluster_arguments(parser)
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        parser.set_defaults(func=func, parser=parser)


def _open(args: argparse.Namespace) -> tuple[Cluster, SqlDurableRegistry]:
    if not args.db:
        args.parser.error("--db URL is required (or set $BOLIDE_DB)")
    cluster = cluster_from_args(args)
    try:
        return cluster, SqlDurableRegistry(str(args.db))
    except (ValueError, TypeError) as error:
        args.parser.error(str(error))
        raise  # pragma: no cover - error() exits


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _state(client: DurableClient, at_ms: int) -> str:
    if client.connected:
        return "connected"
    return "expired" if client.expired(at_ms) else "away"


def _describe(
    client: DurableClient, at_ms: int, backlog: dict[str, dict[int, int]] | None
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "durable_id": client.durable_id,
        "group_id": client.group_id,
        "streams": list(client.streams),
        "state": _state(client, at_ms),
        "last_seen": _when(client.last_seen_ms),
        "last_seen_ms": client.last_seen_ms,
        "away_s": round(client.away_s(at_ms), 3),
        "timeout_s": client.timeout_s,
        "connections": client.connections,
        "marker": {s: {str(p): o for p, o in m.items()} for s, m in client.markers.items()},
    }
    if backlog is not None:
        row["backlog"] = sum(n for parts in backlog.values() for n in parts.values())
        row["backlog_by_partition"] = {
            s: {str(p): n for p, n in parts.items()} for s, parts in backlog.items()
        }
    return row


def _list(args: argparse.Namespace) -> int:
    cluster, registry = _open(args)
    with registry:
        clients = registry.list()
        at = now_ms()
        rows = [_describe(c, at, client_backlog(cluster, c)) for c in clients]
    if args.json:
        print(json.dumps(rows))
        return 0
    if not rows:
        print("no durable clients")
        return 0
    header = ("CLIENT", "STREAMS", "LAST SEEN (UTC)", "AWAY", "TIMEOUT", "STATE", "BACKLOG")
    table = [header] + [
        (
            r["durable_id"],
            ",".join(r["streams"]),
            r["last_seen"],
            f"{r['away_s']:.1f}s",
            f"{r['timeout_s']:g}s",
            r["state"],
            str(r["backlog"]),
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    return 0


def _expire(args: argparse.Namespace) -> int:
    cluster, registry = _open(args)
    with registry:
        at = now_ms()
        gone = expire_clients(cluster, registry)
        rows = [_describe(c, at, None) | {"state": "expired"} for c in gone]
    if args.json:
        print(json.dumps(rows))
        return 0
    if not rows:
        print("no durable client is past its timeout")
    for r in rows:
        print(
            f"expired {r['durable_id']} (streams {','.join(r['streams'])}; away {r['away_s']:.1f}s,"
            f" timeout {r['timeout_s']:g}s): position dropped"
        )
    return 0
