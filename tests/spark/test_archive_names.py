"""Stream names reach the archive's JDBC read as data, never as SQL text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bolide.facade import Record
from bolide.spark._archive import has_jdbc_driver, jdbc_options
from bolide.spark.jobs import load_archive
from bolide.stores import SqlStore
from tests.conftest import DATABASES, upgraded_db_url

pytestmark = pytest.mark.spark

#: Names a quoting mistake would turn into SQL: quotes, backslashes, a comment.
HOSTILE = ["it's", "x\\' OR 1=1 --", "back\\", "plain"]


@pytest.mark.parametrize("kind", DATABASES)
def test_hostile_stream_names_are_data_in_a_jdbc_read(
    spark: Any, kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = upgraded_db_url(kind, tmp_path, request)
    if kind == "postgresql":
        # Backslashes escape in string literals here: doubling quotes is not enough.
        url += "%20-cstandard_conforming_strings%3Doff"
    if not has_jdbc_driver(spark, jdbc_options(url)["driver"]):
        pytest.skip(
            "no JDBC driver jar (apt install libpostgresql-jdbc-java libxerial-sqlite-jdbc-java)"
        )
    with SqlStore(url) as store:
        for name in HOSTILE:
            record = Record(name.encode(), headers=[("h", b"v")])
            record.partition, record.offset = 0, 0
            store.store_all(name, [record])
    for name in [*HOSTILE, "nope\\' OR 1=1 --", "nope' OR '1'='1"]:
        rows = load_archive(spark, url, [name], via="jdbc").collect()
        expected = [name] if name in HOSTILE else []
        assert [r["topic"] for r in rows] == expected, name
        assert [bytes(r["value"]) for r in rows] == [n.encode() for n in expected]
        assert all(len(r["headers"]) == 1 for r in rows)
