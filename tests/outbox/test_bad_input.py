"""Bad input to the outbox: a clear typed error at once, and nothing accepted is lost.

A stream that does not exist is refused by the relay (the outbox keeps only a name, so it never
creates a stream): at its start when rows for it wait, or, met later, by stopping the relay.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from bolide.facade import Cluster, PublishError, Record, SchemaOutOfDateError, StreamConfig
from bolide.facade.kafka import admin_client, partition_count
from bolide.stores import Outbox, OutboxRelay, RelayConfig, SqlStore
from tests.conftest import eventually, upgraded_db_url
from tests.outbox.conftest import read_stream, sent_rows

pytestmark = [pytest.mark.kafka]

Relays = Callable[..., OutboxRelay]
Topic = Callable[..., StreamConfig]


def test_add_refuses_what_is_not_a_record(store: SqlStore, outbox: Outbox) -> None:
    with store.engine.begin() as conn:
        for value in (b"bytes", "text", {"data": b"x"}, None):
            with pytest.raises(TypeError, match=r"record must be a bolide\.facade\.Record"):
                outbox.add(conn, "orders", value)  # type: ignore[arg-type]
    assert outbox.pending() == 0


def test_add_refuses_a_bad_stream(store: SqlStore, outbox: Outbox) -> None:
    with store.engine.begin() as conn:
        with pytest.raises(ValueError, match="name"):
            outbox.add(conn, "not a topic name!", Record(b"x"))
        with pytest.raises(ValueError, match="name"):
            outbox.add(conn, "", Record(b"x"))
        with pytest.raises(TypeError, match="stream must be a StreamConfig or a name"):
            outbox.add(conn, 42, Record(b"x"))  # type: ignore[arg-type]
    assert outbox.pending() == 0


def test_add_refuses_a_connection_of_another_database(
    request: pytest.FixtureRequest, tmp_path: Path, store: SqlStore, outbox: Outbox
) -> None:
    other_dir = tmp_path / "other"  # another SQLite file, or another PostgreSQL schema
    other_dir.mkdir()
    with SqlStore(upgraded_db_url(store.dialect, other_dir, request)) as other:
        with other.engine.begin() as conn, pytest.raises(ValueError, match="another database"):
            outbox.add(conn, "orders", Record(b"x"))
        assert Outbox(other).pending() == 0
    with store.engine.begin() as conn:
        with pytest.raises(TypeError, match="conn must be a SQLAlchemy Connection"):
            outbox.add(store.engine, "orders", Record(b"x"))  # type: ignore[arg-type]
        with Session(store.engine) as session, pytest.raises(TypeError, match="Connection"):
            outbox.add(session, "orders", Record(b"x"))  # type: ignore[arg-type]
        assert outbox.add(conn, "orders", Record(b"kept")) > 0  # the right one still works
    assert outbox.pending() == 1


def _exists(cluster: Cluster, name: str) -> bool:
    return partition_count(admin_client(cluster), name) is not None


def test_a_stream_that_does_not_exist_fails_the_relay_start(
    cluster: Cluster, store: SqlStore, outbox: Outbox, topic: Topic
) -> None:
    known = topic()
    with store.engine.begin() as conn:
        outbox.add(conn, known, Record(b"fine"))
        missing = outbox.add(conn, "no-such-stream-7f3a", Record(b"lost?"))
    with pytest.raises(PublishError, match="'no-such-stream-7f3a' does not exist") as info:
        outbox.relay(cluster)
    assert f"row {missing}" in str(info.value) and info.value.retriable is False
    assert not _exists(cluster, "no-such-stream-7f3a"), "the relay never creates a stream"
    assert outbox.pending() == 2, "nothing accepted is lost"
    with store.engine.begin() as conn:  # the operator's fix: drop the stray row
        conn.execute(sa.text("DELETE FROM bolide_outbox WHERE id = :id"), {"id": missing})
    with outbox.relay(cluster):  # nothing of the failed start is left holding the database
        eventually(lambda: outbox.pending() == 0, 60)
    assert [r.data for r in read_stream(cluster, known, 1)] == [b"fine"]


def test_a_stream_met_later_stops_the_relay_and_loses_nothing(
    cluster: Cluster, store: SqlStore, outbox: Outbox, topic: Topic, relays: Relays
) -> None:
    known = topic()
    reported: list[tuple[str, BaseException | None]] = []
    relay = relays(outbox, error_handler=lambda s, e: reported.append((s, e)))
    with store.engine.begin() as conn:
        outbox.add(conn, known, Record(b"before"))
    eventually(lambda: outbox.pending() == 0, 60)
    with store.engine.begin() as conn:
        outbox.add(conn, "no-such-stream-c81d", Record(b"waits"))
    eventually(lambda: not relay.running, 60)
    assert isinstance(relay.error, PublishError) and "does not exist" in str(relay.error)
    assert reported and "the outbox relay stopped" in reported[0][0]
    with pytest.raises(PublishError, match="'no-such-stream-c81d' does not exist"):
        relay.close()
    assert outbox.pending("no-such-stream-c81d") == 1
    assert [r.data for r in read_stream(cluster, known, 1)] == [b"before"]


def test_a_record_kafka_refuses_stops_the_relay_naming_its_row(
    cluster: Cluster, store: SqlStore, outbox: Outbox, topic: Topic, relays: Relays
) -> None:
    stream = topic()
    with store.engine.begin() as conn:
        outbox.add(conn, stream, Record(b"small", key=b"k"))
        big = outbox.add(conn, stream, Record(b"x" * 20_000, key=b"k"))
        outbox.add(conn, stream, Record(b"after", key=b"k"))
    relay = relays(outbox, producer_config={"message.max.bytes": 10_000})
    eventually(lambda: not relay.running, 60)
    with pytest.raises(PublishError, match=f"outbox row {big}") as info:
        relay.close()
    assert "too large" in str(info.value).lower()
    # The row before it is sent; it and the row after it (same key) wait, in order.
    assert [r[4] is not None for r in sent_rows(store)] == [True, False, False]
    assert read_stream(cluster, stream, 1)[0].data == b"small"


def test_relay_config_refuses_bad_settings() -> None:
    for bad, error in (
        ({"batch_size": 0}, ValueError),
        ({"batch_size": "10"}, TypeError),
        ({"poll_interval_s": 0}, ValueError),
        ({"transactional_id": ""}, ValueError),
        ({"producer_config": {"transactional.id": "x"}}, ValueError),
        ({"error_handler": "log"}, TypeError),
    ):
        with pytest.raises(error):
            RelayConfig(**bad)  # type: ignore[arg-type]


def test_relay_refuses_what_is_not_a_cluster_or_a_config(store: SqlStore, cluster: Cluster) -> None:
    with pytest.raises(TypeError, match="cluster must be a Cluster"):
        OutboxRelay(store, "localhost:9092")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="config must be a RelayConfig"):
        OutboxRelay(store, cluster, {"batch_size": 10})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="store must be a SqlStore"):
        Outbox("sqlite:///x.db")  # type: ignore[arg-type]


def test_a_database_without_the_schema_fails_the_relay_start_and_add(
    cluster: Cluster, tmp_path: Path
) -> None:
    with SqlStore(f"sqlite:///{tmp_path / 'no-schema.db'}") as empty:
        with pytest.raises(SchemaOutOfDateError, match="bolide db upgrade"):
            Outbox(empty).relay(cluster)
        with empty.engine.begin() as conn, pytest.raises(SchemaOutOfDateError):
            Outbox(empty).add(conn, "orders", Record(b"x"))


def test_an_in_memory_database_cannot_hold_an_outbox(cluster: Cluster) -> None:
    """Its one connection serves every user: the relay's commits would end the application's
    transactions half-way."""
    with SqlStore("sqlite://") as memory:
        with pytest.raises(ValueError, match="in-memory SQLite"):
            Outbox(memory)
        with pytest.raises(ValueError, match="in-memory SQLite"):
            OutboxRelay(memory, cluster)


def test_a_producer_setting_librdkafka_refuses_fails_the_relay_start(
    cluster: Cluster, store: SqlStore, outbox: Outbox, topic: Topic
) -> None:
    stream = topic()
    with store.engine.begin() as conn:
        outbox.add(conn, stream, Record(b"waits"))
    with pytest.raises(ValueError, match=r"no\.such\.setting"):
        outbox.relay(cluster, RelayConfig(producer_config={"no.such.setting": "1"}))
    assert outbox.pending() == 1
    with outbox.relay(cluster):  # the failed start left nothing holding the database
        eventually(lambda: outbox.pending() == 0, 60)
