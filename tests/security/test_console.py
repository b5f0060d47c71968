"""The console on the secured broker, logged in as a SCRAM user: what the user may see is
shown; what an ACL refuses is a message with a status, never a stack trace."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AclOperation, ResourceType

from bolide.console.app import create_app
from bolide.console.settings import ConsoleSettings
from bolide.facade import EmbeddedBroker, Publisher, PublisherConfig, Record
from tests.security.conftest import UserFactory, needs_kafka, new_stream

pytestmark = [pytest.mark.kafka, needs_kafka]


def test_the_console_sees_what_its_user_may_and_says_what_it_may_not(
    secured: EmbeddedBroker, user_factory: UserFactory
) -> None:
    from starlette.testclient import TestClient

    seen = new_stream(secured, "console-seen")
    hidden = new_stream(secured, "console-hidden")
    with Publisher(secured.cluster(), PublisherConfig(stream=seen)) as pub:
        pub.publish(Record(b"visible", key=b"k"), 60)
    user = user_factory(
        [
            (ResourceType.TOPIC, seen.name, AclOperation.DESCRIBE),
            (ResourceType.TOPIC, seen.name, AclOperation.READ),
        ]
    )
    app = create_app(ConsoleSettings(user), sample=False)
    with TestClient(app, base_url="http://127.0.0.1:8080") as client:
        names = [s["stream"] for s in client.get("/api/streams").json()["streams"]]
        assert seen.name in names and hidden.name not in names
        found = client.get(f"/api/streams/{seen.name}/records", params={"key": "k"}).json()
        assert [r["value"] for r in found.get("records", [])] == ["visible"], found
        refused = client.get(f"/api/streams/{hidden.name}/records", params={"key": "k"})
        assert refused.status_code in (403, 404), refused.text
        page = client.get(f"/streams/{hidden.name}")
        assert page.status_code in (403, 404) and "Traceback" not in page.text


def test_a_stream_the_user_may_describe_but_not_read_is_a_refusal_with_its_acl(
    secured: EmbeddedBroker, user_factory: UserFactory
) -> None:
    """The stream is listed (DESCRIBE), and a search of it is refused by the broker (no
    READ): a 403 naming the ACL to grant, on the API and on the page, not a stack trace."""
    from starlette.testclient import TestClient

    described = new_stream(secured, "console-described")
    with Publisher(secured.cluster(), PublisherConfig(stream=described)) as pub:
        pub.publish(Record(b"private", key=b"k"), 60)
    user = user_factory([(ResourceType.TOPIC, described.name, AclOperation.DESCRIBE)])
    app = create_app(ConsoleSettings(user), sample=False)
    with TestClient(app, base_url="http://127.0.0.1:8080") as client:
        names = [s["stream"] for s in client.get("/api/streams").json()["streams"]]
        assert described.name in names
        refused = client.get(f"/api/streams/{described.name}/records", params={"key": "k"})
        assert refused.status_code == 403, refused.text
        assert "READ" in refused.json()["error"] and described.name in refused.json()["error"]
        page = client.get(f"/streams/{described.name}", params={"key": "k"})
        assert page.status_code == 403 and "READ" in page.text
        assert "Traceback" not in page.text and "private" not in page.text
