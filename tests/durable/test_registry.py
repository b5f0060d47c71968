"""The durable registry on real SQLite and PostgreSQL: claims, leases, expiry, markers."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from bolide.facade import DurableClientBusyError, StoreError
from bolide.stores import SqlStore
from bolide.stores.durable_registry import SqlDurableRegistry
from bolide.stores.schema import DURABLE_CLIENTS, DURABLE_MARKERS, VERSION_TABLE


def _register(reg: SqlDurableRegistry, owner: str, *, timeout_s: float = 60, lease_ms: int = 5_000):
    return reg.register(
        "c1",
        group_id="bolide-durable-c1",
        stream="s",
        timeout_s=timeout_s,
        owner=owner,
        lease_ms=lease_ms,
    )


def test_new_then_busy_then_resumed(registry: SqlDurableRegistry) -> None:
    claim = _register(registry, "a")
    assert claim.state == "new" and claim.previous is None
    assert claim.client.connected and claim.client.owner == "a" and claim.client.connections == 1
    with pytest.raises(DurableClientBusyError, match="already connected elsewhere"):
        _register(registry, "b")
    assert registry.release("c1", "a")
    seen = registry.get("c1")
    assert seen is not None and not seen.connected and seen.owner is None
    again = _register(registry, "b")
    assert again.state == "resumed" and again.client.connections == 2
    assert again.previous is not None and again.previous.owner is None


def test_lapsed_lease_frees_the_id(registry: SqlDurableRegistry) -> None:
    _register(registry, "killed", lease_ms=1_500)  # never renewed, never released
    with pytest.raises(DurableClientBusyError):
        _register(registry, "b")
    time.sleep(1.6)
    claim = _register(registry, "b")
    assert claim.state == "resumed" and claim.client.owner == "b"
    # The lapsed owner can neither renew nor release the claim it lost.
    assert not registry.touch("c1", "killed", 5_000)
    assert not registry.release("c1", "killed")
    assert registry.touch("c1", "b", 5_000)


def test_expired_after_timeout_drops_the_marker(registry: SqlDurableRegistry) -> None:
    _register(registry, "a", timeout_s=0.2)
    registry.mark("c1", "s", {0: 10, 1: 20})
    assert registry.get("c1").markers == {"s": {0: 10, 1: 20}}  # type: ignore[union-attr]
    registry.release("c1", "a")
    time.sleep(0.35)
    listed = registry.list()
    assert [c.durable_id for c in listed] == ["c1"] and listed[0].expired()
    claim = _register(registry, "b", timeout_s=0.2)
    assert claim.state == "expired"
    assert claim.client.markers == {}


def test_expire_forgets_only_clients_away_past_their_timeout(registry: SqlDurableRegistry) -> None:
    for durable_id, timeout in (("gone", 0.2), ("kept", 60.0), ("online", 0.2)):
        registry.register(
            durable_id,
            group_id=f"g-{durable_id}",
            stream="s",
            timeout_s=timeout,
            owner=durable_id,
            lease_ms=10_000,
        )
        registry.mark(durable_id, "s", {0: 1})
    registry.release("gone", "gone")
    registry.release("kept", "kept")
    time.sleep(0.35)
    gone = registry.expire()
    assert [c.durable_id for c in gone] == ["gone"]
    assert registry.get("gone") is None
    assert sorted(c.durable_id for c in registry.list()) == ["kept", "online"]
    assert registry.expire() == []


def test_unregister_needs_the_owner_when_given(registry: SqlDurableRegistry) -> None:
    _register(registry, "a")
    registry.mark("c1", "s", {0: 5})
    assert not registry.unregister("c1", "someone-else")
    assert registry.get("c1") is not None
    assert registry.unregister("c1", "a")
    assert registry.get("c1") is None and registry.list() == []
    assert not registry.unregister("c1")


def test_streams_accumulate(registry: SqlDurableRegistry) -> None:
    _register(registry, "a")
    registry.release("c1", "a")
    registry.register(
        "c1", group_id="bolide-durable-c1", stream="t", timeout_s=60, owner="b", lease_ms=5_000
    )
    client = registry.get("c1")
    assert client is not None and client.streams == ("s", "t")


def test_concurrent_claims_have_one_winner(registry_url: str) -> None:
    registries = [SqlDurableRegistry(registry_url) for _ in range(4)]
    outcomes: list[str] = []
    barrier = threading.Barrier(len(registries))

    def claim(reg: SqlDurableRegistry, owner: str) -> None:
        barrier.wait()
        try:
            _register(reg, owner)
            outcomes.append("won")
        except DurableClientBusyError:
            outcomes.append("busy")

    threads = [
        threading.Thread(target=claim, args=(reg, f"o{i}")) for i, reg in enumerate(registries)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for reg in registries:
        reg.close()
    assert sorted(outcomes) == ["busy", "busy", "busy", "won"]


def test_bad_arguments(sqlite_url: str) -> None:
    with pytest.raises(TypeError, match="store_or_url"):
        SqlDurableRegistry(42)  # type: ignore[arg-type]
    with SqlDurableRegistry(sqlite_url) as reg, pytest.raises(ValueError, match="durable_id"):
        reg.register("", group_id="g", stream="s", timeout_s=1, owner="o", lease_ms=1)


def test_schema_behind_names_the_upgrade_command(tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'old.db'}"
    with SqlStore(url) as store:
        store.upgrade("0001")
        reg = SqlDurableRegistry(store)
        with pytest.raises(StoreError, match="bolide db upgrade"):
            reg.list()


def test_models_match_the_migration(registry_url: str) -> None:
    """``alembic check`` for the registry tables: revision 0003 and the Core tables agree."""
    ours = {DURABLE_CLIENTS.name, DURABLE_MARKERS.name}
    metadata = sa.MetaData()
    for table in (DURABLE_CLIENTS, DURABLE_MARKERS):
        table.to_metadata(metadata)
    engine = sa.create_engine(registry_url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn,
                opts={
                    "compare_type": True,
                    "version_table": VERSION_TABLE,
                    "include_name": lambda name, kind, _parent: kind != "table" or name in ours,
                },
            )
            assert compare_metadata(context, metadata) == []
    finally:
        engine.dispose()
