"""The ``bolide`` command line: a thin shim over the programmatic API.

Exit codes: 0 ok, 1 runtime failure, 2 usage error. Each package adds its own subcommands
through a ``register(subparsers)`` function in its ``cli`` module.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from bolide.facade.errors import BolideError
from bolide.facade.redaction import redact_text

if TYPE_CHECKING:
    from bolide.facade.config import Cluster

__all__ = [
    "add_bootstrap_argument",
    "add_cluster_arguments",
    "add_db_argument",
    "cluster_from_args",
    "main",
]

log = logging.getLogger("bolide.cli")

#: Modules whose ``register(subparsers)`` adds subcommands, in help order.
_COMMAND_MODULES = (
    "bolide.facade._cli_tools",
    "bolide.stores.cli",
    "bolide.spark.cli",
)


def add_bootstrap_argument(parser: argparse.ArgumentParser) -> None:
    """``--bootstrap`` with the ``BOLIDE_BOOTSTRAP`` environment default."""
    parser.add_argument(
        "--bootstrap",
        default=os.environ.get("BOLIDE_BOOTSTRAP"),
        help="Kafka bootstrap servers (default: $BOLIDE_BOOTSTRAP)",
    )


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """``--bootstrap`` and kcat's ``-X KEY=VALUE`` (librdkafka settings, repeatable).

    Commands that take these build their ``Cluster`` with ``cluster_from_args``.
    """
    add_bootstrap_argument(parser)
    parser.add_argument(
        "-X",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka setting for every client (repeatable), or fetch_gap_settle_ms",
    )


def cluster_from_args(args: argparse.Namespace) -> Cluster:
    """The ``Cluster`` named by ``--bootstrap`` and ``-X``; a usage error (exit 2) if invalid."""
    from bolide.facade.config import Cluster

    parser: argparse.ArgumentParser = args.parser
    if not args.bootstrap:
        parser.error("--bootstrap HOST:PORT is required (or set $BOLIDE_BOOTSTRAP)")
    settings: dict[str, Any] = {}
    for item in args.settings:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"-X expects KEY=VALUE, got {item!r}")
        settings[key] = value
    if "fetch_gap_settle_ms" in settings:
        try:
            settings["fetch_gap_settle_ms"] = int(settings["fetch_gap_settle_ms"])
        except ValueError:
            parser.error("-X fetch_gap_settle_ms expects an integer")
    try:
        return Cluster(args.bootstrap, **settings)
    except (ValueError, TypeError) as error:
        parser.error(str(error))
        raise  # pragma: no cover - error() exits


def add_db_argument(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """``--db`` with the ``BOLIDE_DB`` environment default."""
    parser.add_argument(
        "--db",
        default=os.environ.get("BOLIDE_DB"),
        help="SQLAlchemy database URL (default: $BOLIDE_DB)",
    )


def _broker(args: argparse.Namespace) -> int:
    from bolide.facade.broker import EmbeddedBroker

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with EmbeddedBroker(port=args.port, log_path=args.log) as broker:
        print(f"broker listening on {broker.bootstrap_servers} (log: {broker.log_path})")
        print(f"export BOLIDE_BOOTSTRAP={broker.bootstrap_servers}", flush=True)
        try:
            while not stop.wait(0.5):
                if not broker.running:
                    print("broker exited; see its log", file=sys.stderr)
                    return 1
        except KeyboardInterrupt:
            pass
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The full ``bolide`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="bolide", description="Meteor's streaming API on Kafka, with SQL history and Spark."
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logs (-vv: debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    broker = sub.add_parser("broker", help="run an embedded broker in the foreground")
    broker.add_argument("--port", type=int, default=9092, help="port to listen on (default 9092)")
    broker.add_argument("--log", default=None, help="broker log file (default: a temp file)")
    broker.set_defaults(func=_broker)
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name not in (name, "pyspark"):  # bolide.spark without the spark extra
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except BolideError as exc:
        print(f"bolide: error: {redact_text(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
