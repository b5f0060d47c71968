"""The Spark jobs end to end: archive into SQLite/PostgreSQL, resequence, query; the CLI."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from bolide.cli.main import main as cli_main
from bolide.facade import BolideError, Cluster, Record, SchemaOutOfDateError, StreamConfig
from bolide.facade.compat import stale_watermarks
from bolide.facade.deadletter import REASON_HEADER
from bolide.facade.resequencer.sequence import Sequence, parse_sequence, sequence_headers
from bolide.spark import BatchReport, archive, load_archive, query, resequence
from bolide.spark._archive import has_jdbc_driver, jdbc_options, records_by_stream
from bolide.spark.jobs import resolve_source
from bolide.stores import SqlStore

from .conftest import drain, publish, sample

pytestmark = pytest.mark.spark


def _stored(url: str, stream: StreamConfig, partition: int = 0) -> list[Record]:
    with SqlStore(url) as store:
        return store.read(stream.name, partition, 0, 10_000)


@pytest.mark.kafka
@pytest.mark.parametrize("source", ["kafka", "bolide"])
def test_archive_end_to_end_and_restart(
    spark: Any, cluster: Cluster, stream_factory, store_url: str, tmp_path: Path, source: str
) -> None:
    stream = stream_factory()
    first = sample(45)
    publish(cluster, stream, first)
    checkpoint = str(tmp_path / "ckpt")
    reports: list[BatchReport] = []
    archive(
        spark,
        stream,
        store_url,
        checkpoint,
        bootstrap=cluster,
        max_offsets_per_trigger=20,
        on_batch=reports.append,
        source=source,
    )
    assert [r.rows for r in reports] == [20, 20, 5]
    assert sum(r.written for r in reports) == 45

    # Crash after the sink wrote the last batch but before Spark recorded it as done: the
    # restart replays that batch, and the idempotent write inserts nothing twice.
    commits = tmp_path / "ckpt" / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink(missing_ok=True)  # the checksum of the same entry
    second = sample(10, prefix="more")
    publish(cluster, stream, second)
    reports.clear()
    archive(
        spark,
        stream,
        store_url,
        checkpoint,
        bootstrap=cluster,
        max_offsets_per_trigger=20,
        on_batch=reports.append,
        source=source,
    )
    assert reports[0].rows == 5 and reports[0].written == 0  # the replayed batch
    assert sum(r.written for r in reports) == 10

    stored = _stored(store_url, stream)
    expected = first + second
    assert [r.offset for r in stored] == list(range(55))
    assert [(r.key, r.data, r.headers, r.timestamp_ms) for r in stored] == [
        (r.key, r.data, r.headers, r.timestamp_ms) for r in expected
    ]


def test_auto_picks_sparks_kafka_source_unless_history_is_spliced(
    spark: Any, cluster: Cluster
) -> None:
    """The session has the connector: Spark's source, but the Python one splices history
    (and works around the embedded Tansu engine's fetch deviations)."""
    expected = "bolide" if stale_watermarks(cluster) else "kafka"
    assert resolve_source(spark, "auto", cluster) == expected
    assert resolve_source(spark, "auto", cluster, history="sqlite://") == "bolide"
    assert resolve_source(spark, "bolide", cluster) == "bolide"


def _seq_records(groups: dict[str, int], incomplete: str) -> list[Record]:
    records = []
    for group, size in groups.items():
        numbers = range(size - 1) if group == incomplete else range(size)
        for n in numbers:
            headers = [("n", str(n).encode()), *sequence_headers(group, size, n)]
            records.append(Record(f"{group}:{n}".encode(), headers=headers, group=group))
    return records


@pytest.mark.kafka
@pytest.mark.slow
def test_resequence_job_orders_shuffled_groups(
    spark: Any, cluster: Cluster, stream_factory, tmp_path: Path
) -> None:
    source = stream_factory(partitions=2, global_order=False)
    output = stream_factory(name_prefix="ordered", partitions=2, global_order=False)
    dead = stream_factory(name_prefix="dead")
    groups = {f"order-{i}": 3 + i % 4 for i in range(8)}
    records = _seq_records(groups, incomplete="order-7")
    random.Random(7).shuffle(records)  # groups interleaved and numbers out of order
    loose = Record(b"no-sequence")
    duplicate = Record(b"order-0:1", headers=sequence_headers("order-0", 3, 1), group="order-0")
    bad = Record(
        b"bad",
        headers=[
            ("bolide.seq.group", b"order-x"),
            ("bolide.seq.size", b"two"),
            ("bolide.seq.number", b"0"),
        ],
        group="order-x",
    )
    publish(cluster, source, [*records, loose, duplicate, bad])
    missing, passing_through = 1, 1  # order-7 lacks one record: only its timeout releases it
    expected = sum(groups.values()) - missing + passing_through

    query = resequence(
        spark,
        source,
        output,
        str(tmp_path / "ckpt"),
        bootstrap=cluster,
        timeout_s=4.0,
        dead_letter=dead,
        trigger_interval_s=0.5,
    )
    try:
        got = drain(cluster, output, expected, 60)
        dead_letters = drain(cluster, dead, 1, 10)
    finally:
        query.stop()
    assert query.exception() is None
    assert len(got) == expected
    by_group: dict[str, list[int]] = {}
    for msg in got:
        record = Record(msg.value(), key=msg.key(), headers=msg.headers())
        seq = parse_sequence(record)
        if seq is None:
            assert msg.value() == b"no-sequence"
            continue
        assert isinstance(seq, Sequence), seq
        by_group.setdefault(seq.group, []).append(seq.number)
        assert msg.value() == f"{seq.group}:{seq.number}".encode()
    for group, size in groups.items():
        want = list(range(size - 1 if group == "order-7" else size))
        assert by_group[group] == want, group  # in sequence order, duplicate dropped
    assert [m.value() for m in dead_letters] == [b"bad"]
    assert dict(dead_letters[0].headers())[REASON_HEADER] == b"malformed"


@pytest.mark.kafka
def test_query_over_the_archive(
    spark: Any, cluster: Cluster, stream_factory, store_url: str, tmp_path: Path
) -> None:
    stream = stream_factory()
    publish(cluster, stream, sample(30))
    archive(spark, stream, store_url, str(tmp_path / "ckpt"), bootstrap=cluster)
    sql = (
        "SELECT cast(key AS string) AS k, count(*) AS n, max(offset) AS last, "
        "sum(size(coalesce(headers, array()))) AS h FROM records GROUP BY k ORDER BY k"
    )
    expected = [("k0", 10, 27, 9 + 3 * 2 - 2), ("k1", 10, 28, 0), ("k2", 10, 29, 0)]
    for via in ("store", "jdbc"):
        if via == "jdbc" and not _jdbc_available(spark, store_url):
            continue
        rows = query(spark, sql, store_url, [stream.name], via=via).collect()
        got = [(r["k"], r["n"], r["last"], r["h"]) for r in rows]
        assert [g[:3] for g in got] == [e[:3] for e in expected], via
        headers = sum(len(r.headers) for r in sample(30))
        assert sum(g[3] for g in got) == headers, via
    stored = load_archive(spark, store_url, [stream.name], via="store")
    assert stored.orderBy("offset").first()["headers"] is None  # record 0 has no headers


@pytest.mark.kafka
def test_records_read_back_through_spark_keep_their_message_group(
    spark: Any, cluster: Cluster, stream_factory, sqlite_url: str, tmp_path: Path
) -> None:
    stream = stream_factory()
    sent = [Record(b"a", group="order-1"), Record(b"b", key="plain"), Record(b"c", group="o-2")]
    publish(cluster, stream, sent)
    archive(spark, stream, sqlite_url, str(tmp_path / "ckpt"), bootstrap=cluster)
    table = load_archive(spark, sqlite_url, [stream.name], via="store").orderBy("offset").toArrow()
    back = records_by_stream(table)[stream.name]
    assert [(r.data, r.group, r.key) for r in back] == [
        (b"a", "order-1", b"order-1"),
        (b"b", None, b"plain"),
        (b"c", "o-2", b"o-2"),
    ]
    assert [r.group for r in back] == [r.group for r in _stored(sqlite_url, stream)]
    assert [(r.stream, r.partition, r.offset) for r in back] == [
        (stream.name, 0, n) for n in range(3)
    ]


def _jdbc_available(spark: Any, url: str) -> bool:
    return has_jdbc_driver(spark, jdbc_options(url)["driver"])


@pytest.mark.kafka
def test_jdbc_read_matches_the_store(
    spark: Any, cluster: Cluster, stream_factory, store_url: str, tmp_path: Path
) -> None:
    if not _jdbc_available(spark, store_url):
        pytest.skip(
            "no JDBC driver jar (apt install libpostgresql-jdbc-java libxerial-sqlite-jdbc-java)"
        )
    stream = stream_factory()
    publish(cluster, stream, sample(12))
    archive(spark, stream, store_url, str(tmp_path / "ckpt"), bootstrap=cluster)
    cols = ["key", "value", "topic", "partition", "offset", "timestamp", "headers"]
    via_jdbc = load_archive(spark, store_url, [stream.name], via="jdbc").select(*cols)
    via_store = load_archive(spark, store_url, [stream.name], via="store").select(*cols)
    assert via_jdbc.orderBy("offset").collect() == via_store.orderBy("offset").collect()


@pytest.mark.kafka
def test_cli_archive_and_query(
    spark: Any, cluster: Cluster, stream_factory, sqlite_url: str, tmp_path: Path, capsys
) -> None:
    stream = stream_factory()
    publish(cluster, stream, sample(8))
    code = cli_main(
        [
            "spark",
            "archive",
            "--bootstrap",
            cluster.bootstrap_servers,
            f"-Xfetch_gap_settle_ms={cluster.fetch_gap_settle_ms}",
            "--db",
            sqlite_url,
            "--stream",
            stream.name,
            "--checkpoint",
            str(tmp_path / "ckpt"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "batch 0: 8 rows, 8 written" in out
    code = cli_main(
        [
            "spark",
            "query",
            "--db",
            sqlite_url,
            "--via",
            "store",
            f"SELECT count(*) AS n FROM records WHERE topic = '{stream.name}'",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "|  8|" in out.replace(" ", " ")
    code = cli_main(["spark", "query", "--db", sqlite_url, "SELECT nope FROM records"])
    assert code == 1
    assert "nope" in capsys.readouterr().err


def test_cli_help_lists_the_jobs(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        cli_main(["spark", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for job in ("archive", "resequence", "query"):
        assert job in out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--conf", "spark.executor.memory"], "expected key=value"),
        (["--conf", "=1g"], "expected key=value"),
        (["--deploy-mode", "cluster"], "spark-submit --deploy-mode cluster"),
        (["--deploy-mode", "nearby"], "invalid choice"),
    ],
)
def test_cli_refuses_spark_options_it_cannot_honour(
    flags: list[str], message: str, sqlite_url: str, capsys
) -> None:
    # Refused before any SparkSession is made: a usage error, exit code 2.
    with pytest.raises(SystemExit) as info:
        cli_main(["spark", "query", "--db", sqlite_url, *flags, "SELECT 1"])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_archive_refuses_a_store_without_schema(spark: Any, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    with pytest.raises(SchemaOutOfDateError, match="bolide db upgrade"):
        archive(spark, "orders", url, str(tmp_path / "ckpt"), bootstrap="127.0.0.1:1")


@pytest.mark.kafka
def test_archive_failure_is_a_bolide_error(
    spark: Any,
    cluster: Cluster,
    stream_factory,
    sqlite_url: str,
    tmp_path: Path,
    cluster_with_starts,
) -> None:
    stream = stream_factory()
    publish(cluster, stream, sample(10))
    with pytest.raises(BolideError, match="failOnDataLoss") as info:
        archive(
            spark,
            stream,
            sqlite_url,
            str(tmp_path / "ckpt"),
            bootstrap=cluster_with_starts({stream.name: {0: 5}}),
            starting_offsets=json.dumps({stream.name: {"0": 0}}),
        )
    assert "bolide-archive" in str(info.value)
    assert _stored(sqlite_url, stream) == []


@pytest.mark.kafka
def test_archive_with_a_serde_fills_the_typed_table(
    spark: Any, cluster: Cluster, stream_factory, store_url: str, tmp_path: Path
) -> None:
    import sqlalchemy as sa

    from bolide.facade import AvroSerde, Publisher, PublisherConfig
    from bolide.stores import SqlSchemaRegistry
    from bolide.stores.typed_archive import typed_table_name
    from tests.avro.conftest import ORDER_V1, ORDER_V2, order

    stream = stream_factory(name_prefix="typed")
    with SqlStore(store_url) as store:
        registry = SqlSchemaRegistry(store)
        with Publisher(
            cluster, PublisherConfig(stream=stream, serde=AvroSerde(ORDER_V1, registry=registry))
        ) as pub:
            for n in range(3):
                pub.publish(order(n))
            pub.publish(Record(b"not avro"))
        with Publisher(
            cluster, PublisherConfig(stream=stream, serde=AvroSerde(ORDER_V2, registry=registry))
        ) as pub:
            pub.publish(order(4, country="DE"))
        reports: list[BatchReport] = []
        archive(
            spark,
            stream,
            store,
            str(tmp_path / "ckpt"),
            bootstrap=cluster,
            max_offsets_per_trigger=3,
            on_batch=reports.append,
            serde=AvroSerde(ORDER_V1, registry=registry),
        )
        assert sum(r.written for r in reports) == 5
        assert len(store.read(stream.name, 0, 0, 100)) == 5  # the raw archive keeps all five
        with store.engine.connect() as conn:
            got = conn.execute(
                sa.text(
                    f"SELECT kafka_offset, id, country, address__city "
                    f"FROM {typed_table_name(stream.name)} ORDER BY 1"
                )
            ).all()
    assert [tuple(r) for r in got] == [
        (0, 0, None, "Paris"),
        (1, 1, None, "Lyon"),
        (2, 2, None, "Paris"),
        (4, 4, "DE", "Paris"),
    ]


def test_archive_fills_the_typed_table_of_a_protobuf_stream(
    spark: Any, cluster: Cluster, stream_factory, store_url: str, tmp_path: Path
) -> None:
    import sqlalchemy as sa

    from bolide.facade import ProtobufSerde, Publisher, PublisherConfig
    from bolide.stores import SqlSchemaRegistry
    from bolide.stores.typed_archive import typed_table_name
    from tests.schemas.conftest import Order, make_order

    stream = stream_factory(name_prefix="typedproto")
    with SqlStore(store_url) as store:
        registry = SqlSchemaRegistry(store)
        serde = ProtobufSerde(Order, registry=registry, framing="header")
        with Publisher(cluster, PublisherConfig(stream=stream, serde=serde)) as pub:
            for n in range(3):
                pub.publish(make_order(n))
        archive(
            spark,
            stream,
            store,
            str(tmp_path / "ckpt"),
            bootstrap=cluster,
            serde=ProtobufSerde(registry=registry),  # decode-only: the executors need no class
        )
        with store.engine.connect() as conn:
            got = conn.execute(
                sa.text(
                    f"SELECT kafka_offset, id, price__cents, status "
                    f"FROM {typed_table_name(stream.name)} ORDER BY 1"
                )
            ).all()
    assert [tuple(r) for r in got] == [
        (n, f"o{n}", 100 * n, ["NEW", "PAID", "SHIPPED"][n]) for n in range(3)
    ]


def test_archive_refuses_a_serde_that_cannot_type_rows(spark: Any, sqlite_url: str) -> None:
    with pytest.raises(TypeError, match="AvroSerde, a ProtobufSerde or a JsonSchemaSerde"):
        archive(spark, "s", sqlite_url, "ckpt", bootstrap="127.0.0.1:1", serde=object())
