"""Run every ``benchmarks/bench_*.py`` module; print their tables and one summary of the ratios.

A benchmark module takes part by exposing ``bench(context: Context) -> Report``
(``benchmarks/_common.py``): it measures against ``context.cluster`` (one broker for the whole
run), with tiny counts when ``context.quick``, and returns its table and its headline
``Ratio`` rows (bolide against the raw path, each with its target). Every module found on disk
runs, in ``KNOWN`` order first; a module with only a ``main(argv)`` is run through it (its table
printed, no ratios). Benchmarks whose optional dependencies are missing are skipped with a note,
and one failing benchmark does not stop the others.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/bench_x.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import contextlib
import importlib
import io
import json
import time
import traceback
from collections.abc import Sequence
from types import ModuleType
from typing import Any, TextIO

from benchmarks._common import (
    Context,
    Ratio,
    Skipped,
    broker_cluster,
    machine_info,
    ratios_table,
)

__all__ = ["KNOWN", "available", "main"]

#: Report order of the benchmarks the project has; others found on disk run after them.
KNOWN = (
    "facade",
    "meteor",
    "store",
    "confluent",
    "spark",
    "spark_cluster",
    "load",
    "resequencer",
    "parallel",
    "retries",
    "serdes",
    "eos",
    "outbox",
    "telemetry",
    "aio",
    "rebalance",
    "ledger",
    "producer",
)

_HERE = Path(__file__).resolve().parent
_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def available() -> list[str]:
    """Names (``bench_<name>.py``) of the benchmark modules present in this folder."""
    return sorted(p.stem.removeprefix("bench_") for p in _HERE.glob("bench_*.py"))


def _order(only: Sequence[str] | None, skip: Sequence[str] | None = None) -> list[str]:
    present = available()
    names = [n for n in KNOWN if n in present] + [n for n in present if n not in KNOWN]
    unknown = [n for n in [*(only or []), *(skip or [])] if n not in names and n not in KNOWN]
    if unknown:
        raise ValueError(f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(names)}")
    if only:
        names = [n for n in names if n in only] + [n for n in only if n not in names]
    return [n for n in names if n not in (skip or [])]


class _Tee(io.StringIO):
    """Keeps what is written and passes it on, so progress still shows while it is kept."""

    def __init__(self, through: TextIO) -> None:
        super().__init__()
        self._through = through

    def write(self, text: str) -> int:
        self._through.write(text)
        return super().write(text)


def _call(module: ModuleType, argv: list[str], *, capture: bool) -> tuple[int, str, str]:
    """Call ``module.main(argv)``; return (exit code, stdout if captured, stderr)."""
    out = io.StringIO()
    err = _Tee(sys.stderr)
    redirect_out = contextlib.redirect_stdout(out) if capture else contextlib.nullcontext()
    try:
        with redirect_out, contextlib.redirect_stderr(err):
            code = module.main(argv)
    except SystemExit as exc:  # an argparse error inside the module
        code = exc.code if isinstance(exc.code, int) else 1
    except Exception:
        traceback.print_exc()
        code = 1
    return int(code or 0), out.getvalue(), err.getvalue()


def _import(name: str) -> tuple[ModuleType | None, str | None]:
    """Import ``bench_<name>``; return (module, None) or (None, why it is skipped)."""
    if not (_HERE / f"bench_{name}.py").is_file():
        return None, f"benchmarks/bench_{name}.py is not present"
    try:
        return importlib.import_module(f"{__package__ or 'benchmarks'}.bench_{name}"), None
    except ImportError as exc:
        return None, f"cannot import bench_{name}: {exc}"


def _run_one(name: str, argv: list[str], *, capture: bool) -> tuple[int, str, str | None]:
    """Run ``bench_<name>.main(argv)``; return (exit code, captured stdout, skip reason).

    A module whose parser does not know the shared flags (``--json``, ``--bootstrap``) is run
    again without them; its text output is then kept as is.
    """
    module, skipped = _import(name)
    if module is None:
        return 0, "", skipped
    code, output, errors = _call(module, argv, capture=capture)
    if code == 2 and argv and "unrecognized arguments" in errors:
        print(
            f"[run_all] bench_{name} takes no {' '.join(argv)}; running it without", file=sys.stderr
        )
        code, output, _ = _call(module, [], capture=capture)
    return code, output, None


def _bench(module: ModuleType, context: Context) -> tuple[Any, str | None]:
    """Call ``module.bench(context)``; return (report, None) or (None, why it was skipped)."""
    try:
        return module.bench(context), None
    except ImportError as exc:  # an optional dependency (PySpark...) imported inside
        return None, f"needs {exc.name or exc}: {exc}"
    except Skipped as exc:
        return None, str(exc)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmarks; return 0 when all that ran succeeded, 1 if one failed, 2 on usage.

    A missed target is reported in the summary, not as a failure.
    """
    parser = argparse.ArgumentParser(prog="run_all", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--only", action="append", metavar="NAME", help=f"run only this one ({', '.join(KNOWN)})"
    )
    parser.add_argument("--skip", action="append", metavar="NAME", help="leave this one out")
    parser.add_argument("--quick", action="store_true", help="tiny counts: a smoke run")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--bootstrap", default=None, help="Kafka to use (default: embedded)")
    parser.add_argument("--pg", default=_PG, help="PostgreSQL URL for the store ('' to skip)")
    args = parser.parse_args(argv)
    try:
        names = _order(args.only, args.skip)
    except ValueError as exc:
        print(f"run_all: error: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()
    status = 0
    report: dict[str, Any] = {}
    ratios: list[Ratio] = []
    with broker_cluster(args.bootstrap) as (cluster, broker):
        context = Context(cluster, broker, quick=args.quick, pg_url=args.pg or None)
        for name in names:
            if not args.json:
                print(f"\n# benchmark: {name}\n", flush=True)
            module, skipped = _import(name)
            got: Any = None
            if module is not None and hasattr(module, "bench"):
                try:
                    got, skipped = _bench(module, context)
                except Exception:
                    traceback.print_exc()
                    status = 1
                    print(f"[run_all] {name} failed", file=sys.stderr)
                    report[name] = {"failed": 1}
                    continue
            if skipped:
                print(f"[run_all] skipped {name}: {skipped}", file=sys.stderr)
                report[name] = {"skipped": skipped}
                if not args.json:
                    print(f"_skipped: {skipped}_")
                continue
            if got is not None:
                ratios.extend(got.ratios)
                report[name] = got.as_dict()
                if not args.json:
                    print(f"## {got.title}\n\n{got.table}", flush=True)
                continue
            # A module with only main(argv): its own broker and output.
            child = (["--json"] if args.json else []) + (
                ["--bootstrap", args.bootstrap] if args.bootstrap else []
            )
            code, output, _ = _run_one(name, child, capture=args.json)
            if code:
                status = 1
                print(f"[run_all] {name} failed with exit code {code}", file=sys.stderr)
            if args.json:
                try:
                    report[name] = json.loads(output) if not code else {"failed": code}
                except json.JSONDecodeError:
                    report[name] = {"output": output}
    elapsed = time.monotonic() - started
    if args.json:
        doc = {
            "machine": machine_info(),
            "broker": broker,
            "quick": args.quick,
            "elapsed_s": round(elapsed, 1),
            "ratios": [r.as_dict() for r in ratios],
            "benchmarks": report,
        }
        print(json.dumps(doc, indent=2))
    elif ratios:
        missed = sum(r.met is False for r in ratios)
        print(
            f"\n# ratios and targets ({len(ratios)} ratios, {missed} targets missed; "
            f"{'quick run: figures not meaningful; ' if args.quick else ''}"
            f"{broker}, {elapsed:.0f} s)\n"
        )
        print(ratios_table(ratios))
    return status


if __name__ == "__main__":
    sys.exit(main())
