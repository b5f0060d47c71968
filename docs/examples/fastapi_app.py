"""A FastAPI service on bolide's asyncio API: POST publishes, a websocket streams the stream.

Every websocket client gets its own ungrouped subscriber (it sees every record published after
it connected); hundreds of them share the service's event loop and a few helper threads. Run it
with ``BOLIDE_BOOTSTRAP=host:9092 uvicorn fastapi_app:app`` (from docs/examples).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from pydantic import BaseModel

from bolide.facade import Cluster, PublisherConfig, Record, StreamConfig, SubscriberConfig
from bolide.facade.aio import AsyncPublisher, AsyncSubscriber


class Message(BaseModel):
    text: str


def create_app(cluster: Cluster, stream: StreamConfig) -> FastAPI:
    """The service for ``stream`` on ``cluster``."""
    publisher = AsyncPublisher(cluster, PublisherConfig(stream=stream))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with publisher:  # one publisher for the whole service
            yield

    app = FastAPI(lifespan=lifespan)
    app.state.listeners = 0

    @app.post("/messages")
    async def post_message(message: Message) -> dict[str, int]:
        offset = await publisher.publish(Record(message.text.encode()))
        return {"offset": offset}

    @app.websocket("/stream")
    async def stream_to_client(websocket: WebSocket) -> None:
        await websocket.accept()
        async with AsyncSubscriber(cluster, SubscriberConfig(stream=stream)) as subscriber:
            app.state.listeners += 1
            await websocket.send_json({"subscribed": True})
            forward = asyncio.create_task(forward_records(subscriber, websocket))
            try:
                while True:  # the client only listens; this notices when it goes away
                    await websocket.receive_text()
            except WebSocketDisconnect:
                pass
            finally:
                forward.cancel()  # safe: a cancelled poll loses nothing
                with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect):
                    await forward
                app.state.listeners -= 1

    return app


async def forward_records(subscriber: AsyncSubscriber, websocket: WebSocket) -> None:
    async for record in subscriber:
        await websocket.send_json({"offset": record.offset, "text": record.data.decode()})


app = create_app(
    Cluster(os.environ.get("BOLIDE_BOOTSTRAP", "localhost:9092")),
    StreamConfig(name=os.environ.get("BOLIDE_STREAM", "messages")),
)
