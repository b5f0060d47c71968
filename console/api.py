"""The console's JSON API under ``/api/``: what the pages show, for scripts too.

Every answer is JSON (a search and a query also as CSV or JSON lines with ``?format=``); an
error is ``{"error": "..."}`` with a status that says whose it is (400 the request's, 403 a
refusal, 404 nothing there, 409 no history store, 502 the cluster's or the store's).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Iterable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bolide.cli.common import parse_time_ms
from bolide.console.data import Console, NoStoreError, record_row
from bolide.console.search import Found
from bolide.facade.errors import AuthorizationError, BolideError, DeadLetterFilterError
from bolide.facade.ops.text import json_cell as text_cell
from bolide.stores import Search

__all__ = ["Api", "answer", "error_status", "export", "json_cell", "search_of"]

_INT64 = 2**63 - 1
#: A spreadsheet runs a cell starting so as a formula: exported cells get a quote first.
_FORMULA = ("=", "+", "-", "@", "\t", "\r")
READ_ONLY = "this console is read-only: start it with --allow-writes to replay or purge"


def error_status(error: BaseException) -> int:
    """The HTTP status of an error raised while answering."""
    if isinstance(error, NoStoreError):
        return 409
    if isinstance(error, AuthorizationError):
        return 403
    if isinstance(error, (ValueError, TypeError, DeadLetterFilterError)):
        return 400
    return 502


def json_cell(value: Any) -> Any:
    """A query cell as strict JSON (``ops.text.json_cell``; an infinite or NaN float, which
    a JSON response refuses, as its text)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return text_cell(value)


def search_of(request: Request) -> tuple[Search, int]:
    """The search a request's query string asks for, and its limit.

    ``key`` and ``q`` are UTF-8 text; ``from``/``to`` times (ISO 8601, or epoch
    milliseconds); ``partition``, ``from_offset``, ``to_offset``; ``after=P:O`` the next page.

    Raises:
        ValueError: A value that is not what its name says.
    """
    q = request.query_params

    def number(name: str) -> int | None:
        text = q.get(name)
        if text is None or text == "":
            return None
        if not text.isdigit() or int(text) > _INT64:
            raise ValueError(f"{name} must be an integer from 0 to 2^63-1, not {text!r}")
        return int(text)

    def when(name: str) -> int | None:
        text = q.get(name)
        return None if not text else parse_time_ms(text)

    after = None
    if q.get("after"):
        p, sep, o = q["after"].partition(":")
        if not sep or not p.isdigit() or not o.isdigit() or max(int(p), int(o)) > _INT64:
            raise ValueError(f"after must be PARTITION:OFFSET, not {q['after']!r}")
        after = (int(p), int(o))
    key, text = q.get("key"), q.get("q")
    search = Search(
        key=key.encode() if key else None,
        contains=text.encode() if text else None,
        from_ms=when("from"),
        to_ms=when("to"),
        partition=number("partition"),
        from_offset=number("from_offset"),
        to_offset=number("to_offset"),
        after=after,
    )
    return search, number("limit") or 100


def answer(fn: Callable[[Request], Any]) -> Callable[[Request], Response]:
    """An endpoint that runs ``fn`` (on a worker thread: Starlette runs plain functions
    there) and answers its value as JSON, ``None`` as 404, an error as its status."""

    def endpoint(request: Request) -> Response:
        try:
            result = fn(request)
        except BolideError as exc:
            return JSONResponse({"error": str(exc)}, status_code=error_status(exc))
        except (ValueError, TypeError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        if isinstance(result, Response):
            return result
        if result is None:
            return JSONResponse({"error": "not found"}, status_code=404)
        return JSONResponse(result)

    return endpoint


class Api:
    """The API's endpoints over ``console`` (``writes``: replay and purge allowed)."""

    def __init__(self, console: Console, writes: bool) -> None:
        self.console = console
        self.writes = writes

    def routes(self) -> list[Route]:
        c = self.console
        return [
            Route("/api/streams", answer(lambda _: {"streams": c.streams()})),
            Route("/api/streams/{name}", answer(lambda r: c.stream(r.path_params["name"]))),
            Route("/api/streams/{name}/records", answer(self.records)),
            Route("/api/groups", answer(lambda _: c.groups())),
            Route("/api/groups/{group}", answer(self.group)),
            Route("/api/sql", self.sql, methods=["POST"]),
            Route("/api/dlq/{stream}", answer(lambda r: {"letters": letters(c, r)})),
            Route("/api/dlq/{action:str}", self.dlq_write, methods=["POST"]),
            Route("/api/durable", answer(lambda _: {"clients": durable_rows(c)})),
        ]

    def records(self, request: Request) -> Response | None:
        name = request.path_params["name"]
        search, limit = search_of(request)
        found = self.console.search(name, search, limit)
        if found is None:
            return None
        return export(found_rows(found), request, found_body(found))

    def group(self, request: Request) -> dict[str, Any] | None:
        name = request.path_params["group"]
        found = self.console.group(name)
        if found is not None:
            found["lag_history"] = self.console.lags.series(name)
        return found

    async def sql(self, request: Request) -> Response:
        try:
            body = await request.json()
            query = str(body["query"])
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"error": 'send {"query": "SELECT ..."}'}, status_code=400)
        return await run_in_threadpool(sql_answer, self.console, query, request)

    async def dlq_write(self, request: Request) -> Response:
        if not self.writes:
            return JSONResponse({"error": READ_ONLY}, status_code=403)
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": "send a JSON object"}, status_code=400)
        action = request.path_params["action"]
        act = answer(lambda _: dlq_act(self.console, action, body))
        return await run_in_threadpool(act, request)


def sql_answer(console: Console, query: str, request: Request) -> Response:
    try:
        result = console.sql(query)
    except BolideError as exc:
        return JSONResponse({"error": str(exc)}, status_code=error_status(exc))
    except ValueError as exc:
        return JSONResponse({"error": str(exc)}, status_code=400)
    rows = [dict(zip(result.columns, map(json_cell, row), strict=True)) for row in result.rows]
    body = {
        "columns": list(result.columns),
        "rows": [[json_cell(c) for c in row] for row in result.rows],
        "truncated": result.truncated,
        "elapsed_s": round(result.elapsed_s, 6),
    }
    return export(rows, request, body, columns=list(result.columns))


def dlq_act(console: Console, action: str, body: Any) -> Any:
    """``replay`` or ``purge`` the dead letters a request body names."""
    if not isinstance(body, dict) or not isinstance(body.get("stream"), str):
        raise ValueError('send {"stream": "...", "ids": [...]} (or "where", or "all": true)')
    stream, ids, where = body["stream"], body.get("ids"), body.get("where")
    if ids is not None and not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
        raise ValueError("ids must be a list of dead-letter ids")
    if not ids and not where and body.get("all") is not True:
        raise ValueError('say which dead letters: "ids", "where", or "all": true')
    if action == "replay":
        return {"replayed": console.replay(stream, ids, body.get("to"), where)}
    if action == "purge":
        return {"purged": console.purge(stream, ids, where)}
    return None


def letters(console: Console, request: Request) -> list[dict[str, Any]]:
    stream = request.path_params["stream"]
    found = console.dead_letters(stream, request.query_params.get("where") or None)
    return [
        {**{k: json_cell(v) for k, v in d.columns().items()}, "replayed_to": list(d.replayed_to)}
        for d in found
    ]


def durable_rows(console: Console) -> list[dict[str, Any]]:
    return [
        {
            "durable_id": c.durable_id,
            "group_id": c.group_id,
            "state": c.state,
            "away_s": round(c.away_s, 3),
            "timeout_s": c.timeout_s,
            "backlog": c.total,
            "partitions": _json_keys(c.backlog),
            "marker_ms": c.marker_ms,
            "markers": _json_keys(c.markers),
        }
        for c in console.durable()
    ]


def _json_keys(per_stream: dict[str, dict[int, int]]) -> dict[str, dict[str, int]]:
    """Stream -> partition -> offset or count, its partitions as JSON object keys."""
    return {s: {str(p): n for p, n in parts.items()} for s, parts in per_stream.items()}


def found_rows(found: Found) -> list[dict[str, Any]]:
    decoded = found.decoded or [None] * len(found.records)
    return [record_row(r, d) for r, d in zip(found.records, decoded, strict=True)]


def found_body(found: Found) -> dict[str, Any]:
    return {
        "records": found_rows(found),
        "archived": found.archived,
        "scanned": found.scanned,
        "complete": found.complete,
        "next": None if found.next is None else f"{found.next[0]}:{found.next[1]}",
    }


def export(
    rows: Iterable[dict[str, Any]],
    request: Request,
    body: dict[str, Any],
    columns: list[str] | None = None,
) -> Response:
    """``body`` as JSON, or ``rows`` as CSV (``?format=csv``) or JSON lines (``jsonl``)."""
    kind = request.query_params.get("format", "json")
    if kind == "json":
        return JSONResponse(body)
    rows = list(rows)
    if kind == "jsonl":
        text = "".join(json.dumps(row) + "\n" for row in rows)
        return Response(text, media_type="application/x-ndjson", headers=_download("jsonl"))
    if kind == "csv":
        out = io.StringIO()
        names = columns or (list(rows[0]) if rows else [])
        writer = csv.DictWriter(out, fieldnames=names, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _csv_cell(v) for k, v in row.items()})
        return Response(out.getvalue(), media_type="text/csv", headers=_download("csv"))
    raise ValueError(f"format must be json, jsonl or csv, not {kind!r}")


def _csv_cell(value: Any) -> Any:
    text = json.dumps(value) if isinstance(value, (list, dict)) else value
    if isinstance(text, str) and text.startswith(_FORMULA):
        return "'" + text  # shown as text by a spreadsheet, never run
    return text


def _download(ext: str) -> dict[str, str]:
    return {"Content-Disposition": f'attachment; filename="bolide-export.{ext}"'}
