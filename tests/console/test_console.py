"""The console over a real estate (Apache Kafka, SQLite and PostgreSQL): what each API call
and page shows, and the door's rules (token, same origin, CSRF, read-only)."""

from __future__ import annotations

import csv
import datetime
import io
import json
import threading
import uuid

import pytest
from confluent_kafka import Consumer

from bolide.console.settings import ConsoleSettings
from bolide.facade import (
    Cluster,
    Publisher,
    PublisherConfig,
    Record,
    StreamConfig,
    Subscriber,
    SubscriberConfig,
)
from bolide.facade.deadletter import Reason, letter
from bolide.facade.kafka import CONSUMER_DEFAULTS
from bolide.stores import Archiver, SqlStore
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


def test_a_group_shows_its_members_their_static_ids_and_its_lag_over_time(
    estate, console_of, stream_factory
):
    """A live member with a static id: the group's page and API show it, its assignment and
    the protocol; the sampler's points feed the chart."""
    stream = stream_factory(name_prefix="console-members")
    with Publisher(estate.cluster, PublisherConfig(stream=stream)) as pub:
        pub.publish(Record(b"one", key=b"k"), 60)
    group = f"console-live-{uuid.uuid4().hex[:8]}"
    config = SubscriberConfig(
        stream=stream, group=group, lease_timeout_ms=4_000,
        consumer_config={"group.instance.id": "member-1"},
    )  # fmt: skip
    with Subscriber(estate.cluster, config) as member:
        eventually(member.is_assigned, 60)
        client = console_of(sample=True, sample_s=0.2)
        # Served while the console samples (is_assigned polls): the member keeps its lease.
        body = eventually(lambda: member.is_assigned() and _with_history(client, group, 2), 60)
        assert body["protocol"] in ("CLASSIC", "CONSUMER")
        [one] = body["members"]
        assert one["instance_id"] == "member-1"
        assert one["assignment"] == [[stream.name, 0]]
        assert all(isinstance(ms, int) and lag >= 0 for ms, lag in body["lag_history"])
        page = client.get(f"/groups/{group}").text
        assert "member-1" in page and f"{stream.name}[0]" in page
        assert 'data-lag-chart data-series="[[' in page  # the samples, for uPlot
        assert "/static/vendor/uPlot-1.6.32.iife.min.js" in page


def _with_history(client, group: str, samples: int) -> dict | None:
    body = client.get(f"/api/groups/{group}").json()
    members = body.get("members") or []
    ready = len(body.get("lag_history", [])) >= samples and members and members[0]["assignment"]
    return body if ready else None


def test_the_time_range_picks_records_by_their_timestamps(estate, console_of):
    client = console_of()
    url = f"/api/streams/{estate.stream}/records"
    every = client.get(url, params={"limit": 100}).json()["records"]
    at = {r["offset"]: r["timestamp_ms"] for r in every}
    middle = at[25]
    later = client.get(url, params={"from": middle, "limit": 100}).json()["records"]
    assert 25 in [r["offset"] for r in later]
    assert all(r["timestamp_ms"] >= middle for r in later)
    assert {o for o, t in at.items() if t >= middle} == {r["offset"] for r in later}
    earlier = client.get(url, params={"to": middle, "limit": 100}).json()["records"]
    assert {o for o, t in at.items() if t < middle} == {r["offset"] for r in earlier}  # before
    iso = datetime.datetime.fromtimestamp(middle / 1000, datetime.UTC).isoformat()
    by_text = client.get(url, params={"from": iso, "limit": 100}).json()["records"]
    assert {r["offset"] for r in by_text} == {r["offset"] for r in later}
    assert client.get(url, params={"from": "yesterday-ish"}).status_code == 400


def test_the_page_form_refuses_writes_on_a_read_only_console(estate, console_of):
    client = console_of()
    client.get(f"/dlq?stream={estate.dlq}")  # sets the CSRF cookie
    csrf = client.cookies.get("bolide_csrf")
    form = {"stream": estate.dlq, "id": f"{estate.dlq}/0/0", "csrf": csrf}
    refused = client.post("/dlq/replay", data=form)
    assert refused.status_code == 403 and "--allow-writes" in refused.text
    assert client.post("/dlq/purge", data=form).status_code == 403
    assert len(client.get(f"/api/dlq/{estate.dlq}").json()["letters"]) == 2


def test_dead_letters_are_picked_by_filter_and_replayed_to_another_stream(
    estate, console_of, stream_factory
):
    other = stream_factory(name_prefix="console-replayed")
    writer = console_of(allow_writes=True)
    url = f"/api/dlq/{estate.dlq}"
    picked = writer.get(url, params={"where": "source_offset = 4"}).json()["letters"]
    assert [d["source_offset"] for d in picked] == [4]
    ask = {"stream": estate.dlq, "where": "source_offset = 4", "to": other.name}
    assert writer.post("/api/dlq/replay", json=ask).json() == {"replayed": 1}
    copies = eventually(lambda: _read_all(estate.cluster, other.name, 1), 60)
    assert [(c.key(), c.value()) for c in copies] == [(b"k4", b"order 4")]
    letters = {d["source_offset"]: d for d in writer.get(url).json()["letters"]}
    assert letters[4]["replayed_to"] == [other.name] and letters[3]["replayed_to"] == []
    page = writer.get("/dlq", params={"stream": estate.dlq, "where": "source_offset = 3"}).text
    assert f"{estate.stream}/0/3" in page and f"{estate.stream}/0/4" not in page


def _read_all(cluster, topic: str, count: int) -> list | None:
    consumer = Consumer(
        cluster.client_config(
            CONSUMER_DEFAULTS,
            {"group.id": f"console-check-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest"},
        )
    )
    try:
        consumer.subscribe([topic])
        found = []
        for _ in range(20):
            found += [m for m in consumer.consume(10, timeout=1.0) if m.error() is None]
            if len(found) >= count:
                return found
        return None
    finally:
        consumer.close()


def test_sql_results_export_as_csv(estate, console_of):
    client = console_of()
    query = {"query": "SELECT kafka_offset FROM bolide_records WHERE kafka_offset < 3 ORDER BY 1"}
    text = client.post("/api/sql", params={"format": "csv"}, json=query).text
    assert list(csv.reader(io.StringIO(text))) == [["kafka_offset"], ["0"], ["1"], ["2"]]
    client.get("/sql")
    form = {**query, "csrf": client.cookies.get("bolide_csrf"), "format": "csv"}
    exported = client.post("/sql", data=form)
    assert exported.headers["content-type"].startswith("text/csv")
    assert exported.text.splitlines()[1:] == ["0", "1", "2"]


def test_keys_headers_and_dead_letters_show_as_text(estate, console_of, stream_factory):
    """Markup in a key, a header's value and a dead letter's payload and detail is shown as
    text on every page that shows it."""
    stream = stream_factory(name_prefix="console-markup")
    dlq = stream_factory(name_prefix="console-markup-dlq")
    markup = "<img src=x onerror=alert(1)>"
    with Publisher(estate.cluster, PublisherConfig(stream=stream)) as pub:
        pub.publish(Record(b"plain", key=markup.encode(), headers=[("h", SCRIPT)]), 60)
    with Publisher(estate.cluster, PublisherConfig(stream=dlq)) as pub:
        failed = Record(SCRIPT, key=markup.encode())
        pub.publish(letter(failed, Reason.FAILED, markup, f"{stream.name}/0/0"), 60)
    with SqlStore(estate.db) as store:
        Archiver(
            estate.cluster, store, [dlq], group=f"arch-{uuid.uuid4().hex[:8]}",
            consumer_config={"session.timeout.ms": 6000},
        ).run(until_caught_up=True)  # fmt: skip
    client = console_of()
    escaped_markup = "&lt;img src=x onerror=alert(1)&gt;"
    escaped_script = "&lt;script&gt;window.__pwned = 1&lt;/script&gt;"
    records = client.get(f"/streams/{stream.name}", params={"q": "plain"}).text
    letters = client.get("/dlq", params={"stream": dlq.name}).text
    for page in (records, letters):
        assert markup not in page and SCRIPT.decode() not in page
        assert escaped_markup in page
    assert escaped_script in records and escaped_script in letters


def test_every_answer_keeps_foreign_scripts_and_frames_out(estate, console_of):
    client = console_of()
    answers = [
        client.get("/"),
        client.get(f"/streams/{estate.stream}"),
        client.get("/api/streams"),
        client.get("/static/console.css"),
        client.get("/", headers={"Host": "evil.example"}),  # a refusal too
    ]
    for answer in answers:
        policy = answer.headers["content-security-policy"]
        assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["x-content-type-options"] == "nosniff"
    assert answers[-1].status_code == 403


def test_the_durable_page_shows_each_client_its_marker_and_backlog(estate, console_of):
    """A durable client that connected (its marker: the end offsets then) and went away;
    two records came since."""
    stream = StreamConfig(name=estate.stream, partitions=1)
    durable_id = f"console-d-{uuid.uuid4().hex[:6]}"
    live = threading.Event()
    config = SubscriberConfig(
        stream=stream, durable_id=durable_id, durable_registry=estate.db,
        lease_timeout_ms=4_000, durable_timeout_s=3_600, on_live=live.set,
    )  # fmt: skip
    with Subscriber(estate.cluster, config) as client_of_durable:

        def replayed() -> bool:  # polled until its replay is over (on_live)
            client_of_durable.poll(100)
            return live.is_set()

        eventually(replayed, 60)
        client_of_durable.confirm()
    with Publisher(estate.cluster, PublisherConfig(stream=stream)) as pub:
        for i in range(2):
            pub.publish(Record(b"later %d" % i), 60)
    client = console_of()
    [row] = [
        c for c in client.get("/api/durable").json()["clients"] if c["durable_id"] == durable_id
    ]
    assert row["state"] == "away" and row["markers"] == {estate.stream: {"0": 35}}
    assert isinstance(row["marker_ms"], int) and row["backlog"] == 2
    page = client.get("/durable").text
    assert durable_id in page and f"{estate.stream}[0] 35" in page
