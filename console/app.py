"""``create_app``: the console as an ASGI application (Starlette), and ``serve`` to run it.

The routes: the pages (``pages.py``), the JSON API (``api.py``), the vendored static files;
in front of them the door (``guard.py``). The data comes from one ``Console``, opened when
the application starts (the history store, the lag sampler) and closed when it stops.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from bolide.console.api import Api
from bolide.console.data import Console
from bolide.console.guard import Guard
from bolide.console.pages import Pages
from bolide.console.settings import ConsoleSettings

__all__ = ["create_app", "serve"]

_STATIC = Path(__file__).parent / "static"


def create_app(
    settings: ConsoleSettings, *, sample: bool = True, ready: Callable[[], None] | None = None
) -> Starlette:
    """The console for ``settings``; ``sample``: sample group lags while it runs (the
    charts); ``ready()`` once it has started."""
    console = Console(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if sample:
            console.lags.start()
        if ready is not None:
            ready()
        try:
            yield
        finally:
            console.close()

    routes = [
        *Pages(console, settings).routes(),
        *Api(console, settings.allow_writes).routes(),
        # follow_symlink: an editable install links each file of the package in
        Mount("/static", StaticFiles(directory=_STATIC, follow_symlink=True), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(Guard, token=settings.token)],
        lifespan=lifespan,
    )
    app.state.console = console
    return app


def serve(settings: ConsoleSettings, ready: Callable[[str], None] | None = None) -> None:
    """Serve the console until interrupted (Ctrl-C stops it cleanly); ``ready(url)`` once it
    serves (with ``port=0``, on the port the system picked)."""
    import uvicorn

    bind = settings.host.strip("[]")  # "[::1]" names the address ::1
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((bind, settings.port))
    sock.listen(128)  # connections queue from here on: the line printed is true at once
    port = sock.getsockname()[1]
    host = f"[{bind}]" if family == socket.AF_INET6 else bind
    url = f"http://{host}:{port}/"
    app = create_app(settings, ready=None if ready is None else (lambda: ready(url)))
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
