"""Store fixtures: every store test runs on a real SQLite file and a real PostgreSQL schema.

Each PostgreSQL test gets a fresh schema, selected through the URL's ``search_path`` option, so
tests never see each other's rows and cleanup is one ``DROP SCHEMA``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bolide.stores import SqlStore
from tests.conftest import DATABASES, PG_ADMIN_URL, make_db_url, pg_admin

__all__ = ["DATABASES", "PG_ADMIN_URL", "make_db_url", "pg_admin"]


@pytest.fixture(params=DATABASES)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URL of an empty database: a SQLite file, or a fresh PostgreSQL schema."""
    return make_db_url(request.param, tmp_path, request)


@pytest.fixture
def store(db_url: str) -> Iterator[SqlStore]:
    """A ``SqlStore`` on an empty database, upgraded to the newest schema."""
    with SqlStore(db_url) as s:
        s.upgrade()
        yield s
