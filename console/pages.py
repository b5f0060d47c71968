"""The console's pages: server-rendered HTML (Jinja2, every value escaped), a little htmx
for the live refresh of the overview.

Forms that change something carry a CSRF token (``guard.check_csrf``); the pages that show
records show keys, payloads and headers as text, never as markup.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from bolide.console.api import (
    READ_ONLY,
    error_status,
    found_body,
    json_cell,
    search_of,
    sql_answer,
)
from bolide.console.data import Console
from bolide.console.guard import (
    CSRF_COOKIE,
    SESSION_COOKIE,
    check_csrf,
    csrf_token,
    same_text,
    session_value,
)
from bolide.console.settings import ConsoleSettings
from bolide.facade.errors import BolideError
from bolide.facade.ops.text import render_bytes, utc_text

__all__ = ["Pages", "lag_points"]

_TEMPLATES = Path(__file__).parent / "templates"
_CHART = (600, 160)  # the lag chart's width and height, in SVG units


def lag_points(series: list[tuple[int, int]]) -> str:
    """An SVG polyline's points for a lag series (time across, lag up), or ``""``."""
    if len(series) < 2:
        return ""
    width, height = _CHART
    t0, t1 = series[0][0], series[-1][0]
    top = max(lag for _, lag in series) or 1
    span = (t1 - t0) or 1
    return " ".join(
        f"{(t - t0) * width / span:.1f},{height - lag * height / top:.1f}" for t, lag in series
    )


class Pages:
    """The pages' endpoints over ``console``."""

    def __init__(self, console: Console, settings: ConsoleSettings) -> None:
        self.console = console
        self.settings = settings
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(_TEMPLATES),
            autoescape=True,  # every value escaped, whatever the template
            undefined=jinja2.StrictUndefined,
        )
        self.env.filters["text"] = lambda v: "" if v is None else render_bytes(v)
        self.env.filters["when"] = utc_text

    def routes(self) -> list[Route]:
        return [
            Route("/", self.page("index.html", self.overview)),
            Route("/fragments/overview", self.page("overview.html", self.overview)),
            Route("/streams/{name}", self.page("stream.html", self.stream)),
            Route("/groups/{group}", self.page("group.html", self.group)),
            Route("/dlq", self.page("dlq.html", self.dlq)),
            Route("/dlq/{action:str}", self.dlq_write, methods=["POST"]),
            Route("/sql", self.sql, methods=["GET", "POST"]),
            Route("/durable", self.page("durable.html", lambda _: {"clients": self.durable()})),
            Route("/login", self.login, methods=["GET", "POST"]),
        ]

    def render(self, request: Request, name: str, status: int = 200, **context: Any) -> Response:
        """Template ``name`` with ``context``; the CSRF cookie set when the browser lacks it."""
        csrf = csrf_token(request)
        html = self.env.get_template(name).render(
            request=request,
            csrf=csrf,
            writes=self.settings.allow_writes,
            store=self.console.store is not None,
            **context,
        )
        response = HTMLResponse(html, status_code=status)
        if request.cookies.get(CSRF_COOKIE) != csrf:
            response.set_cookie(CSRF_COOKIE, csrf, httponly=True, samesite="strict")
        return response

    def page(
        self, name: str, fill: Callable[[Request], dict[str, Any] | None]
    ) -> Callable[[Request], Response]:
        """An endpoint rendering ``name`` with what ``fill`` gathers (on a worker thread);
        an error is a page saying it, with its status."""

        def endpoint(request: Request) -> Response:
            try:
                context = fill(request)
            except BolideError as exc:
                return self.render(request, "error.html", error_status(exc), error=str(exc))
            except ValueError as exc:
                return self.render(request, "error.html", 400, error=str(exc))
            if context is None:
                return self.render(request, "error.html", 404, error="not found")
            return self.render(request, name, **context)

        return endpoint

    # -- what the pages show ------------------------------------------------------------------

    def overview(self, request: Request) -> dict[str, Any]:
        c = self.console
        return {"streams": c.streams(), **c.groups(), "durable": self.durable()}

    def durable(self) -> list[Any]:
        return self.console.durable() if self.console.store is not None else []

    def stream(self, request: Request) -> dict[str, Any] | None:
        found_stream = self.console.stream(request.path_params["name"])
        if found_stream is None:
            return None
        search, limit = search_of(request)
        found = self.console.search(found_stream["stream"], search, limit)
        if found is None:
            return None
        decoded = [None if d is None else json.dumps(d, default=str) for d in found.decoded]
        return {"stream": found_stream, "found": found, "body": found_body(found),
                "decoded": decoded or [None] * len(found.records)}  # fmt: skip

    def group(self, request: Request) -> dict[str, Any] | None:
        name = request.path_params["group"]
        found = self.console.group(name)
        if found is None:
            return None
        series = self.console.lags.series(name)
        return {"group": found, "points": lag_points(series), "samples": len(series),
                "series": json.dumps(series), "sampling": self.console.lags.error,
                "chart": _CHART}  # fmt: skip

    def dlq(self, request: Request) -> dict[str, Any]:
        stream = request.query_params.get("stream", "")
        where = request.query_params.get("where", "")
        letters = self.console.dead_letters(stream, where or None) if stream else []
        return {"dlq_stream": stream, "where": where, "letters": letters}

    # -- forms --------------------------------------------------------------------------------

    async def dlq_write(self, request: Request) -> Response:
        action = request.path_params["action"]
        if action not in ("replay", "purge"):
            return Response("not found", 404)
        form = await request.form()
        if not check_csrf(request, _field(form, "csrf")):
            return Response("the form's CSRF token is missing or stale", 403)
        if not self.settings.allow_writes:
            return Response(READ_ONLY, 403)
        stream = _field(form, "stream") or ""
        ids = [str(v) for v in form.getlist("id")]
        if not ids:  # nothing ticked is not "all of them"
            return self.render(request, "error.html", 400, error="tick the dead letters first")
        to = _field(form, "to") or None
        return await run_in_threadpool(self._dlq_act, request, action, stream, ids, to)

    def _dlq_act(
        self, request: Request, action: str, stream: str, ids: list[str], to: str | None
    ) -> Response:
        c = self.console
        try:
            done = (
                c.replay(stream, ids, to, None)
                if action == "replay"
                else c.purge(stream, ids, None)
            )
            letters = c.dead_letters(stream)
        except (BolideError, ValueError) as exc:
            return self.render(request, "error.html", error_status(exc), error=str(exc))
        note = f"{action}: {done} dead letter{'s' if done != 1 else ''}"
        return self.render(
            request, "dlq.html", dlq_stream=stream, where="", note=note, letters=letters
        )

    async def sql(self, request: Request) -> Response:
        if request.method == "GET":
            return self.render(request, "sql.html", query="", result=None, rows=[], error=None)
        form = await request.form()
        if not check_csrf(request, _field(form, "csrf")):
            return Response("the form's CSRF token is missing or stale", 403)
        query = _field(form, "query") or ""
        if _field(form, "format") == "csv":
            return await run_in_threadpool(
                sql_answer, self.console, query, _with_format(request, "csv")
            )
        return await run_in_threadpool(self._sql_page, request, query)

    def _sql_page(self, request: Request, query: str) -> Response:
        try:
            result = self.console.sql(query)
        except (BolideError, ValueError) as exc:
            return self.render(
                request, "sql.html", 400, query=query, result=None, rows=[], error=str(exc)
            )
        rows = [[json_cell(cell) for cell in row] for row in result.rows]
        return self.render(request, "sql.html", query=query, result=result, rows=rows, error=None)

    async def login(self, request: Request) -> Response:
        token = self.settings.token
        if request.method == "GET" or token is None:
            return self.render(request, "login.html", refused=False)
        form = await request.form()
        given = _field(form, "token") or ""
        if not (check_csrf(request, _field(form, "csrf")) and same_text(given, token)):
            return self.render(request, "login.html", 403, refused=True)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(SESSION_COOKIE, session_value(token), httponly=True, samesite="strict")
        return response


def _field(form: Any, name: str) -> str | None:
    value = form.get(name)
    return value if isinstance(value, str) else None


def _with_format(request: Request, kind: str) -> Request:
    """``request`` seen with ``?format=kind`` (a form's export button)."""
    scope = dict(request.scope)
    scope["query_string"] = f"format={kind}".encode()
    return Request(scope)
