"""``bolide demo``: a thin shim over ``bolide.demo.run.run_demo``.

Exit codes: 0 every check passed, 1 a check failed or a step stalled, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from bolide.cli.common import add_bootstrap_argument, add_db_argument

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``bolide demo``."""
    demo = subparsers.add_parser(
        "demo",
        help="run the end-to-end stock-order demo (embedded broker and SQLite by default)",
        description="Venues publish Avro orders for a dozen symbols; a subscriber group of "
        "three processes them in per-symbol order while one member leaves; the archiver "
        "copies them into SQL; a durable client disconnects, replays what it missed and goes "
        "live; multi-part orders are resequenced; Spark archives and queries the stream. "
        "Ends with SQL over the archive and a checked summary. Without --bootstrap (or "
        "$BOLIDE_BOOTSTRAP) it starts an embedded broker; without --db (or $BOLIDE_DB) it "
        "uses a SQLite file in a temporary directory (or in --workdir).",
    )
    demo.add_argument("--quick", action="store_true", help="skip the Spark step")
    demo.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_bootstrap_argument(demo)
    add_db_argument(demo)
    demo.add_argument(
        "--workdir", default=None, help="keep the demo's files (SQLite, Spark) in this folder"
    )
    demo.add_argument("--orders", type=int, default=3_000, help="plain orders (default 3000)")
    demo.add_argument("--blocks", type=int, default=8, help="multi-part orders (default 8)")
    demo.add_argument("--seed", type=int, default=7, help="seed of the generated orders")
    demo.set_defaults(func=_demo, parser=demo)


def _demo(args: argparse.Namespace) -> int:
    from bolide.demo.report import print_summary
    from bolide.demo.run import DemoOptions, Progress, run_demo

    if args.orders < 300:
        args.parser.error("--orders must be at least 300 (a hundred per burst)")
    if args.blocks < 2:
        args.parser.error("--blocks must be at least 2")
    options = DemoOptions(
        quick=args.quick,
        bootstrap=args.bootstrap,
        db=args.db,
        workdir=args.workdir,
        orders=args.orders,
        blocks=args.blocks,
        seed=args.seed,
    )
    # With --json, stdout holds only the summary; the progress lines go to stderr.
    summary = run_demo(options, Progress(sys.stderr if args.json else sys.stdout))
    if args.json:
        print(json.dumps(summary.to_json(), indent=2))
    else:
        print_summary(summary, sys.stdout)
    return 0 if summary.ok else 1
