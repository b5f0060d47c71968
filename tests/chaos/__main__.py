"""``python -m tests.chaos [--minutes N] [--workload NAME] [--seed S]`` (``./dev chaos``):
run a campaign, print its table, exit 1 on any anomaly beyond a workload's promise."""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from tests.chaos.campaign import Outcome, run
from tests.chaos.nemesis import KINDS
from tests.chaos.workloads import WORKLOADS


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="./dev chaos", description=__doc__)
    parser.add_argument("--minutes", type=float, default=3.0, help="faults for this long")
    parser.add_argument(
        "--workload",
        action="append",
        choices=sorted(WORKLOADS),
        help="a workload to run (repeat for several; default: all)",
    )
    parser.add_argument("--seed", type=int, default=None, help="the nemesis' seed")
    parser.add_argument(
        "--fault", action="append", choices=KINDS, help="a fault kind (default: all)"
    )
    parser.add_argument("--rate", type=float, default=40.0, help="records/s per workload")
    parser.add_argument("--folder", type=Path, default=None, help="histories and logs")
    return parser


def table(outcome: Outcome) -> str:
    """The run as Markdown: faults injected per kind, then one row of counts per workload."""
    faults = ", ".join(f"{kind} {count}" for kind, count in outcome.faults.items())
    columns = list(dict.fromkeys(key for counts in outcome.results.values() for key in counts))
    lines = [
        f"seed {outcome.seed}, {outcome.minutes:g} min of faults ({faults}), "
        f"{outcome.operations} operations recorded"
        + (" (interrupted: no drain)" if outcome.interrupted else ""),
        "",
        "| workload | " + " | ".join(columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for name, counts in outcome.results.items():
        cells = [str(counts[c]) if c in counts else "-" for c in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    args = _parser().parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    folder = args.folder or Path(tempfile.gettempdir()) / f"bolide-chaos-{seed}-{int(time.time())}"
    print(f"chaos: seed {seed}, histories in {folder}", file=sys.stderr)
    outcome = run(
        folder,
        minutes=args.minutes,
        workloads=args.workload or sorted(WORKLOADS),
        seed=seed,
        kinds=tuple(args.fault or KINDS),
        rate=args.rate,
    )
    print(table(outcome))
    for failure in outcome.failures:
        print(f"ANOMALY {failure}", file=sys.stderr)
    return 1 if outcome.failures else 0


if __name__ == "__main__":
    sys.exit(main())
