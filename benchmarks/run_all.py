"""Run every ``benchmarks/bench_*.py`` module and print all their tables (or one JSON document).

Benchmarks that are not present, or whose optional dependencies are missing, are skipped with
a note; one failing benchmark does not stop the others.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

from benchmarks._common import machine_info

__all__ = ["KNOWN", "available", "main"]

#: The benchmarks the project plans, in report order; others found on disk run after them.
KNOWN = ("facade", "load", "store", "resequencer", "parallel", "avro", "spark", "eos")

_HERE = Path(__file__).resolve().parent


def available() -> list[str]:
    """Names (``bench_<name>.py``) of the benchmark modules present in this folder."""
    return sorted(p.stem.removeprefix("bench_") for p in _HERE.glob("bench_*.py"))


def _order(only: Sequence[str] | None) -> list[str]:
    present = available()
    names = list(KNOWN) + [n for n in present if n not in KNOWN]
    if only:
        unknown = [n for n in only if n not in names]
        if unknown:
            raise ValueError(
                f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(names)}"
            )
        names = [n for n in names if n in only]
    return names


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


def _run_one(name: str, argv: list[str], *, capture: bool) -> tuple[int, str, str | None]:
    """Run ``bench_<name>.main(argv)``; return (exit code, captured stdout, skip reason).

    A module whose parser does not know the shared flags (``--json``, ``--bootstrap``) is run
    again without them; its text output is then kept as is.
    """
    if not (_HERE / f"bench_{name}.py").is_file():
        return 0, "", f"benchmarks/bench_{name}.py is not present"
    try:
        module = importlib.import_module(f"{__package__ or 'benchmarks'}.bench_{name}")
    except ImportError as exc:
        return 0, "", f"cannot import bench_{name}: {exc}"
    code, output, errors = _call(module, argv, capture=capture)
    if code == 2 and argv and "unrecognized arguments" in errors:
        print(
            f"[run_all] bench_{name} takes no {' '.join(argv)}; running it without", file=sys.stderr
        )
        code, output, _ = _call(module, [], capture=capture)
    return code, output, None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmarks; return 0 when all that ran succeeded, 1 if one failed, 2 on usage."""
    parser = argparse.ArgumentParser(prog="run_all", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--only", action="append", metavar="NAME", help=f"run only this one ({', '.join(KNOWN)})"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--bootstrap", default=None, help="Kafka to use (default: embedded)")
    args = parser.parse_args(argv)
    try:
        names = _order(args.only)
    except ValueError as exc:
        print(f"run_all: error: {exc}", file=sys.stderr)
        return 2
    child = ["--json"] if args.json else []
    if args.bootstrap:
        child += ["--bootstrap", args.bootstrap]
    started = time.monotonic()
    status = 0
    report: dict[str, Any] = {}
    for name in names:
        if not args.json:
            print(f"\n# benchmark: {name}\n", flush=True)
        code, output, skipped = _run_one(name, child, capture=args.json)
        if skipped:
            print(f"[run_all] skipped {name}: {skipped}", file=sys.stderr)
            report[name] = {"skipped": skipped}
            if not args.json:
                print(f"_skipped: {skipped}_")
            continue
        if code:
            status = 1
            print(f"[run_all] {name} failed with exit code {code}", file=sys.stderr)
        if args.json:
            try:
                report[name] = json.loads(output) if not code else {"failed": code}
            except json.JSONDecodeError:
                report[name] = {"output": output}
    if args.json:
        doc = {
            "machine": machine_info(),
            "elapsed_s": round(time.monotonic() - started, 1),
            "benchmarks": report,
        }
        print(json.dumps(doc, indent=2))
    return status


if __name__ == "__main__":
    sys.exit(main())
