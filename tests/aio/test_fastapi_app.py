"""The FastAPI example of docs/asyncio.md, served by Starlette's test client on a real broker."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from types import ModuleType

import pytest
from fastapi.testclient import TestClient

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "fastapi_app.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fastapi_app", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_doc_shows_the_tested_example() -> None:
    doc = (ROOT / "docs" / "asyncio.md").read_text(encoding="utf-8")
    assert EXAMPLE.read_text(encoding="utf-8") in doc


def test_post_publishes_and_every_websocket_client_receives(cluster, stream_factory) -> None:
    stream = stream_factory()
    app = load_example().create_app(cluster, stream)
    with TestClient(app) as client:
        with (
            client.websocket_connect("/stream") as first,
            client.websocket_connect("/stream") as second,
        ):
            assert first.receive_json() == {"subscribed": True}
            assert second.receive_json() == {"subscribed": True}
            offsets = [
                client.post("/messages", json={"text": text}).json()["offset"]
                for text in ("hello", "world")
            ]
            assert offsets == [0, 1]
            expected = [{"offset": 0, "text": "hello"}, {"offset": 1, "text": "world"}]
            for ws in (first, second):
                assert [ws.receive_json(), ws.receive_json()] == expected
        # Both clients left: their subscribers closed.
        deadline = time.monotonic() + 20
        while app.state.listeners and time.monotonic() < deadline:
            time.sleep(0.05)
        assert app.state.listeners == 0
        # A client that connects now sees what comes next only.
        with client.websocket_connect("/stream") as late:
            assert late.receive_json() == {"subscribed": True}
            assert client.post("/messages", json={"text": "again"}).json() == {"offset": 2}
            assert late.receive_json() == {"offset": 2, "text": "again"}
