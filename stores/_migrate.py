"""Alembic glue: the script directory inside the installed package, head, current, up and down.

Every command runs on a connection the caller owns, so an in-memory SQLite database and a
PostgreSQL ``search_path`` set in the URL both apply to the migrations too.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection, Engine

import bolide.migrations
from bolide.stores.schema import VERSION_TABLE

__all__ = ["alembic_config", "current_revision", "downgrade", "head_revision", "upgrade"]

_SCRIPT_DIR = Path(bolide.migrations.__file__).resolve().parent


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic ``Config`` for bolide's migrations, found next to the installed package."""
    config = Config(str(_SCRIPT_DIR / "alembic.ini"))
    config.set_main_option("script_location", str(_SCRIPT_DIR))
    config.set_main_option("version_locations", str(_SCRIPT_DIR / "versions"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def script_directory() -> ScriptDirectory:
    """The revisions shipped with this version of bolide."""
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The newest revision this code knows."""
    head = script_directory().get_current_head()
    if head is None:  # pragma: no cover - the package always ships revisions
        raise RuntimeError("bolide ships no migrations")
    return head


def known_revisions() -> set[str]:
    """Every revision id this code knows."""
    return {script.revision for script in script_directory().walk_revisions()}


def current_revision(engine: Engine) -> str | None:
    """The database's revision, or ``None`` when bolide's schema was never installed."""
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Upgrade to ``revision`` in one transaction where the database allows it."""
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Downgrade to ``revision`` (``"base"`` removes every bolide table)."""
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), revision)
