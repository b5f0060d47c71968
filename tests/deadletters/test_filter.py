"""``where`` filters: the check of the text, then the database's read-only run, on real
SQLite and PostgreSQL (no broker: the rows are dead letters built here)."""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa

from bolide.facade import DeadLetterFilterError
from bolide.stores import DeadLetter
from bolide.stores.deadletters._filter import COLUMN_NAMES, check_filter, select_ids
from bolide.stores.dialects import FILTER_ROLE


def _letter(offset: int, **fields: object) -> DeadLetter:
    headers = [("bolide.reason", b"failed" if offset % 2 else b"rejected")]
    if offset != 3:
        headers.append(("bolide.source", f"orders/0/{100 + offset}".encode()))
    values: dict[str, object] = {
        "stream": "dlq",
        "partition": 0,
        "offset": offset,
        "timestamp_ms": 1_000 * offset,
        "key": b"\xff\xfe" if offset == 2 else f"k{offset}".encode(),
        "value": None if offset == 4 else f"order {offset}".encode(),
        "headers": tuple(headers),
        "archived": offset < 2,
        "replayed_to": ("orders",) if offset == 1 else (),
    }
    values.update(fields)
    return DeadLetter(**values)  # type: ignore[arg-type]


LETTERS = [_letter(o) for o in range(6)]


def test_the_columns_are_what_the_docs_list() -> None:
    row = LETTERS[2].columns()
    assert tuple(row) == COLUMN_NAMES
    assert row["key_text"] is None  # not UTF-8
    assert row["source_stream"] == "orders" and row["source_offset"] == 102
    assert LETTERS[3].columns()["source"] is None
    assert LETTERS[4].columns()["payload"] is None


@pytest.mark.parametrize(
    ("where", "offsets"),
    [
        ("reason = 'failed'", {1, 3, 5}),
        ("source IS NULL", {3}),
        ("key_text IS NULL", {2}),
        ("payload IS NULL", {4}),
        ("payload_text LIKE 'order %' AND kafka_offset BETWEEN 1 AND 3", {1, 2, 3}),
        ("archived = 1 OR replayed = 1", {0, 1}),
        ("source_stream = 'orders' AND source_offset >= 104", {4, 5}),
        ("CAST(timestamp_ms AS INTEGER) / 1000 IN (0, 5)", {0, 5}),
        ("CASE WHEN reason = 'rejected' THEN 1 ELSE 0 END = 1", {0, 2, 4}),
        ("length(payload) > 7 OR substr(id, 1, 4) = 'none'", set()),
        ("upper(coalesce(key_text, 'x')) = 'X'", {2}),
        ("id = 'dlq/0/5'", {5}),
        ("reason = 'it''s'", set()),
    ],
)
def test_filters_choose_on_both_databases(db_url: str, where: str, offsets: set[int]) -> None:
    chosen = select_ids(sa.make_url(db_url), check_filter(where), [d.columns() for d in LETTERS])
    assert chosen == {f"dlq/0/{o}" for o in offsets}


@pytest.mark.parametrize(
    ("where", "why"),
    [
        ("reason = 'failed'; DROP TABLE bolide_records", "';' ends a statement"),
        ("1 = 1) UNION SELECT 'dlq/0/1' --", "closes a parenthesis"),
        ("reason = 'failed' /* comment */", "a comment"),
        ("reason = 'failed' -- comment", "a comment"),
        ("(SELECT count(*) FROM bolide_records) > 0", "SELECT belongs to a statement"),
        ("EXISTS (VALUES (1))", "EXISTS belongs to a statement"),
        ("reason = 'x' UNION ALL", "UNION belongs to a statement"),
        ("pg_sleep(10) IS NULL", "function pg_sleep()"),
        ('"pg_sleep"(10) IS NULL', "function pg_sleep()"),
        ("pg_catalog.set_config('a.b', 'c', false) = 'c'", "function set_config()"),
        ("reason = E'\\' OR 1=1 --'", "escape-string literal"),
        ("reason = :name", "':' outside a literal"),
        ("reason = ?", "'?' outside a literal"),
        ("reason = $$x$$", "'$' outside a literal"),
        ("reason = 'open", "a literal is not closed"),
        ("(reason = 'failed'", "a parenthesis is not closed"),
        ("   ", "where is empty"),
        ("x" * 4_001, "longer than 4000"),
    ],
)
def test_what_is_not_one_expression_is_refused_on_its_text(where: str, why: str) -> None:
    with pytest.raises(DeadLetterFilterError, match=re.escape(why)):
        check_filter(where)


def test_a_filter_must_be_text() -> None:
    with pytest.raises(TypeError, match="where must be a str"):
        check_filter(b"reason = 'failed'")


def test_casts_and_literals_that_look_like_trouble_are_fine() -> None:
    for where in (
        "detail LIKE '%; DROP TABLE x --%'",
        "reason = 'select'",
        "\"reason\" = 'failed'",
        "CAST(kafka_offset AS VARCHAR(10)) = '1'",
        "payload_text NOT IN ('a', 'b')",
    ):
        assert check_filter(f"  {where} ") == where


@pytest.mark.parametrize(
    "where",
    ["no_such_column = 1", "reason = 'failed' AND", "reason = = 'x'"],
)
def test_what_the_database_refuses_is_a_filter_error_even_without_rows(
    db_url: str, where: str
) -> None:
    with pytest.raises(DeadLetterFilterError, match="the database refused"):
        select_ids(sa.make_url(db_url), check_filter(where), [])


@pytest.mark.postgres
def test_postgresql_s_read_only_mode_refuses_a_change_the_text_check_let_through(
    pg_admin: sa.Engine, request: pytest.FixtureRequest, tmp_path
) -> None:
    from tests.conftest import make_db_url

    url = make_db_url("postgresql", tmp_path, request)
    select_ids(sa.make_url(url), "reason = 'failed'", [])  # the filter role exists from here
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE SEQUENCE counter"))
        # Rights the filter role should not have: the read-only transaction still holds.
        conn.execute(sa.text(f"GRANT USAGE ON SCHEMA {_schema(conn)} TO {FILTER_ROLE}"))
        conn.execute(sa.text(f"GRANT USAGE, UPDATE ON SEQUENCE counter TO {FILTER_ROLE}"))
    engine.dispose()
    # nextval() changes the database; the text check does not know it (select_ids is called
    # directly here), the read-only transaction refuses it.
    with pytest.raises(DeadLetterFilterError, match="tried to change data"):
        select_ids(sa.make_url(url), "nextval('counter') > 0", [d.columns() for d in LETTERS])


def _schema(conn: sa.Connection) -> str:
    return str(conn.execute(sa.text("SELECT current_schema()")).scalar_one())
