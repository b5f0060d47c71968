"""``bolide console``: serve the web console (the ``bolide`` command lists this module)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from bolide.cli.common import add_cluster_arguments, add_db_argument, cluster_from_args
from bolide.console.settings import TOKEN_ENV, ConsoleSettings

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``console`` to the ``bolide`` command."""
    console = subparsers.add_parser(
        "console",
        help="serve the web console over the cluster and the history store",
        description="A web console: streams, groups and their lag, records searched in the "
        "archive and Kafka, dead letters, read-only SQL, durable clients. It listens on "
        f"127.0.0.1 unless --host says otherwise; any other host needs ${TOKEN_ENV}. It only "
        "reads unless --allow-writes.",
    )
    add_cluster_arguments(console)
    add_db_argument(console, required=False, help="the history store (default: $BOLIDE_DB)")
    console.add_argument("--host", default="127.0.0.1", help="address to listen on")
    console.add_argument("--port", type=int, default=8080, help="port (0: a free one)")
    console.add_argument(
        "--allow-writes", action="store_true", help="allow replaying and purging dead letters"
    )
    console.add_argument(
        "--sample-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how often the groups' lag is sampled for their charts (default: 5)",
    )
    console.set_defaults(func=_console, parser=console)


def _console(args: argparse.Namespace) -> int:
    try:
        from bolide.console.app import serve
    except ImportError as exc:  # the extra is not installed
        args.parser.error(f"the console needs its extra: pip install 'bolide[console]' ({exc})")
    cluster = cluster_from_args(args)
    try:
        settings = ConsoleSettings(
            cluster,
            db=args.db or None,
            host=args.host,
            port=args.port,
            allow_writes=args.allow_writes,
            token=os.environ.get(TOKEN_ENV) or None,
            sample_s=args.sample_interval,
        )
    except ValueError as exc:
        args.parser.error(str(exc))

    def ready(url: str) -> None:
        print(f"console on {url}", flush=True)

    try:
        serve(settings, ready)
    except KeyboardInterrupt:
        print("console stopped", file=sys.stderr)
    return 0
