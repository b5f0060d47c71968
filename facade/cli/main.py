"""The ``bolide`` command line: a thin shim over the programmatic API.

Exit codes: 0 ok, 1 runtime failure, 2 usage error. Each command group is a module of this
package with a ``register(subparsers)`` function.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from bolide.facade.errors import BolideError
from bolide.facade.redaction import redact_text

__all__ = ["build_parser", "main"]

log = logging.getLogger("bolide.cli")

#: Modules whose ``register(subparsers)`` adds subcommands, in help order.
_COMMAND_MODULES = (
    "bolide.facade.cli.broker",
    "bolide.facade.cli.bench",
    "bolide.facade.cli.demo",
    "bolide.facade.cli.stream",
    "bolide.facade.cli.store",
    "bolide.facade.cli.durable",
    "bolide.facade.cli.dlq",
    "bolide.facade.cli.outbox",
    "bolide.facade.cli.ops",
    "bolide.facade.cli.top",
    "bolide.facade.cli.spark",
)


class _Parser(argparse.ArgumentParser):
    """No abbreviated options: ``--partition`` never silently means ``--partitions``. Every
    subcommand's parser is one too (``add_subparsers`` makes parsers of its own class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)


def _version() -> str:
    try:
        return metadata.version("bolide")
    except metadata.PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The full ``bolide`` argument parser."""
    parser = _Parser(
        prog="bolide", description="Meteor's streaming API on Kafka, with SQL history and Spark."
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logs (-vv: debug)")
    parser.add_argument("--version", action="version", version=f"bolide {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
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
