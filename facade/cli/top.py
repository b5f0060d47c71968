"""``bolide top``: a live view of streams, rates, lag per group and partition, the archive and
durable clients, refreshed like ``top`` (Rich). A thin shim over ``bolide.facade.ops``.

Exit codes: 0 ok (also on Ctrl-C), 1 runtime failure, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import ExitStack
from datetime import datetime
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from bolide.facade.cli.ops import add_scope_arguments, checked_cluster, report_from_args
from bolide.facade.ops import LagReport, Rates, rates

__all__ = ["register", "render"]

_BAR_WIDTH = 24


def register(subparsers: Any) -> None:
    """Add ``top`` to the ``bolide`` command line."""
    top = subparsers.add_parser(
        "top",
        help="live view: streams, publish and consume rates, lag bars, archive, durable",
        description="Refreshes every --interval seconds until Ctrl-C (or --iterations N "
        "updates): each stream's records and publish rate, each group's lag per partition as "
        "a bar with its consume rate (from committed offsets), and with --db the archive's "
        "lag and rate and the durable clients away with their backlog. --json prints one "
        "JSON object per update instead.",
    )
    add_scope_arguments(top)
    top.add_argument(
        "--interval", type=float, default=2.0, metavar="S", help="seconds between updates (2)"
    )
    top.add_argument(
        "--iterations", type=int, default=None, metavar="N", help="stop after N updates"
    )
    top.set_defaults(func=_top, parser=top)


def _top(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        args.parser.error("--interval must be above 0")
    if args.iterations is not None and args.iterations < 1:
        args.parser.error("--iterations must be at least 1")
    cluster = checked_cluster(args)
    console = Console(highlight=False)
    title = f"bolide top - {cluster.bootstrap_servers}"
    with ExitStack() as stack:
        previous: LagReport | None = None
        live: Live | None = None
        update = 0
        try:
            while args.iterations is None or update < args.iterations:
                if update:
                    time.sleep(args.interval)
                report = report_from_args(args, cluster, stack, all_streams=True)
                speed = rates(previous, report) if previous is not None else None
                previous = report
                update += 1
                if args.json:
                    print(json.dumps(_json(report, speed, update)), flush=True)
                    continue
                view = render(report, speed, title=f"{title} - update {update}")
                if live is None:
                    live = stack.enter_context(
                        Live(view, console=console, auto_refresh=False, transient=False)
                    )
                live.update(view, refresh=True)
        except KeyboardInterrupt:
            return 0
    return 0


def _json(report: LagReport, speed: Rates | None, update: int) -> dict[str, Any]:
    out = report.to_dict() | {"update": update}
    if speed is not None:
        out["rates"] = {
            "published": speed.published,
            "consumed": [
                {"group": g, "stream": s, "partition": p, "per_s": r}
                for (g, s, p), r in speed.consumed.items()
            ],
            "archived": [
                {"stream": s, "partition": p, "per_s": r} for (s, p), r in speed.archived.items()
            ],
        }
    return out


def _bar(value: int, top: int) -> Text:
    filled = 0 if top <= 0 else round(_BAR_WIDTH * min(value, top) / top)
    if value > 0:
        filled = max(filled, 1)
    style = "green" if value == 0 else ("yellow" if value < top else "red")
    return Text("█" * filled, style=style) + Text("·" * (_BAR_WIDTH - filled), style="dim")


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def render(report: LagReport, speed: Rates | None, *, title: str = "bolide top") -> Group:
    """One screen of ``bolide top``: streams, group lags, archive, durable clients."""
    when = datetime.fromtimestamp(report.taken_ms / 1000).strftime("%H:%M:%S")
    parts: list[Any] = [Text(f"{title} - {when}", style="bold")]
    streams = Table(title="streams", title_justify="left", expand=False)
    for name in ("STREAM", "PARTITIONS", "LOG-END", "PUBLISH/S"):
        streams.add_column(name, justify="left" if name == "STREAM" else "right")
    by_stream: dict[str, list[int]] = {}
    for (stream, _), end in sorted(report.ends.items()):
        by_stream.setdefault(stream, []).append(end)
    for stream, ends in by_stream.items():
        rate = speed.published.get(stream, 0.0) if speed is not None else None
        streams.add_row(stream, str(len(ends)), f"{sum(ends):,}", _rate(rate))
    parts.append(streams if by_stream else Text("streams: none"))

    top = max([r.lag for r in report.partitions] + [a.lag for a in report.archive], default=0)
    lags = Table(title="lag per group and partition", title_justify="left")
    for name in ("GROUP", "STREAM", "P", "COMMITTED", "LOG-END", "LAG"):
        lags.add_column(name, justify="left" if name in {"GROUP", "STREAM"} else "right")
    lags.add_column("", min_width=_BAR_WIDTH, no_wrap=True)
    lags.add_column("CONSUMED/S", justify="right")
    lags.add_column("OWNER")
    for r in report.partitions:
        rate = speed.consumed.get((r.group, r.stream, r.partition)) if speed is not None else None
        lags.add_row(
            r.group,
            r.stream,
            str(r.partition),
            "-" if r.committed is None else f"{r.committed:,}",
            f"{r.log_end:,}",
            f"{r.lag:,}",
            _bar(r.lag, top),
            _rate(rate),
            r.client_id or r.member_id or "-",
        )
    parts.append(lags if report.partitions else Text("groups: none"))

    if report.archive:
        archive = Table(title="archive", title_justify="left")
        for name in ("STREAM", "P", "POSITION", "LOG-END", "LAG"):
            archive.add_column(name, justify="left" if name == "STREAM" else "right")
        archive.add_column("", min_width=_BAR_WIDTH, no_wrap=True)
        archive.add_column("ARCHIVED/S", justify="right")
        for a in report.archive:
            rate = speed.archived.get((a.stream, a.partition)) if speed is not None else None
            archive.add_row(
                a.stream,
                str(a.partition),
                f"{a.position:,}",
                f"{a.log_end:,}",
                f"{a.lag:,}",
                _bar(a.lag, top),
                _rate(rate),
            )
        parts.append(archive)
    if report.durable:
        durable = Table(title="durable clients", title_justify="left")
        for name in ("CLIENT", "STATE", "AWAY", "BACKLOG"):
            durable.add_column(name, justify="right" if name in {"AWAY", "BACKLOG"} else "left")
        for d in report.durable:
            durable.add_row(d.durable_id, d.state, f"{d.away_s:,.0f}s", f"{d.total:,}")
        parts.append(durable)
    return Group(*parts)
