"""The console over a real estate (Apache Kafka, SQLite and PostgreSQL): what each API call
and page shows, and the door's rules (token, same origin, CSRF, read-only)."""

from __future__ import annotations

import csv
import io
import json

import pytest

from bolide.console.settings import ConsoleSettings
from bolide.facade import Cluster
from bolide.stores import SqlStore
from tests.conftest import eventually
from tests.console.conftest import SCRIPT, TOKEN

pytestmark = [pytest.mark.kafka]


def test_a_key_is_found_in_the_archive_and_in_kafka_past_it(estate, console_of):
    """k1 is at 1 and 11 (archived, gone from Kafka), 21 (both), 31 (Kafka only)."""
    client = console_of()
    body = client.get(f"/api/streams/{estate.stream}/records", params={"key": "k1"}).json()
    assert [r["offset"] for r in body["records"]] == [1, 11, 21, 31]
    assert all(r["key"] == "k1" for r in body["records"])
    assert body["archived"] == 3 and body["complete"] is True
    assert body["scanned"] == 5  # Kafka read only past the archive: 30 to 34
    assert body["records"][0]["headers"] == [["trace", "t-1"]]


def test_text_is_found_in_payloads_and_header_values(estate, console_of):
    client = console_of()
    url = f"/api/streams/{estate.stream}/records"
    assert [r["offset"] for r in client.get(url, params={"q": "order 3"}).json()["records"]] == [
        3, 30, 31, 32, 33, 34,
    ]  # fmt: skip
    assert [r["offset"] for r in client.get(url, params={"q": "t-25"}).json()["records"]] == [25]
    paged = client.get(url, params={"key": "k2", "limit": 2}).json()
    assert [r["offset"] for r in paged["records"]] == [2, 12] and paged["next"] == "0:12"
    rest = client.get(url, params={"key": "k2", "after": paged["next"]}).json()
    assert [r["offset"] for r in rest["records"]] == [22, 32]


def test_search_results_export_as_csv_and_json_lines(estate, console_of):
    client = console_of()
    url = f"/api/streams/{estate.stream}/records"
    text = client.get(url, params={"key": "k4", "format": "csv"}).text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [int(r["offset"]) for r in rows] == [4, 14, 24, 34]
    lines = client.get(url, params={"key": "k4", "format": "jsonl"}).text.splitlines()
    assert [json.loads(line)["value"] for line in lines] == [
        "order 4", "order 14", "order 24", "order 34",
    ]  # fmt: skip
    assert client.get(url, params={"format": "xml"}).status_code == 400


def test_streams_show_their_ends_and_archive_coverage(estate, console_of):
    client = console_of()
    streams = {s["stream"]: s for s in client.get("/api/streams").json()["streams"]}
    mine = streams[estate.stream]
    assert mine["partitions"][0]["log_start"] == 20 and mine["partitions"][0]["log_end"] == 35
    assert mine["partitions"][0]["archived"] == 29 and mine["archive_lag"] == 5
    assert streams[estate.dlq]["archived"] is False


def test_a_group_shows_its_lag(estate, console_of):
    client = console_of()
    body = client.get(f"/api/groups/{estate.group}").json()
    assert body["group"] == estate.group and body["lag"] == 25
    assert body["partitions"] == [
        {"stream": estate.stream, "partition": 0, "committed": 10, "end": 35, "lag": 25,
         "member": None},
    ]  # fmt: skip
    groups = {g["group"]: g for g in client.get("/api/groups").json()["groups"]}
    assert groups[estate.group]["lag"] == 25
    assert client.get("/api/groups/no-such-group").status_code == 404
    page = client.get(f"/groups/{estate.group}").text
    assert 'total lag <strong id="lag">25</strong>' in page


def test_sql_reads_only_and_stops_at_its_time_limit(estate, console_of):
    client = console_of(query_timeout_ms=1_000)
    ok = client.post("/api/sql", json={"query": "SELECT count(*) AS n FROM bolide_records"})
    assert ok.status_code == 200 and ok.json()["rows"] == [[30]]
    refused = client.post("/api/sql", json={"query": "DELETE FROM bolide_records"})
    assert refused.status_code == 502 and "read only" in refused.json()["error"]
    several = client.post("/api/sql", json={"query": "SELECT 1; SELECT 2"})
    assert several.status_code == 400 and "one statement" in several.json()["error"]
    endless = (
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n"
    )
    stopped = client.post("/api/sql", json={"query": endless})
    assert stopped.status_code == 502 and "time limit" in stopped.json()["error"]
    with SqlStore(estate.db) as store:
        assert len(store.read(estate.stream, 0, 0, 100)) == 30  # nothing changed


def test_dead_letters_are_replayed_only_with_writes_allowed(estate, console_of):
    read_only = console_of()
    letters = read_only.get(f"/api/dlq/{estate.dlq}").json()["letters"]
    assert [(d["reason"], d["source_offset"]) for d in letters] == [("failed", 3), ("failed", 4)]
    ask = {"stream": estate.dlq, "ids": [letters[0]["id"]]}
    refused = read_only.post("/api/dlq/replay", json=ask)
    assert refused.status_code == 403 and "--allow-writes" in refused.json()["error"]
    writer = console_of(allow_writes=True)
    cross_site = writer.post("/api/dlq/replay", json=ask, headers={"Origin": "http://evil.example"})
    assert cross_site.status_code == 403
    done = writer.post("/api/dlq/replay", json=ask, headers={"Origin": "http://127.0.0.1:8080"})
    assert done.json() == {"replayed": 1}
    url = f"/api/streams/{estate.stream}/records"
    eventually(lambda: writer.get(url, params={"key": "k3", "from_offset": 35}).json()["records"])
    purged = writer.post("/api/dlq/purge", json={"stream": estate.dlq, "all": True})
    assert purged.json() == {"purged": 2}
    assert writer.get(f"/api/dlq/{estate.dlq}").json()["letters"] == []


def test_a_token_guards_every_request_but_the_login(estate, console_of):
    client = console_of(host="0.0.0.0", token=TOKEN)
    assert client.get("/api/streams").status_code == 401
    page = client.get("/", follow_redirects=False)
    assert page.status_code == 303 and page.headers["location"] == "/login"
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert client.get("/api/streams", headers=bearer).status_code == 200
    assert client.get("/api/streams", headers={"Authorization": "Bearer wrong"}).status_code == 401
    login = client.get("/login")
    csrf = login.cookies.get("bolide_csrf") or client.cookies.get("bolide_csrf")
    wrong = client.post("/login", data={"token": "nope", "csrf": csrf})
    assert wrong.status_code == 403
    signed = client.post("/login", data={"token": TOKEN, "csrf": csrf}, follow_redirects=False)
    assert signed.status_code == 303
    assert client.get("/api/streams").status_code == 200  # the cookie now
    assert TOKEN not in (client.cookies.get("bolide_console") or "")


def test_a_console_beyond_loopback_needs_a_token(estate):
    with pytest.raises(ValueError, match="not loopback"):
        ConsoleSettings(estate.cluster, host="0.0.0.0")
    with pytest.raises(ValueError, match="at least 16"):
        ConsoleSettings(estate.cluster, host="0.0.0.0", token="short")
    assert ConsoleSettings(estate.cluster, host="::1").token is None


def test_forms_need_their_csrf_token(estate, console_of):
    client = console_of(allow_writes=True)
    client.get("/sql")  # sets the cookie
    no_token = client.post("/sql", data={"query": "SELECT 1"})
    assert no_token.status_code == 403
    csrf = client.cookies.get("bolide_csrf")
    ran = client.post("/sql", data={"query": "SELECT 41 + 1 AS answer", "csrf": csrf})
    assert ran.status_code == 200 and ">42<" in ran.text
    replay = client.post("/dlq/replay", data={"stream": estate.dlq, "id": f"{estate.dlq}/0/0"})
    assert replay.status_code == 403
    nothing = client.post("/dlq/purge", data={"stream": estate.dlq, "csrf": csrf})
    assert nothing.status_code == 400  # nothing ticked is not "all of them"
    assert len(client.get(f"/api/dlq/{estate.dlq}").json()["letters"]) == 2


def test_pages_show_payloads_as_text(estate, console_of):
    client = console_of()
    page = client.get(f"/streams/{estate.stream}", params={"key": "k7"}).text
    assert SCRIPT.decode() not in page
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in page
    for path in ("/", "/dlq", f"/dlq?stream={estate.dlq}", "/sql", "/durable", "/login"):
        assert client.get(path).status_code == 200, path


def test_without_a_store_the_archive_pages_say_so(estate, console_of):
    client = console_of(db=None)
    body = client.get(f"/api/streams/{estate.stream}/records", params={"key": "k1"}).json()
    assert [r["offset"] for r in body["records"]] == [21, 31]  # Kafka only
    refused = client.post("/api/sql", json={"query": "SELECT 1"})
    assert refused.status_code == 409 and "--db" in refused.json()["error"]


def test_an_unreachable_cluster_is_a_message():
    from starlette.testclient import TestClient

    from bolide.console.app import create_app

    away = Cluster("127.0.0.1:1", **{"socket.connection.setup.timeout.ms": 1000})
    app = create_app(ConsoleSettings(away), sample=False)
    with TestClient(app, base_url="http://127.0.0.1:8080") as client:
        answer = client.get("/api/streams")
        assert answer.status_code == 502 and answer.json()["error"]
        assert "Traceback" not in client.get("/").text


def test_avro_values_are_shown_decoded(estate, console_of, stream_factory):
    """A value framed the Confluent way, its schema in the store's SQL registry, is shown
    decoded beside its bytes; one that is not Avro is shown as bytes only."""
    from bolide.facade import AvroSerde, Publisher, PublisherConfig, Record

    schema = {"type": "record", "name": "Order", "fields": [{"name": "qty", "type": "int"}]}
    stream = stream_factory(name_prefix="console-avro")
    with (
        SqlStore(estate.db) as store,
        Publisher(estate.cluster, PublisherConfig(stream=stream)) as pub,
    ):
        serde = AvroSerde(schema, registry=store)
        pub.publish(Record(serde.encode({"qty": 7}, stream=stream.name), key=b"a"), 60)
        pub.publish(Record(b"plain", key=b"b"), 60)
    client = console_of()
    rows = client.get(f"/api/streams/{stream.name}/records").json()["records"]
    assert [r["decoded"] for r in rows] == [{"qty": 7}, None]
    assert rows[1]["value"] == "plain"
    page = client.get(f"/streams/{stream.name}").text
    assert "{&#34;qty&#34;: 7}" in page or '{"qty": 7}' in page


def test_protobuf_and_json_schema_values_are_shown_decoded(estate, console_of, stream_factory):
    """Values of the other formats, one with its schema id in a header, are shown decoded."""
    from bolide.facade import JsonSchemaSerde, ProtobufSerde, Publisher, PublisherConfig
    from tests.schemas.conftest import ORDER_JSON, Order, json_order, make_order

    stream = stream_factory(name_prefix="console-formats")
    with SqlStore(estate.db) as store:
        proto = ProtobufSerde(Order, registry=store, subject="console-proto", framing="header")
        as_json = JsonSchemaSerde(ORDER_JSON, registry=store, subject="console-json")
        with Publisher(estate.cluster, PublisherConfig(stream=stream)) as pub:
            pub.publish(proto.encode_record(make_order(2), stream=stream.name), 60)
            pub.publish(as_json.encode_record(json_order(3), stream=stream.name), 60)
    rows = console_of().get(f"/api/streams/{stream.name}/records").json()["records"]
    first, second = (r["decoded"] for r in rows)
    assert first["price"] == {"cents": 200, "currency": "EUR"} and first["status"] == "SHIPPED"
    assert first["at"].startswith("2023-11-14 22:13:22")
    assert second == json_order(3)
