"""Credentials stay secret; hostile names and values stay data.

Secrets (a SASL password in the cluster settings, a database password in a URL) must never
show in logs (captured at DEBUG, librdkafka's own debug output included), in error messages or
in ``repr``. Stream names, header names and values, and the ``bolide sql`` parameters that a
hostile party controls travel as bound parameters only.
"""

from __future__ import annotations

import io
import json
import logging
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import sqlalchemy as sa

from bolide.cli.main import main
from bolide.facade import (
    AuthenticationError,
    BolideError,
    Cluster,
    Publisher,
    PublisherConfig,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.kafka import ensure_topic
from bolide.stores import Archiver, SqlDurableRegistry, SqlStore
from tests.reliability.conftest import LEASE_MS, PG_ADMIN_URL, make_db_url

pytestmark = pytest.mark.reliability

SECRET = "s3cr3t-Pa55w0rd-7f1c"
HOSTILE = [
    "'; DROP TABLE bolide_records; --",
    '" OR 1=1 --',
    "x\\'); DELETE FROM bolide_record_headers; --",
    "%s %(x)s :s ? $1",
    "Robert'); DROP TABLE students;--",
    "ünï\u202ecode\u2028",
]
#: Bytes columns (keys, payloads, header values) take anything, NUL included.
HOSTILE_BYTES = [h.encode() + b"\x00\xff" for h in HOSTILE]


def sasl_cluster(bootstrap: str) -> Cluster:
    return Cluster(
        bootstrap,
        **{
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "alice",
            "sasl.password": SECRET,
            "debug": "security,broker,conf",
        },
    )


def assert_no_secret(*texts: object) -> None:
    for text in texts:
        assert SECRET not in str(text), f"secret leaked in: {str(text)[:300]}"


@pytest.mark.kafka
def test_sasl_password_never_in_logs_errors_or_repr(cluster, stream_factory, caplog):
    caplog.set_level(logging.DEBUG)
    secure = sasl_cluster(cluster.bootstrap_servers)
    stream = stream_factory()
    ensure_topic(cluster, stream)  # the topic exists: only the credentials are refused
    texts: list[object] = [repr(secure)]
    config = PublisherConfig(stream=stream, producer_config={"message.timeout.ms": 2_000})
    # The broker speaks no SASL: an answer no retry changes, met when the client starts.
    with pytest.raises(AuthenticationError) as refused_publisher:
        Publisher(secure, config)
    reports: list[object] = []
    sub_config = SubscriberConfig(
        stream=stream, group="sasl", lease_timeout_ms=4_000,
        error_handler=lambda s, e: reports.extend((s, e)),
    )  # fmt: skip
    with pytest.raises(AuthenticationError) as refused_subscriber:
        Subscriber(secure, sub_config)
    for refused in (refused_publisher.value, refused_subscriber.value):
        texts += [refused, repr(refused), refused.__cause__, refused.cause]
    texts += [repr(config), repr(sub_config), *reports]
    messages = [r.getMessage() for r in caplog.records]
    assert any("sasl" in m.lower() for m in messages), "librdkafka's debug output not seen"
    assert_no_secret(*texts, *messages)


def test_client_config_reprs_hide_secrets():
    stream = StreamConfig(name="s")
    url = f"postgresql+psycopg://postgres:{SECRET}@127.0.0.1:5432/test"
    assert_no_secret(
        repr(PublisherConfig(stream=stream, producer_config={"sasl.password": SECRET})),
        repr(SubscriberConfig(stream=stream, consumer_config={"sasl.password": SECRET})),
        repr(SubscriberConfig(stream=stream, durable_id="d", durable_registry=url)),
    )


@pytest.mark.postgres
def test_database_password_never_in_logs_errors_or_repr(tmp_path: Path, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    good = PG_ADMIN_URL.replace("postgres@", f"postgres:{SECRET}@")  # trust auth ignores it
    unreachable = f"postgresql+psycopg://postgres:{SECRET}@127.0.0.1:1/test"
    texts: list[object] = []
    with SqlStore(good) as store:
        texts += [repr(store), store.url, store.engine.url]
        store.current()
        try:
            with store.engine.connect() as conn:
                conn.execute(sa.text("SELECT no_such_column FROM no_such_table"))
        except sa.exc.SQLAlchemyError:
            pass  # the raw driver error is SQLAlchemy's; bolide's own errors are below
    texts.append(repr(SqlDurableRegistry(unreachable)))
    with pytest.raises(BolideError) as caught:
        SqlStore(unreachable).current()
    texts += [caught.value, repr(caught.value)]
    for argv in (
        ["sql", "SELEC broken", "--db", good],
        ["sql", "SELECT 1", "--db", unreachable],
        ["db", "current", "--db", unreachable],
        ["db", "current", "--db", good],
    ):
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = main(argv)
        texts += [out.getvalue(), err.getvalue()]
        assert code in (0, 1)
    assert any("failed" in str(t) for t in texts)
    assert_no_secret(*texts, *(r.getMessage() for r in caplog.records), *capsys.readouterr())


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_hostile_stream_names_and_headers_stay_data_in_the_store(kind, tmp_path, request):
    url = make_db_url(kind, tmp_path, request)
    with SqlStore(url) as store:
        store.upgrade()
        for i, name in enumerate(HOSTILE):
            headers = list(zip(HOSTILE, HOSTILE_BYTES, strict=True))
            record = Record(HOSTILE_BYTES[i], key=HOSTILE_BYTES[i], headers=headers)
            record.partition, record.offset = 0, i
            assert store.store_all(name, [record]) == 1
        for i, name in enumerate(HOSTILE):
            [back] = store.read(name, 0, 0, 10)
            assert (back.offset, back.data, back.key) == (i, HOSTILE_BYTES[i], HOSTILE_BYTES[i])
            assert back.headers == list(zip(HOSTILE, HOSTILE_BYTES, strict=True))
            assert store.largest_offset(name, 0) == i
        with store.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM bolide_records")).scalar() == len(
                HOSTILE
            )


def sql_cli(url: str, query: str, *params: str) -> list[dict[str, object]]:
    out, err = io.StringIO(), io.StringIO()
    argv = ["sql", query, "--db", url, "--json", *(f"--param={p}" for p in params)]
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue())  # type: ignore[no-any-return]


@pytest.mark.kafka
@pytest.mark.postgres
def test_hostile_headers_through_the_archive_and_sql_params(
    cluster, stream_factory, group_name, tmp_path, request
):
    url = make_db_url("postgresql", tmp_path, request)
    with SqlStore(url) as store:
        store.upgrade()
        stream = stream_factory()
        with Publisher(cluster, PublisherConfig(stream=stream)) as pub:
            for value, raw in zip(HOSTILE, HOSTILE_BYTES, strict=True):
                headers = [(value, raw), ("plain", raw)]
                pub.publish_async(Record(raw, key=raw, headers=headers))
            assert pub.flush(10) == 0
        fast = {"session.timeout.ms": LEASE_MS, "heartbeat.interval.ms": 500}
        stats = Archiver(cluster, store, [stream], group=group_name, consumer_config=fast).run()
        assert stats.caught_up and stats.inserted == len(HOSTILE)
    for value, raw in zip(HOSTILE, HOSTILE_BYTES, strict=True):
        rows = sql_cli(
            url,
            "SELECT h.name, r.kafka_offset FROM bolide_record_headers h JOIN bolide_records r "
            "USING (stream, kafka_partition, kafka_offset) WHERE h.stream = :s AND h.value = :v "
            "AND h.name = :n",
            f"s={stream.name}",
            f"v:hex={raw.hex()}",
            f"n={value}",
        )
        assert [row["name"] for row in rows] == [value], (value, rows)
        # The same values as a stream name and a filter: no row, no harm.
        assert sql_cli(url, "SELECT * FROM bolide_records WHERE stream = :s", f"s={value}") == []
    counts = sql_cli(
        url,
        "SELECT (SELECT count(*) FROM bolide_records) AS records, "
        "(SELECT count(*) FROM bolide_record_headers) AS headers",
    )
    assert counts == [{"records": len(HOSTILE), "headers": 2 * len(HOSTILE)}]


@pytest.mark.postgres
def test_a_nul_in_a_header_name_is_kept_on_postgresql(tmp_path, request):
    """PostgreSQL text cannot hold NUL: such a header name (which librdkafka cannot send, but
    other Kafka clients can) is stored escaped and read back exactly."""
    url = make_db_url("postgresql", tmp_path, request)
    with SqlStore(url) as store:
        store.upgrade()
        record = Record(b"x", headers=[("bad\x00name", b"v")])
        record.partition, record.offset = 0, 0
        assert store.store_all("s", [record]) == 1
        loaded = store.load("s", 0, 0)
        assert loaded is not None and loaded.headers == [("bad\x00name", b"v")]
