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

from bolide.cli.ops import add_scope_arguments, checked_cluster, report_from_args
from bolide.facade.ops import LagReport, Rates, rates

__all__ = ["register", "render"]

_BAR_WIDTH = 24
_NARROW_BAR_WIDTH = 5  # below 110 columns
_BAR_FLOOR = 100  # records: the smallest scale a bar is drawn on
_MIN_NAME = 8  # characters of a name column (folded), however narrow the screen


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
                view = render(
                    report, speed, title=f"{title} - update {update}", width=console.width
                )
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


def _bar(value: int, top: int, width: int) -> Text:
    """A bar proportional to ``value``: full at the largest lag shown, but never on a scale
    below ``_BAR_FLOOR`` records, so a lag of a few records draws a sliver, not a full bar."""
    scale = max(top, _BAR_FLOOR)
    filled = round(width * min(value, scale) / scale)
    if value > 0:
        filled = max(filled, 1)
    style = "green" if value == 0 else ("red" if value >= _BAR_FLOOR and value == top else "yellow")
    return Text("█" * filled, style=style) + Text("·" * (width - filled), style="dim")


def _table(title: str, columns: list[tuple[str, str]], rows: list[list[Any]], width: int) -> Table:
    """A table ``width`` columns wide at most. ``number`` and ``bar`` columns are never
    narrowed (never cut); ``text`` columns (group and stream names) are shown whole, folded
    over several lines on a narrow screen; ``minor`` columns (the owner) take what is left,
    cut with an ellipsis, and are left out when too little is."""
    table = Table(title=title, title_justify="left")
    widest = [
        max([len(name), *(len(row[i]) for row in rows)]) for i, (name, _) in enumerate(columns)
    ]
    kinds = [kind for _, kind in columns]
    fixed = sum(w for w, kind in zip(widest, kinds, strict=True) if kind in ("number", "bar"))
    names = [i for i, kind in enumerate(kinds) if kind == "text"]
    room = width - fixed - 3 * len(columns) - 1
    left = room - sum(widest[i] for i in names)
    shown = [i for i, kind in enumerate(kinds) if kind != "minor" or left >= _MIN_NAME]
    if len(shown) < len(columns):  # the minor columns are left out: their padding is room
        room += 3 * (len(columns) - len(shown))
    name_widths = _share([widest[i] for i in names], room)
    for index in shown:
        name, kind = columns[index]
        if kind == "text":
            width_of = name_widths[names.index(index)]
            table.add_column(name, overflow="fold", width=width_of)
        elif kind == "minor":
            table.add_column(name, no_wrap=True, overflow="ellipsis", max_width=left)
        else:
            table.add_column(
                name,
                justify="right" if kind == "number" else "left",
                no_wrap=True,
                min_width=widest[index],
            )
    for row in rows:
        table.add_row(*(row[i] for i in shown))
    return table


def _share(wanted: list[int], room: int) -> list[int]:
    """Widths for columns that want ``wanted`` within ``room``: each gets what it wants when
    all fit; otherwise the narrow ones keep theirs and the wide ones split the rest evenly
    (never below ``_MIN_NAME``)."""
    widths = list(wanted)
    open_ = sorted(range(len(wanted)), key=lambda i: wanted[i])
    while open_:
        fair = max(_MIN_NAME, room // len(open_))
        if wanted[open_[0]] > fair:
            for i in open_:
                widths[i] = fair
            break
        room -= wanted[open_[0]]
        open_.pop(0)
    return widths


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def render(
    report: LagReport, speed: Rates | None, *, title: str = "bolide top", width: int = 120
) -> Group:
    """One screen of ``bolide top``, ``width`` columns wide: streams, group lags, archive,
    durable clients, share groups. Numbers are never cut; names are, with an ellipsis, on a
    narrow screen."""
    bar = _BAR_WIDTH if width >= 110 else _NARROW_BAR_WIDTH
    when = datetime.fromtimestamp(report.taken_ms / 1000).strftime("%H:%M:%S")
    parts: list[Any] = [Text(f"{title} - {when}", style="bold"), _streams(report, speed, width)]
    lags = [r.lag for r in report.partitions] + [a.lag for a in report.archive]
    top = max(lags + [q.backlog for q in report.share], default=0)
    parts.append(_lags(report, speed, width, top, bar))
    if report.archive:
        parts.append(_archive(report, speed, width, top, bar))
    if report.durable:
        rows = [
            [d.durable_id, d.state, f"{d.away_s:,.0f}s", f"{d.total:,}"] for d in report.durable
        ]
        columns = [("CLIENT", "text"), ("STATE", "text"), ("AWAY", "number")]
        parts.append(_table("durable clients", [*columns, ("BACKLOG", "number")], rows, width))
    if report.share:
        queues: list[list[Any]] = [
            [q.group, q.stream, str(q.partition), f"{q.backlog:,}", _bar(q.backlog, top, bar)]
            for q in report.share
        ]
        shared = [("SHARE GROUP", "text"), ("STREAM", "text"), ("P", "number")]
        shared += [("BACKLOG", "number"), ("", "bar")]
        parts.append(_table("share groups", shared, queues, width))
    return Group(*parts)


def _streams(report: LagReport, speed: Rates | None, width: int) -> Table | Text:
    by_stream: dict[str, list[int]] = {}
    for (stream, _), end in sorted(report.ends.items()):
        by_stream.setdefault(stream, []).append(end)
    rows: list[list[Any]] = []
    for stream, ends in by_stream.items():
        rate = speed.published.get(stream, 0.0) if speed is not None else None
        rows.append([stream, str(len(ends)), f"{sum(ends):,}", _rate(rate)])
    columns = [("STREAM", "text"), ("PARTITIONS", "number"), ("LOG-END", "number")]
    streams = _table("streams", [*columns, ("PUBLISH/S", "number")], rows, width)
    return streams if by_stream else Text("streams: none")


def _lags(report: LagReport, speed: Rates | None, width: int, top: int, bar: int) -> Table | Text:
    rows: list[list[Any]] = []
    for r in report.partitions:
        rate = speed.consumed.get((r.group, r.stream, r.partition)) if speed is not None else None
        rows.append(
            [
                r.group,
                r.stream,
                str(r.partition),
                "-" if r.committed is None else f"{r.committed:,}",
                f"{r.log_end:,}",
                f"{r.lag:,}",
                _bar(r.lag, top, bar),
                _rate(rate),
                r.client_id or r.member_id or "-",
            ]
        )
    columns = [("GROUP", "text"), ("STREAM", "text"), ("P", "number")]
    columns += [("COMMITTED", "number"), ("LOG-END", "number"), ("LAG", "number")]
    columns += [("", "bar"), ("CONSUMED/S", "number"), ("OWNER", "minor")]
    lags = _table("lag per group and partition", columns, rows, width)
    return lags if report.partitions else Text("groups: none")


def _archive(report: LagReport, speed: Rates | None, width: int, top: int, bar: int) -> Table:
    rows: list[list[Any]] = []
    for a in report.archive:
        rate = speed.archived.get((a.stream, a.partition)) if speed is not None else None
        rows.append(
            [
                a.stream,
                str(a.partition),
                f"{a.position:,}",
                f"{a.log_end:,}",
                f"{a.lag:,}",
                _bar(a.lag, top, bar),
                _rate(rate),
            ]
        )
    columns = [("STREAM", "text"), ("P", "number"), ("POSITION", "number")]
    columns += [("LOG-END", "number"), ("LAG", "number"), ("", "bar")]
    return _table("archive", [*columns, ("ARCHIVED/S", "number")], rows, width)
