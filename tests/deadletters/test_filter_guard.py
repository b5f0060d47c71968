"""What the database enforces on a ``where`` filter, whatever its text check made of it: no
table read, no function beyond the filter's own (SQLite) or none the store's user alone may
call (PostgreSQL), and a bounded time. ``select_ids`` is called without ``check_filter`` here,
as a filter the text check misreads reaches it, on real SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from bolide.facade import DeadLetterFilterError, StoreError
from bolide.stores.deadletters._filter import check_filter, select_ids
from bolide.stores.dialects import FILTER_ROLE
from tests.conftest import make_db_url
from tests.deadletters.test_filter import LETTERS, _letter

SECRET = "hunter2"
ROWS = [d.columns() for d in LETTERS]
#: The disguise: SQLite reads [x'] (and `x'`) as a name, a text check as a literal's start.
SQLITE_BYPASSES = [
    "CAST(1 AS [x']) = 2 OR EXISTS(SELECT 1 FROM secrets WHERE value LIKE 'hunt%') "
    "OR CAST(2 AS [y']) = 3",
    "CAST(1 AS `x'`) = 2 OR EXISTS(SELECT 1 FROM secrets) OR CAST(2 AS `y'`) = 3",
    "EXISTS(SELECT 1 FROM sqlite_master)",
    "EXISTS(SELECT 1 FROM pragma_table_info('secrets'))",
    "EXISTS(WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT 1 FROM r)",
    "EXISTS(SELECT 1 FROM dead_letters)",
    "[load_extension]('/tmp/nothing') IS NULL",
    "[sqlite_version]() IS NOT NULL",
]
POSTGRESQL_BYPASSES = [
    "E'\\'' = '' OR EXISTS(SELECT 1 FROM secrets)",
    "$q$x$q$ = 'x' OR EXISTS(SELECT 1 FROM secrets)",
    'EXISTS(SELECT 1 FROM "secrets")',
    "pg_read_file('/etc/hostname') IS NOT NULL",
    "length(pg_read_binary_file('/etc/hostname')) > 0",
    "set_config('role', 'postgres', true) IS NOT NULL AND EXISTS(SELECT 1 FROM secrets)",
]
#: Both databases: a table behind a comment, a CTE, a scalar subquery.
COMMON_BYPASSES = [
    "1 = 1 /* */ OR EXISTS(SELECT 1 FROM secrets)",
    "EXISTS(WITH s AS (SELECT value FROM secrets) SELECT 1 FROM s WHERE value = 'hunter2')",
    "reason = 'x' OR (SELECT count(*) FROM secrets) > 0",
]
#: A billion rows of constants: no table, no recursion, and no end in sight.
_DIGITS = " UNION ALL ".join(f"SELECT {i} AS n" for i in range(1, 11))
ENDLESS = (
    "EXISTS(SELECT 1 FROM "
    + ", ".join(f"({_DIGITS}) AS {t}" for t in "abcdefghi")
    + " WHERE "
    + " + ".join(f"{t}.n" for t in "abcdefghi")
    + " < 0)"
)


@pytest.fixture
def secret_url(db_url: str) -> str:
    """``db_url`` with a table ``secrets`` holding ``SECRET``."""
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE secrets (value TEXT)"))
        conn.execute(sa.text("INSERT INTO secrets VALUES (:v)"), {"v": SECRET})
    engine.dispose()
    return db_url


def _bypasses(db_url: str) -> list[str]:
    own = SQLITE_BYPASSES if db_url.startswith("sqlite") else POSTGRESQL_BYPASSES
    return COMMON_BYPASSES + own


def test_a_filter_reaches_no_table_and_no_file_whatever_its_text(secret_url: str) -> None:
    url = sa.make_url(secret_url)
    for where in _bypasses(secret_url):
        with pytest.raises(DeadLetterFilterError, match="reaches beyond the dead letters"):
            select_ids(url, where, ROWS)


def test_the_repro_through_the_text_check_chooses_nothing(secret_url: str) -> None:
    # The text check takes [x'] for a literal; the database still stops the subquery (SQLite),
    # or cannot parse it (PostgreSQL).
    where = check_filter(SQLITE_BYPASSES[0])
    with pytest.raises(DeadLetterFilterError):
        select_ids(sa.make_url(secret_url), where, ROWS)


@pytest.mark.parametrize(
    "where",
    [
        ENDLESS,
        "EXISTS(WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) "
        "SELECT 1 FROM r WHERE n < 0)",
    ],
    ids=["cross-join", "recursive"],
)
def test_a_filter_that_runs_too_long_is_stopped(db_url: str, where: str) -> None:
    with pytest.raises(DeadLetterFilterError) as stopped:
        select_ids(sa.make_url(db_url), where, ROWS, timeout_ms=300)
    if where == ENDLESS or not db_url.startswith("sqlite"):
        assert "ran longer than where_timeout_ms=300" in str(stopped.value)
    else:  # SQLite denies a recursive query before it runs
        assert "a recursive query" in str(stopped.value)


def test_sqlite_keeps_a_filter_s_values_small(tmp_path: Path) -> None:
    # Each replace() is one step of SQLite's machine, between two looks at the clock: nested,
    # they would build a gigabyte (past the time bound) before SQLite's own limit stopped them.
    # Here 32 MiB: past the filter's bound, far below SQLite's own.
    grown = "'xxxxxxxxxxxxxxxx'"
    for _ in range(7):
        grown = f"replace({grown}, 'x', 'xxxxxxxx')"
    where = check_filter(f"length({grown}) < 0")
    with pytest.raises(DeadLetterFilterError, match="a value larger than a filter may"):
        select_ids(sa.make_url(f"sqlite:///{tmp_path / 'h.db'}"), where, ROWS)
    # Dead letters larger than that bound are still filtered.
    big = [_letter(0, value=b"y" * (20 * 1024 * 1024)).columns()]
    assert select_ids(sa.make_url(f"sqlite:///{tmp_path / 'h.db'}"), "length(payload) > 0", big)


@pytest.mark.parametrize(
    "literal", ["x :foo", "at 10:30", "a\\:b", "::x", "%(y)s", "% :x %"], ids=repr
)
def test_a_literal_holding_a_colon_word_is_a_literal(db_url: str, literal: str) -> None:
    letters = [_letter(0, headers=(("bolide.reason", literal.encode()),)), LETTERS[1]]
    quoted = literal.replace("'", "''")
    where = check_filter(f"reason = '{quoted}' OR detail = '{quoted}'")
    rows = [d.columns() for d in letters]
    assert select_ids(sa.make_url(db_url), where, rows) == {letters[0].id}


@pytest.mark.postgres
def test_postgresql_runs_the_filter_as_a_role_without_rights(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = sa.make_url(make_db_url("postgresql", tmp_path, request))
    # More rows than one statement holds: every statement runs as the role.
    rows = [_letter(o).columns() for o in range(450)]
    chosen = select_ids(url, f"current_user = '{FILTER_ROLE}'", rows)
    assert len(chosen) == 450


@pytest.mark.postgres
def test_postgresql_reads_literals_as_the_text_check_does(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # With standard_conforming_strings off, a backslash in a literal escapes the next character
    # and a literal may end elsewhere than the text check saw: the filter turns it on.
    url = make_db_url("postgresql", tmp_path, request) + "%20-cstandard_conforming_strings%3Doff"
    letters = [_letter(0, headers=(("bolide.reason", b"a\\b"),)), LETTERS[1]]
    where = check_filter("reason = 'a\\b'")
    rows = [d.columns() for d in letters]
    assert select_ids(sa.make_url(url), where, rows) == {letters[0].id}


@pytest.mark.postgres
def test_a_user_that_cannot_become_the_filter_role_gets_the_grant_to_run(
    pg_admin: sa.Engine, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = sa.make_url(make_db_url("postgresql", tmp_path, request))
    select_ids(url, "reason = 'failed'", ROWS)  # the role exists from here on
    user = f"u_{uuid.uuid4().hex[:12]}"
    with pg_admin.connect() as conn:
        conn.execute(sa.text(f"CREATE ROLE {user} LOGIN"))
    request.addfinalizer(lambda: _drop_role(pg_admin, user))
    with pytest.raises(StoreError, match=f"GRANT {FILTER_ROLE} TO {user}"):
        select_ids(url.set(username=user), "reason = 'failed'", ROWS)
    with pg_admin.connect() as conn:
        conn.execute(sa.text(f"GRANT {FILTER_ROLE} TO {user}"))
    assert select_ids(url.set(username=user), "reason = 'failed'", ROWS) == {
        "dlq/0/1",
        "dlq/0/3",
        "dlq/0/5",
    }


def _drop_role(admin: sa.Engine, user: str) -> None:
    with admin.connect() as conn:
        conn.execute(sa.text(f"DROP ROLE IF EXISTS {user}"))
