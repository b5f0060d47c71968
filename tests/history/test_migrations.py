"""Schema migrations on real SQLite and PostgreSQL: up, down, refusal, drift, secrets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from bolide.facade import Record, SchemaOutOfDateError, StoreError
from bolide.stores import SqlStore
from bolide.stores._migrate import alembic_config, script_directory
from bolide.stores.schema import VERSION_TABLE, metadata

HISTORY_TABLES = {"bolide_records", "bolide_record_headers"}


def tables(store: SqlStore) -> set[str]:
    return set(sa.inspect(store.engine).get_table_names())


def published(offset: int) -> Record:
    record = Record(b"x")
    record.partition, record.offset = 0, offset
    return record


def test_upgrade_then_downgrade_to_base(db_url: str) -> None:
    with SqlStore(db_url) as store:
        assert store.current() is None
        store.upgrade()
        assert store.current() == store.head()
        assert tables(store) >= HISTORY_TABLES
        assert VERSION_TABLE in tables(store)
        store.store_all("s", [published(0)])
        store.downgrade("base")
        assert store.current() is None
        assert not HISTORY_TABLES & tables(store)
        store.upgrade()  # and back up again on the same database
        assert store.largest_offset("s", 0) is None


def test_every_revision_steps_down_and_up(db_url: str) -> None:
    revisions = [s.revision for s in script_directory().walk_revisions()]  # head first
    assert revisions[-1] == "0001"
    with SqlStore(db_url) as store:
        store.upgrade()
        for expected in [*revisions[1:], None]:
            store.downgrade("-1")
            assert store.current() == expected
        for expected in reversed(revisions):
            store.upgrade("+1")
            assert store.current() == expected


def test_store_refuses_a_database_without_schema(db_url: str) -> None:
    with SqlStore(db_url) as store:
        with pytest.raises(SchemaOutOfDateError, match="bolide db upgrade --db") as info:
            store.store_all("s", [published(0)])
        assert store.url in str(info.value)
        with pytest.raises(SchemaOutOfDateError):
            store.read("s", 0, 0, 10)


def test_store_refuses_a_schema_behind_head(db_url: str) -> None:
    with SqlStore(db_url) as store:
        store.upgrade()
        store.store_all("s", [published(0)])
    below = _set_revision_below_head(db_url)
    with SqlStore(db_url) as store, pytest.raises(SchemaOutOfDateError) as info:
        store.largest_offset("s", 0)
    message = str(info.value)
    assert "bolide db upgrade --db" in message
    if below is None:  # head is the first revision: "below" means no schema at all
        assert "no bolide schema" in message
    else:
        assert f"revision {below}, behind head" in message


def _set_revision_below_head(db_url: str) -> str | None:
    """Record the revision just below head, as an older bolide would have left it."""
    scripts = script_directory()
    head = scripts.get_revision(scripts.get_current_head())
    below = head.down_revision if head is not None else None
    engine = sa.create_engine(db_url, poolclass=sa.NullPool)
    with engine.begin() as conn:
        if below is None:
            conn.execute(sa.text(f"DELETE FROM {VERSION_TABLE}"))
        else:
            conn.execute(
                sa.text(f"UPDATE {VERSION_TABLE} SET version_num = :rev"), {"rev": str(below)}
            )
    engine.dispose()
    return None if below is None else str(below)


def test_unknown_newer_revision_is_a_store_error(db_url: str) -> None:
    with SqlStore(db_url) as store:
        store.upgrade()
        with store.engine.begin() as conn:
            conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = '9999'"))
        with pytest.raises(StoreError, match="unknown to this version") as info:
            store.check_schema()
        assert not isinstance(info.value, SchemaOutOfDateError)


def test_check_schema_false_skips_the_check(db_url: str) -> None:
    with SqlStore(db_url, check_schema=False) as store, pytest.raises(StoreError) as info:
        store.largest_offset("s", 0)
    assert not isinstance(info.value, SchemaOutOfDateError)


def test_models_match_migrations(db_url: str) -> None:
    """``alembic check`` for the history tables: the metadata and the revisions agree."""
    with SqlStore(db_url) as store:
        store.upgrade()
        with store.engine.connect() as conn:
            context = MigrationContext.configure(
                conn,
                opts={
                    "compare_type": True,
                    "version_table": VERSION_TABLE,
                    "include_name": lambda name, kind, _parent: (
                        kind != "table" or name in metadata.tables
                    ),
                },
            )
            assert compare_metadata(context, metadata) == []


def test_the_schema_names_every_table_the_revisions_create(db_url: str) -> None:
    """``bolide.stores.schema`` (what ``migrations/env.py`` compares) holds every table."""
    with SqlStore(db_url) as store:
        store.upgrade()
        assert tables(store) - {VERSION_TABLE} == set(metadata.tables)


def test_offline_mode_emits_sql(tmp_path: Path) -> None:
    config = alembic_config()
    config.cmd_opts = None
    config.set_main_option("sqlalchemy.url", "postgresql+psycopg://u@h/db")
    out = tmp_path / "upgrade.sql"
    with out.open("w") as handle:
        config.output_buffer = handle
        command.upgrade(config, "head", sql=True)
    sql = out.read_text()
    assert "CREATE TABLE bolide_records" in sql
    assert "USING hash" in sql
    assert VERSION_TABLE in sql


def test_alembic_cli_finds_the_installed_scripts(tmp_path: Path) -> None:
    import bolide.migrations

    ini = Path(bolide.migrations.__file__).parent / "alembic.ini"
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    run = subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(ini), "-x", f"url={url}", "upgrade", "head"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    with SqlStore(url) as store:
        assert store.current() == store.head()


@pytest.mark.postgres
def test_passwords_never_show() -> None:
    url = "postgresql+psycopg://bolide:s3cr3t-pw@127.0.0.1:1/nowhere"
    store = SqlStore(url)
    assert "s3cr3t-pw" not in repr(store)
    assert "s3cr3t-pw" not in store.url
    assert "***" in store.url
    with pytest.raises(StoreError) as info:
        store.check_schema()
    assert "s3cr3t-pw" not in str(info.value)
    assert info.value.retriable
    assert info.value.__cause__ is None or "s3cr3t-pw" not in str(info.value.__cause__)
    store.close()


def test_dead_letter_books_keep_their_rows_across_0009(db_url: str) -> None:
    """Up: rows of 0008 become rows of an unknown topic (``''``, no timestamp). Down: of rows
    that differ only by topic, the newest stays."""
    with SqlStore(db_url) as store:
        store.upgrade("0008")
        place = {"stream": "s-dlq", "kafka_partition": 0, "kafka_offset": 3}
        with store.engine.begin() as conn:
            purges = sa.Table("bolide_dead_letter_purges", sa.MetaData(), autoload_with=conn)
            conn.execute(purges.insert(), [{**place, "purged_ms": 1_000}])
        store.upgrade("0009")
        with store.engine.begin() as conn:
            purges = sa.Table("bolide_dead_letter_purges", sa.MetaData(), autoload_with=conn)
            assert [
                tuple(r) for r in conn.execute(sa.select(purges.c.topic_id, purges.c.timestamp_ms))
            ] == [("", None)]
            conn.execute(
                purges.insert(),
                [{**place, "topic_id": "new-topic", "timestamp_ms": 1_500, "purged_ms": 2_000}],
            )
        store.downgrade("0008")
        with store.engine.connect() as conn:
            purges = sa.Table("bolide_dead_letter_purges", sa.MetaData(), autoload_with=conn)
            assert conn.execute(sa.select(purges.c.purged_ms)).scalars().all() == [2_000]
            assert "topic_id" not in purges.c
