"""The ``bolide`` command line: a thin shim over the programmatic API.

Exit codes: 0 ok, 1 runtime failure, 2 usage error. Each command group is a module of this
package with a ``register(subparsers)`` function.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any, TypeVar

from bolide.facade import describe_record_path
from bolide.facade.errors import BolideError
from bolide.facade.redaction import redact_text

__all__ = ["build_parser", "main"]

log = logging.getLogger("bolide.cli")

_ActionT = TypeVar("_ActionT", bound=argparse.Action)

#: Modules whose ``register(subparsers)`` adds subcommands, in help order.
_COMMAND_MODULES = (
    "bolide.cli.broker",
    "bolide.cli.bench",
    "bolide.cli.demo",
    "bolide.cli.stream",
    "bolide.cli.store",
    "bolide.cli.durable",
    "bolide.cli.dlq",
    "bolide.cli.outbox",
    "bolide.cli.ops",
    "bolide.cli.top",
    "bolide.cli.spark",
    "bolide.console.command",
)


class _Parser(argparse.ArgumentParser):
    """No abbreviated options: ``--partition`` never silently means ``--partitions``. Every
    subcommand's parser is one too (``add_subparsers`` makes parsers of its own class).

    An argument a parser does not know is refused by that parser, with its own usage and the
    nearest option it does know, instead of being handed up to ``bolide``'s usage."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        self.known_options: list[str] = []
        super().__init__(*args, **kwargs)

    def _add_action(self, action: _ActionT) -> _ActionT:
        # Every option comes through here, mutually exclusive groups' included.
        self.known_options.extend(action.option_strings)
        return super()._add_action(action)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._nearest(extras)}")
        return parsed, extras

    def _nearest(self, extras: Sequence[str]) -> str:
        """`` (did you mean --x?)`` for the first unknown option that resembles a known one."""
        for arg in extras:
            if arg.startswith("-"):
                name = arg.split("=", 1)[0]
                close = difflib.get_close_matches(name, self.known_options, n=1, cutoff=0.6)
                if close:
                    return f" (did you mean {close[0]}?)"
        return ""


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
    parser.add_argument(
        "--version", action="version", version=f"bolide {_version()}, {describe_record_path()}"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name not in (name, "pyspark"):  # bolide.spark without the spark extra
                raise
            _register_missing_extra(sub, name.rpartition(".")[2])
            continue
        module.register(sub)
    return parser


def _register_missing_extra(subparsers: Any, command: str) -> None:
    """``bolide COMMAND``, whose extra is not installed: any use says how to install it."""
    stub = subparsers.add_parser(
        command,
        help=f"(needs pip install 'bolide[{command}]')",
        description=f"Not installed: pip install 'bolide[{command}]'.",
    )
    stub.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def missing(args: argparse.Namespace) -> int:
        raise BolideError(
            f"bolide {command} needs the {command} extra, which is not installed: "
            f"pip install 'bolide[{command}]'"
        )

    stub.set_defaults(func=missing, parser=stub)


#: kcat's mode flags, taken for the commands they mean: ``bolide -C -t s`` is ``bolide tail``.
_KCAT_MODES = {"-C": "tail", "-P": "publish"}


def _kcat_mode(argv: Sequence[str]) -> list[str]:
    """``argv`` with a leading kcat mode flag (after any ``-v``) replaced by its command."""
    args = list(argv)
    for index, arg in enumerate(args):
        if arg in _KCAT_MODES:
            args[index] = _KCAT_MODES[arg]
        if arg not in ("-v", "-vv", "--verbose"):
            break
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit code."""
    parser = build_parser()
    args = parser.parse_args(_kcat_mode(sys.argv[1:] if argv is None else argv))
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except BolideError as exc:
        print(f"bolide: error: {redact_text(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """End quietly once standard output's reader is gone (``bolide tail | head -2``).

    As coreutils' ``cat`` and ``yes`` do: no message, and the status of a process that
    SIGPIPE ended, 128 + 13 = 141, which is what a shell reports for them (kcat instead
    prints a write error and exits 1). Standard output then points at /dev/null, so the
    interpreter's last flush of what is still buffered cannot fail again.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
