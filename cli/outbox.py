"""``bolide outbox relay``: a thin shim over ``Outbox.relay`` (docs/outbox.md).

Exit codes: 0 stopped by SIGINT/SIGTERM, 1 the relay stopped on a failure it cannot outlive
(a stream that does not exist, a record Kafka refuses, a newer relay with the same id), 2 usage.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from typing import Any

from bolide.cli.common import add_cluster_arguments, add_db_argument, cluster_from_args
from bolide.stores import Outbox, RelayConfig, RelayStats, SqlStore

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``outbox relay`` to the ``bolide`` command line."""
    outbox = subparsers.add_parser(
        "outbox",
        help="publish the transactional outbox's rows to Kafka",
        description="Rows an application adds to bolide_outbox in its own transactions are "
        "published by a relay once they commit, in commit order per key.",
    )
    sub = outbox.add_subparsers(dest="outbox_command", metavar="ACTION", required=True)
    relay = sub.add_parser(
        "relay",
        help="publish committed outbox rows until SIGINT/SIGTERM",
        description="Publish committed rows of bolide_outbox and mark them sent, until "
        "SIGINT/SIGTERM. At least once by default; exactly once for read_committed readers "
        "with --transactional-id (keep the id across restarts). Progress at -v.",
    )
    add_db_argument(relay)
    add_cluster_arguments(relay)
    relay.add_argument(
        "--transactional-id",
        default=None,
        metavar="ID",
        help="publish in Kafka transactions as ID: exactly once (one id per running relay)",
    )
    relay.add_argument("--batch-size", type=int, default=500, help="most rows per round")
    relay.add_argument(
        "--poll-interval-ms", type=int, default=100, help="wait of an idle relay (default 100)"
    )
    relay.add_argument(
        "--progress-interval-s", type=float, default=5.0, help="seconds between progress lines"
    )
    relay.add_argument("--json", action="store_true", help="print the final counts as JSON")
    relay.set_defaults(func=_relay, parser=relay)


def _config(args: argparse.Namespace) -> RelayConfig:
    if args.poll_interval_ms < 1:
        args.parser.error("--poll-interval-ms must be >= 1")
    try:
        return RelayConfig(
            transactional_id=args.transactional_id,
            batch_size=args.batch_size,
            poll_interval_s=args.poll_interval_ms / 1000,
            progress_interval_s=args.progress_interval_s,
        )
    except (ValueError, TypeError) as error:
        args.parser.error(str(error).replace("_", "-"))
        raise  # pragma: no cover - error() exits


def _relay(args: argparse.Namespace) -> int:
    if not args.db:
        args.parser.error("--db URL is required (or set $BOLIDE_DB)")
    config = _config(args)
    cluster = cluster_from_args(args)
    try:
        store = SqlStore(str(args.db))
    except (ValueError, TypeError) as error:
        args.parser.error(str(error))
        raise  # pragma: no cover - error() exits
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with store:
        relay = Outbox(store).relay(cluster, config)
        try:
            while relay.running and not stop.wait(0.2):
                pass
        finally:
            stats = relay.close()  # re-raises what stopped it: exit 1 with its message
    _print(stats, as_json=args.json)
    return 0


def _print(stats: RelayStats, *, as_json: bool) -> None:
    if as_json:
        counts = ("published", "batches", "retries", "recovered", "released", "pending")
        print(json.dumps({name: getattr(stats, name) for name in counts}))
        return
    print(
        f"published {stats.published} rows in {stats.batches} batches, {stats.retries} retries"
        + (f", {stats.pending} pending" if stats.pending is not None else "")
    )
