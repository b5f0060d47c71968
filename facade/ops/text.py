"""How the command line and the demo print rows and bytes: plain-text tables, psql's layout."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

__all__ = ["json_cell", "render_bytes", "table", "utc_text"]

_CELL_WIDTH = 60  # longer cells are cut, with "..."


def json_cell(value: Any) -> Any:
    """A query cell as a JSON value: bytes as ``render_bytes`` text, what JSON lacks as its
    text."""
    if isinstance(value, bytes | bytearray | memoryview):
        return render_bytes(bytes(value))
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _text(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bytes | bytearray | memoryview):
        return render_bytes(bytes(value))
    return str(value)


def render_bytes(value: bytes) -> str:
    """UTF-8 text when the bytes are printable text, else ``\\x`` and hex (PostgreSQL's way)."""
    try:
        text = value.decode()
    except UnicodeDecodeError:
        return "\\x" + value.hex()
    return text if text.isprintable() else "\\x" + value.hex()


def utc_text(when: datetime.datetime | int | None) -> str:
    """A time (a datetime, or epoch milliseconds) as ISO 8601 UTC to the second, ``Z``
    suffixed; ``""`` for ``None``."""
    if when is None:
        return ""
    if isinstance(when, int):
        when = datetime.datetime.fromtimestamp(when / 1000, datetime.UTC)
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


def table(columns: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> str:
    """``rows`` under ``columns``, padded to line up; NULL for None, bytes as ``render_bytes``."""

    def cell(value: Any) -> str:
        text = _text(value)
        return text if len(text) <= _CELL_WIDTH else text[: _CELL_WIDTH - 3] + "..."

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    lines = [
        " | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)),
        "-+-".join("-" * w for w in widths),
    ]
    lines.extend(" | ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells)
    return "\n".join(lines)
