"""``bolide bench``: runs the benchmarks of a source checkout (``benchmarks/run_all.py``).

The benchmarks are not part of the installed package: they live beside the package folders in
the repository, so the command finds them relative to this file (or ``--dir``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from bolide.cli.common import add_bootstrap_argument
from bolide.facade.errors import BolideError

__all__ = ["benchmarks_dir", "load_benchmarks", "register"]

_PACKAGE = "benchmarks"
_PEERS_BENCHMARK = "peers"


def benchmarks_dir() -> Path:
    """Where a source checkout keeps its benchmarks: ``<repo>/benchmarks``.

    The first folder above this file holding ``benchmarks/run_all.py`` (the package folders sit
    at the repository's root, so that is the repository); ``<repo>/benchmarks`` as a guess when
    none does (``load_benchmarks`` then explains).
    """
    here = Path(__file__).resolve()
    for folder in here.parents:
        if (folder / _PACKAGE / "run_all.py").is_file():
            return folder / _PACKAGE
    return here.parents[1] / _PACKAGE


def load_benchmarks(folder: Path | None = None) -> ModuleType:
    """Import ``benchmarks.run_all`` from ``folder`` (default: the source checkout's).

    Raises:
        BolideError: The folder, or its ``run_all.py``, is missing (e.g. bolide was installed
            from a wheel, which does not ship the benchmarks).
    """
    folder = (folder or benchmarks_dir()).resolve()
    init = folder / "__init__.py"
    if not init.is_file() or not (folder / "run_all.py").is_file():
        raise BolideError(
            f"no benchmarks found at {folder}: `bolide bench` runs from a source checkout "
            "(git clone the repository, then `pip install -e .`), or pass --dir"
        )
    loaded = sys.modules.get(_PACKAGE)
    if loaded is None or Path(getattr(loaded, "__file__", "") or "").resolve() != init:
        spec = importlib.util.spec_from_file_location(
            _PACKAGE, init, submodule_search_locations=[str(folder)]
        )
        assert spec is not None and spec.loader is not None
        package = importlib.util.module_from_spec(spec)
        for name in [n for n in sys.modules if n.startswith(f"{_PACKAGE}.")]:
            del sys.modules[name]  # modules of another benchmarks folder
        sys.modules[_PACKAGE] = package
        spec.loader.exec_module(package)
    if folder.name == _PACKAGE and str(folder.parent) not in sys.path:
        # A benchmark's spawned processes import it by name, from the paths they inherit.
        sys.path.append(str(folder.parent))
    return importlib.import_module(f"{_PACKAGE}.run_all")


def _bench(args: argparse.Namespace) -> int:
    run_all = load_benchmarks(Path(args.dir) if args.dir else None)
    argv: list[str] = []
    if args.peers:
        _check_peers()  # before the broker starts: a missing peer is a usage error
        argv += ["--only", _PEERS_BENCHMARK]
    for name in args.only or []:
        argv += ["--only", name]
    for name in args.skip or []:
        argv += ["--skip", name]
    if args.quick:
        argv.append("--quick")
    if args.pg is not None:
        argv += ["--pg", args.pg]
    if args.json:
        argv.append("--json")
    if args.bootstrap:
        argv += ["--bootstrap", args.bootstrap]
    if args.engine != "auto":
        os.environ["BOLIDE_ENGINE"] = args.engine  # what EmbeddedBroker(engine="auto") runs
    return int(run_all.main(argv))


def _check_peers() -> None:
    """Raise ``BolideError`` naming the install command when a peer client is missing (or the
    checkout has no peers benchmark)."""
    try:
        peers = importlib.import_module(f"{_PACKAGE}.bench_{_PEERS_BENCHMARK}")
    except ImportError as exc:
        raise BolideError(f"no peers benchmark in this checkout: {exc}") from exc
    missing: list[str] = peers.missing_peers()
    if missing:
        raise BolideError(
            f"--peers compares bolide with other Python Kafka clients; {', '.join(missing)} "
            "not installed: pip install 'bolide[bench]'"
        )


def register(subparsers: Any) -> None:
    """Add ``bolide bench``."""
    bench = subparsers.add_parser(
        "bench",
        help="run the benchmarks (source checkout only)",
        description=(
            "Run benchmarks/bench_*.py against one broker; print their tables, then every ratio "
            "with its target and whether it is met (see docs/performance.md)."
        ),
    )
    bench.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="run only this benchmark (facade, meteor, store, spark, ...); repeatable",
    )
    bench.add_argument("--skip", action="append", metavar="NAME", help="leave this one out")
    bench.add_argument(
        "--peers",
        action="store_true",
        help=(
            "compare bolide with aiokafka, kafka-python and FastStream on the same work "
            "(the peers benchmark, with any --only; needs pip install 'bolide[bench]')"
        ),
    )
    bench.add_argument(
        "--quick", action="store_true", help="tiny counts: a smoke run, figures not meaningful"
    )
    bench.add_argument(
        "--pg", default=None, help="PostgreSQL URL for the store benchmark ('' to skip it)"
    )
    bench.add_argument(
        "--engine",
        choices=("auto", "kafka", "tansu"),
        default="auto",
        help="embedded broker when no --bootstrap is given (default: Apache Kafka if it runs)",
    )
    bench.add_argument("--json", action="store_true", help="print one JSON document")
    bench.add_argument("--dir", default=None, help="benchmarks folder (default: the checkout's)")
    add_bootstrap_argument(bench)
    bench.set_defaults(func=_bench)
