"""The ``bolide`` command line: a thin shim over the programmatic API.

Exit codes: 0 ok, 1 runtime failure, 2 usage error. Each command group is a module of this
package with a ``register(subparsers)`` function.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from bolide.facade.errors import BolideError
from bolide.facade.redaction import redact_text

if TYPE_CHECKING:
    pass

__all__ = ["build_parser", "main"]

log = logging.getLogger("bolide.cli")

#: Modules whose ``register(subparsers)`` adds subcommands, in help order.
_COMMAND_MODULES = (
    "bolide.facade.cli.bench",
    "bolide.facade.cli.demo",
    "bolide.facade.cli.stream",
    "bolide.facade.cli.store",
    "bolide.facade.cli.durable",
    "bolide.facade.cli.ops",
    "bolide.facade.cli.top",
    "bolide.facade.cli.spark",
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
