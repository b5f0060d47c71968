"""The console's door on its own (no cluster): the token, the same-origin rule and the
settings that refuse an open door. The same rules over the real console are in
test_console.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from bolide.console.guard import SESSION_COOKIE, Guard, session_value
from bolide.console.pages import lag_points
from bolide.console.settings import TOKEN_ENV, ConsoleSettings, is_loopback
from bolide.facade import Cluster

TOKEN = "a-console-token-of-thirty-chars"


def door(token: str | None) -> TestClient:
    async def ok(request: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    routes = [Route(p, ok, methods=["GET", "POST"]) for p in ("/", "/api/x", "/login")]
    app = Starlette(routes=routes, middleware=[Middleware(Guard, token=token)])
    return TestClient(app, base_url="http://127.0.0.1:8080")


def test_without_a_token_reads_pass_and_cross_site_posts_do_not():
    client = door(None)
    assert client.get("/").text == "ok"
    assert client.post("/api/x").text == "ok"  # a script: no Origin
    assert client.post("/api/x", headers={"Origin": "http://127.0.0.1:8080"}).text == "ok"
    for origin in ("http://evil.example", "http://127.0.0.1:9999", "null"):
        refused = client.post("/api/x", headers={"Origin": origin})
        assert refused.status_code == 403, origin
    referer = client.post("/", headers={"Referer": "https://evil.example/page"})
    assert referer.status_code == 403


def test_without_a_token_only_loopback_names_are_answered():
    """A site whose name was rebound to 127.0.0.1 sends its own name as the Host: refused,
    reads too (DNS rebinding)."""
    client = door(None)
    rebound = client.get("/api/x", headers={"Host": "evil.example:8080"})
    assert rebound.status_code == 403
    same_site = {"Host": "evil.example:8080", "Origin": "http://evil.example:8080"}
    assert client.post("/api/x", headers=same_site).status_code == 403
    for host in ("localhost:8080", "127.0.0.1", "[::1]:8080"):
        assert client.get("/api/x", headers={"Host": host}).text == "ok", host
    assert (
        door(TOKEN)
        .get("/api/x", headers={"Host": "console.example", "Authorization": f"Bearer {TOKEN}"})
        .text
        == "ok"
    )


def test_a_crafted_host_does_not_open_the_login_path():
    client = door(TOKEN)
    crafted = client.get("/api/x", headers={"Host": "x/login"})
    assert crafted.status_code == 401


def test_a_token_is_asked_of_every_request_but_the_login():
    client = door(TOKEN)
    assert client.get("/api/x").status_code == 401
    assert client.get("/", follow_redirects=False).headers["location"] == "/login"
    assert client.get("/login").text == "ok"
    assert client.get("/api/x", headers={"Authorization": f"Bearer {TOKEN}"}).text == "ok"
    assert client.get("/api/x", headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401
    client.cookies.set(SESSION_COOKIE, TOKEN)  # the token itself is not the cookie
    assert client.get("/api/x").status_code == 401
    client.cookies.set(SESSION_COOKIE, session_value(TOKEN))
    assert client.get("/api/x").text == "ok"


def test_settings_refuse_an_open_door():
    cluster = Cluster("127.0.0.1:9092")
    assert ConsoleSettings(cluster).host == "127.0.0.1"
    for host in ("0.0.0.0", "10.1.2.3", "console.example"):
        with pytest.raises(ValueError, match="token"):
            ConsoleSettings(cluster, host=host)
    assert ConsoleSettings(cluster, host="0.0.0.0", token=TOKEN).token == TOKEN
    with pytest.raises(ValueError, match="at least 16"):
        ConsoleSettings(cluster, token="short")
    with pytest.raises(ValueError, match="port"):
        ConsoleSettings(cluster, port=-1)
    assert [is_loopback(h) for h in ("localhost", "127.0.0.2", "::1", "[::1]", "::")] == [
        True, True, True, True, False,
    ]  # fmt: skip


def test_the_lag_chart_spans_its_samples():
    assert lag_points([]) == "" and lag_points([(0, 5)]) == ""
    assert lag_points([(1000, 0), (2000, 10), (3000, 5)]) == "0.0,160.0 300.0,0.0 600.0,80.0"


def test_the_command_refuses_to_open_beyond_loopback_without_a_token():
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    command = [sys.executable, "-m", "bolide.cli", "console", "-b", "127.0.0.1:1"]
    refused = subprocess.run(
        [*command, "--host", "0.0.0.0"], env=env, capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 2 and TOKEN_ENV in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    short = subprocess.run(
        [*command, "--host", "0.0.0.0"],
        env={**env, TOKEN_ENV: "short"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert short.returncode == 2 and "at least 16" in short.stderr, short.stderr
