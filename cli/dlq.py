"""``bolide dlq list | show | replay | purge``: thin shims over ``bolide.stores.DeadLetters``.

Exit codes: 0 ok, 1 runtime failure (the broker or the database, an unknown dead letter, a
refused publish), 2 usage error (a missing flag, an unknown stream, a ``--where`` that is not
one read-only expression, dead letters with no source replayed without ``--to``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from bolide.cli.common import (
    add_cluster_arguments,
    add_db_argument,
    cluster_from_args,
    parse_time_ms,
)
from bolide.facade.errors import (
    DeadLetterFilterError,
    DeadLetterNotFoundError,
    DeadLetterSourceError,
)
from bolide.facade.ops.text import render_bytes, table, utc_text
from bolide.stores.deadletters import DeadLetter, DeadLetters
from bolide.stores.dialects import dialect_of
from bolide.stores.store import SqlStore

__all__ = ["register"]

_VALUE_WIDTH = 40


def register(subparsers: Any) -> None:
    """Add ``dlq`` and its actions to the ``bolide`` command line."""
    dlq = subparsers.add_parser(
        "dlq",
        help="list, show, replay and purge dead letters",
        description="The dead letters of a dead-letter stream, read from Kafka and the history "
        "database (--db) alike; replays and purges are kept in that database. See "
        "docs/dead-letters.md.",
    )
    sub = dlq.add_subparsers(dest="dlq_command", metavar="ACTION", required=True)
    listing = sub.add_parser("list", help="the dead letters of a stream")
    show = sub.add_parser("show", help="one dead letter: headers and payload")
    replay = sub.add_parser(
        "replay",
        help="publish dead letters again, to their source stream or to --to",
        description="Publish dead letters again, each with a bolide.replayed.from header; a "
        "dead letter is replayed to a stream once, however often the command runs.",
    )
    purge = sub.add_parser(
        "purge",
        help="remove dead letters for good",
        description="Mark dead letters purged, delete their archived rows, and delete from "
        "Kafka each partition's purged oldest records where the broker allows it.",
    )
    show.add_argument("id", help="<stream>/<partition>/<offset>, as list prints it")
    for parser in (listing, replay, purge):
        parser.add_argument("-t", "--stream", required=True, help="the dead-letter stream")
    for parser in (listing, purge):
        parser.add_argument("--reason", help="only this bolide.reason (failed, rejected...)")
        parser.add_argument("--since", help="only from this time: ISO 8601 (UTC) or epoch ms")
    purge.add_argument("--before", help="only before this time: ISO 8601 (UTC) or epoch ms")
    for parser in (replay, purge):
        parser.add_argument(
            "--where",
            help="SQL expression over the dead letters' columns, e.g. \"reason = 'failed'\"",
        )
    replay.add_argument("--to", help="publish to this stream (default: each one's source)")
    replay.add_argument(
        "--claim-timeout-s",
        type=float,
        default=300.0,
        metavar="S",
        help="take over claims a dead replay left, once this old and not in the target (300)",
    )
    purge.add_argument("--all", action="store_true", help="purge every dead letter of the stream")
    actions = ((listing, _list), (show, _show), (replay, _replay), (purge, _purge))
    for parser, func in actions:
        add_db_argument(
            parser,
            help="SQLAlchemy database URL of the history (default: $BOLIDE_DB); list and show "
            "read Kafka alone without it, replay and purge need it",
        )
        add_cluster_arguments(parser)
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        parser.set_defaults(func=func, parser=parser)


def _workbench(args: argparse.Namespace) -> DeadLetters:
    cluster = cluster_from_args(args)
    if not args.db:
        if args.dlq_command in ("replay", "purge"):
            args.parser.error(
                f"{args.dlq_command} keeps its state in a database: --db URL is required "
                "(or set $BOLIDE_DB)"
            )
        return DeadLetters(_kafka_only(), cluster)
    if "://" in args.db:  # else the store's own check names the problem
        url = sa.make_url(args.db)
        dialect_of(url).check_exists(url)  # a missing SQLite file is not created
    try:
        store = SqlStore(args.db)
    except (ValueError, TypeError) as error:
        args.parser.error(str(error))
    return DeadLetters(store, cluster)


def _kafka_only() -> SqlStore:
    """For ``list`` and ``show`` without ``--db``: an empty history in memory, so the dead
    letters are read from Kafka alone (none archived, none replayed or purged)."""
    store = SqlStore("sqlite://")
    store.upgrade()
    return store


def _time(args: argparse.Namespace, flag: str) -> int | None:
    text = getattr(args, flag)
    if text is None:
        return None
    try:
        return parse_time_ms(text)
    except ValueError:
        args.parser.error(f"--{flag} {text!r} is neither epoch milliseconds nor ISO 8601")
    return None  # not reached: error() exits


def _usage_errors(args: argparse.Namespace, run: Callable[[DeadLetters], int]) -> int:
    """Run ``run`` on a workbench; what the user must change in the command exits 2."""
    workbench = _workbench(args)
    try:
        return run(workbench)
    except (DeadLetterFilterError, DeadLetterSourceError) as error:
        args.parser.error(str(error))
    except DeadLetterNotFoundError as error:
        if args.dlq_command == "show":
            raise
        args.parser.error(str(error))
    finally:
        workbench.store.close()
    return 2  # not reached: error() exits


# -- list and show --------------------------------------------------------------------------


def _as_dict(letter: DeadLetter) -> dict[str, Any]:
    return {
        "id": letter.id,
        "stream": letter.stream,
        "partition": letter.partition,
        "offset": letter.offset,
        "timestamp_ms": letter.timestamp_ms,
        "reason": None if letter.reason is None else str(letter.reason),
        "detail": letter.detail,
        "source": letter.source,
        "key": None if letter.key is None else render_bytes(letter.key),
        "value": None if letter.value is None else render_bytes(letter.value),
        "headers": [[name, render_bytes(value)] for name, value in letter.headers],
        "archived": letter.archived,
        "replayed_to": list(letter.replayed_to),
    }


def _when(letter: DeadLetter) -> str:
    return utc_text(letter.timestamp)


def _list(args: argparse.Namespace) -> int:
    since = _time(args, "since")

    def run(workbench: DeadLetters) -> int:
        letters = workbench.list(args.stream, reason=args.reason, since=since)
        if args.json:
            print(json.dumps([_as_dict(d) for d in letters]))
            return 0
        columns = ["id", "time", "reason", "source", "key", "value", "replayed to"]
        rows = [
            (
                d.id,
                _when(d),
                d.reason,
                d.source,
                d.key,
                _cut(d.value),
                ",".join(d.replayed_to) or "-",
            )
            for d in letters
        ]
        print(table(columns, rows))
        print(f"({len(letters)} dead letters)", file=sys.stderr)
        return 0

    return _usage_errors(args, run)


def _cut(value: bytes | None) -> str | None:
    if value is None:
        return None
    text = render_bytes(value)
    return text if len(text) <= _VALUE_WIDTH else text[: _VALUE_WIDTH - 3] + "..."


def _show(args: argparse.Namespace) -> int:
    def run(workbench: DeadLetters) -> int:
        try:
            letter = workbench.show(args.id)
        except ValueError as error:
            args.parser.error(str(error))
        if args.json:
            print(json.dumps(_as_dict(letter)))
            return 0
        fields = _as_dict(letter)
        for name in ("id", "reason", "detail", "source", "timestamp_ms", "key", "archived"):
            print(f"{name}: {fields[name] if fields[name] is not None else '-'}")
        print(f"time: {_when(letter) or '-'}")
        print(f"replayed to: {', '.join(letter.replayed_to) or '-'}")
        print("headers:")
        for name, value in fields["headers"]:
            print(f"  {name}: {value}")
        print(f"value: {fields['value'] if fields['value'] is not None else 'NULL'}")
        return 0

    return _usage_errors(args, run)


# -- replay and purge -----------------------------------------------------------------------


def _progress(done: int, total: int) -> None:
    print(f"{done}/{total} dead letters replayed", file=sys.stderr, flush=True)


def _replay(args: argparse.Namespace) -> int:
    if args.claim_timeout_s < 0:
        args.parser.error("--claim-timeout-s must be >= 0")

    def run(workbench: DeadLetters) -> int:
        count = workbench.replay(
            args.stream,
            to=args.to,
            where=args.where,
            claim_timeout_s=args.claim_timeout_s,
            progress=_progress,
        )
        if args.json:
            print(json.dumps({"stream": args.stream, "replayed": count, "to": args.to}))
        else:
            print(f"replayed {count} dead letters of {args.stream}")
        return 0

    return _usage_errors(args, run)


def _purge(args: argparse.Namespace) -> int:
    since, before = _time(args, "since"), _time(args, "before")
    chosen = (args.reason, since, before, args.where)
    if args.all and any(c is not None for c in chosen):
        args.parser.error("--all purges every dead letter: it takes no filter")
    if not args.all and all(c is None for c in chosen):
        args.parser.error("say which dead letters: --reason, --since, --before, --where, or --all")

    def run(workbench: DeadLetters) -> int:
        count = workbench.purge(
            args.stream, reason=args.reason, since=since, before=before, where=args.where
        )
        if args.json:
            print(json.dumps({"stream": args.stream, "purged": count}))
        else:
            print(f"purged {count} dead letters of {args.stream}")
        return 0

    return _usage_errors(args, run)
