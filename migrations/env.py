"""Alembic environment for bolide's tables (Alembic's env.py shape: offline and online).

Run programmatically by ``SqlStore.upgrade()`` / ``bolide db upgrade``, which hand over an open
connection in ``config.attributes["connection"]``, or by Alembic's own CLI::

    alembic -c <site-packages>/bolide/migrations/alembic.ini -x url=sqlite:///bolide.db upgrade head

The database URL comes from the connection, ``-x url=...``, ``sqlalchemy.url`` or ``$BOLIDE_DB``.
"""

from __future__ import annotations

import os
from logging.config import fileConfig
from typing import Any

from alembic import context
from sqlalchemy import engine_from_config, pool
from sqlalchemy.engine import Connection

from bolide.stores.schema import VERSION_TABLE, is_typed_table, metadata

config = context.config

# Only the Alembic CLI configures logging from the ini; bolide's own callers keep theirs.
if config.cmd_opts is not None and config.config_file_name is not None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = metadata


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url")
    url = url or config.get_main_option("sqlalchemy.url") or os.environ.get("BOLIDE_DB")
    if not url:
        raise RuntimeError("no database URL: pass -x url=..., set sqlalchemy.url or $BOLIDE_DB")
    return url


def _include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Leave the typed Avro tables out: they are created at run time, not by migrations."""
    return not (type_ == "table" and name is not None and is_typed_table(name))


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        # SQLite cannot ALTER most things: later revisions use batch mode there.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        include_name=_include_name,
    )


def run_migrations_offline() -> None:
    """Emit the migration SQL for the configured URL without connecting."""
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations on the caller's connection, or on a fresh NullPool engine."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    section = config.get_section(config.config_ini_section, {})
    section["sqlalchemy.url"] = _url()
    connectable = engine_from_config(section, prefix="sqlalchemy.", poolclass=pool.NullPool)
    with connectable.connect() as conn:
        _configure(conn)
        with context.begin_transaction():
            context.run_migrations()
    connectable.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
