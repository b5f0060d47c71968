"""Found by the fault campaign: after its PostgreSQL server restarted, an ``Outbox`` refused
every row with "conn is on another database than the outbox's store", for good: the database's
identity it had noted holds the server's start time. It asks again before refusing."""

from __future__ import annotations

from pathlib import Path

import pytest

from bolide.facade import Record
from bolide.stores import Outbox, SqlStore
from tests.chaos.postgres import PrivatePostgres, postgres_binaries

pytestmark = pytest.mark.skipif(
    postgres_binaries() is None, reason="needs PostgreSQL's server binaries (initdb, pg_ctl)"
)


def test_rows_are_added_after_the_database_restarts(tmp_path: Path) -> None:
    server = PrivatePostgres(tmp_path / "postgres.log")
    server.start()
    try:
        with SqlStore(server.url) as store:
            store.upgrade()
            outbox = Outbox(store)
            with store.engine.begin() as conn:
                outbox.add(conn, "restarted", Record(b"before"))
            server.restart()
            with store.engine.begin() as conn:  # the pool replaces what the restart closed
                outbox.add(conn, "restarted", Record(b"after"))
            assert outbox.pending("restarted") == 2
            with SqlStore(f"sqlite:///{tmp_path}/other.db") as other:
                other.upgrade()
                with (
                    pytest.raises(ValueError, match="another database"),
                    other.engine.begin() as conn,
                ):
                    outbox.add(conn, "restarted", Record(b"elsewhere"))
    finally:
        server.stop()
