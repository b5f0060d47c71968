"""Registry URLs, database URLs and secret settings stay out of repr, errors, logs and output.

Each secret is checked where it could show (``repr``, ``str`` of the error, log records,
the ``bolide`` command's output) together with what must still show there: host and user.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import socket
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import pytest
from sqlalchemy.engine import make_url

from bolide.cli.main import main
from bolide.facade import Cluster, SerializationError, StreamConfig, SubscriberConfig
from bolide.facade.redaction import redact, redact_text, redact_url
from bolide.facade.schemas.avro import AvroSerde
from bolide.facade.schemas.registry import ConfluentSchemaRegistry
from bolide.stores import SqlStore
from tests.conftest import http_served
from tests.reliability.conftest import make_db_url

pytestmark = pytest.mark.reliability

SECRET = "s3cr3t-Pa55w0rd-7f1c"
SCHEMA = '{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}'
#: Passwords SQLAlchemy takes as written (it reads from ":" up to the next "@").
SQLALCHEMY_PASSWORDS = [f"a/{SECRET}", f"{SECRET}/b", f"x:{SECRET}", f"{SECRET}?q#f", SECRET]


def assert_hidden(*texts: object, shown: tuple[str, ...] = ()) -> None:
    for text in texts:
        assert SECRET not in str(text), f"secret leaked in: {str(text)[:300]}"
        for part in shown:
            assert part in str(text), f"{part!r} missing from: {str(text)[:300]}"


@pytest.mark.parametrize(
    "url",
    [
        *(f"postgresql+psycopg://alice:{p}@db.example:5432/hist" for p in SQLALCHEMY_PASSWORDS),
        f"postgresql://alice:p@{SECRET}@db.example:5432/hist",  # urllib: up to the last "@"
        f"postgresql://alice@db.example:5432/hist?sslmode=require&password={SECRET}",
        f"http://alice:{SECRET}@db.example:8081,https://alice:{SECRET}@db.example:8082",
    ],
)
def test_redact_url_hides_the_password_however_it_is_written(url: str) -> None:
    shown = redact_url(url)
    assert_hidden(shown, shown=("alice", "db.example:", "***"))
    assert_hidden(redact_text(f"cannot connect to {url}: refused"), shown=("alice", "refused"))
    if "hist" in url:
        assert shown.split("@")[-1].startswith("db.example:5432/hist")


def test_redact_leaves_urls_without_secrets_alone() -> None:
    for url in (
        "sqlite:////tmp/a:b@c/history.db",
        "postgresql+psycopg://alice@db.example/hist?options=-csearch_path%3Dx",
        "http://db.example:8081",
    ):
        assert redact_url(url) == url


def test_secret_settings_are_redacted_in_config_and_cluster_reprs() -> None:
    settings = {
        "basic.auth.user.info": f"alice:{SECRET}",
        "sasl.jaas.config": f'PlainLoginModule required username="alice" password="{SECRET}";',
        "ssl.key.password": SECRET,
        "sasl.oauthbearer.client.secret": SECRET,
        "bearer.auth.token": SECRET,
        "sasl.password": SECRET,
        "sasl.username": "alice",
        "sasl.oauthbearer.token.endpoint.url": f"https://alice:{SECRET}@idp.example/token",
    }
    assert_hidden(redact(settings), shown=("alice", "idp.example"))
    assert_hidden(repr(Cluster("broker.example:9092", **settings)), shown=("broker.example",))


def test_client_config_repr_hides_a_database_password_with_a_slash() -> None:
    url = f"postgresql+psycopg://alice:a/{SECRET}@db.example:5432/test"
    config = SubscriberConfig(stream=StreamConfig(name="s"), durable_id="d", durable_registry=url)
    assert_hidden(repr(config), shown=("alice", "db.example"))


def test_spark_source_options_repr_hides_sasl_and_store_passwords() -> None:
    from bolide.spark._options import SourceOptions

    options = SourceOptions.parse(
        {
            "kafka.bootstrap.servers": "broker.example:9092",
            "kafka.sasl.username": "alice",
            "kafka.sasl.password": SECRET,
            "subscribe": "orders",
            "bolide.store": f"postgresql+psycopg://alice:a/{SECRET}@db.example:5432/test",
        },
        batch=True,
    )
    assert options.kafka["sasl.password"] == SECRET  # the clients still get it
    assert_hidden(repr(options), shown=("alice", "db.example", "broker.example"))


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _frame(schema_id: int) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + b"\x02"


def test_registry_credentials_stay_out_of_repr_and_errors(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    port = _closed_port()
    in_url = ConfluentSchemaRegistry(f"http://alice:{SECRET}@127.0.0.1:{port}")
    in_conf = ConfluentSchemaRegistry(
        f"http://127.0.0.1:{port}", **{"basic.auth.user.info": f"alice:{SECRET}"}
    )
    texts: list[object] = []
    for registry in (in_url, in_conf):
        with pytest.raises(SerializationError) as caught:
            registry.get_schema(7)
        assert caught.value.retriable
        texts += [caught.value, repr(caught.value)]
        serde = AvroSerde(SCHEMA, registry=registry)
        with pytest.raises(SerializationError) as decoding:
            serde.decode(_frame(7), stream="orders", partition=0, offset=3)
        texts += [decoding.value, repr(serde)]
    assert_hidden(*texts, shown=("127.0.0.1",))
    assert_hidden(repr(in_url), shown=("alice:***@127.0.0.1",))
    assert_hidden(repr(in_conf), shown=("127.0.0.1", "'basic.auth.user.info': '***'"))
    assert_hidden(*(r.getMessage() for r in caplog.records))


def test_registry_url_the_client_refuses_stays_secret() -> None:
    with pytest.raises(ValueError) as caught:
        ConfluentSchemaRegistry(f"ftp://alice:{SECRET}@registry.example:8081")
    assert_hidden(caught.value, shown=("alice", "registry.example"))


class _Registry(BaseHTTPRequestHandler):
    """Just enough of the Schema Registry's REST API: ``GET /schemas/ids/1``."""

    authorizations: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        self.authorizations.append(self.headers.get("Authorization"))
        body = json.dumps({"schema": SCHEMA}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test reads the client's logs, not the server's."""


@pytest.fixture
def registry_server() -> Iterator[str]:
    with http_served(_Registry) as port:
        yield f"127.0.0.1:{port}"


def test_registry_url_credentials_authenticate_without_reaching_logs(
    registry_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    _Registry.authorizations.clear()
    registry = ConfluentSchemaRegistry(f"http://alice:{SECRET}@{registry_server}")
    assert json.loads(registry.get_schema(1)) == json.loads(SCHEMA)
    expected = "Basic " + base64.b64encode(f"alice:{SECRET}".encode()).decode()
    assert _Registry.authorizations == [expected]
    messages = [r.getMessage() for r in caplog.records]
    assert any(registry_server in m for m in messages), "no request was logged"
    assert_hidden(*messages)


@pytest.mark.postgres
@pytest.mark.parametrize(
    "password", SQLALCHEMY_PASSWORDS, ids=["slash", "slash2", "colon", "qf", "plain"]
)
def test_database_password_with_url_characters_stays_out_of_output(
    password: str, tmp_path: Path, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url = make_db_url("postgresql", tmp_path, request).replace(
        "postgres@",
        f"postgres:{password}@",  # trust auth: the password is not checked
    )
    assert make_url(url).password == password
    texts: list[object] = []
    with SqlStore(url) as store:
        texts += [repr(store), store.url, repr(AvroSerde(SCHEMA, registry=store))]
    for argv in (
        ["db", "upgrade", "--db", url],
        ["sql", "SELEC broken", "--db", url],
        ["sql", "SELECT 1", "--db", url.replace("5432", str(_closed_port()))],
    ):
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = main(argv)
        assert code in (0, 1)
        texts.append(out.getvalue() + err.getvalue())
    assert "at revision" in str(texts[3]) and "query failed" in str(texts[4])
    assert_hidden(*texts[:4], shown=("postgres:***@127.0.0.1",))
    assert_hidden(*texts[4:], shown=("query failed",))
    assert_hidden(*(r.getMessage() for r in caplog.records))


def test_database_url_with_a_raw_at_in_the_password_is_refused() -> None:
    with pytest.raises(ValueError) as caught:
        SqlStore(f"postgresql+psycopg://alice:p@{SECRET}@127.0.0.1:5432/test")
    assert "%40" in str(caught.value)
    assert_hidden(caught.value)
