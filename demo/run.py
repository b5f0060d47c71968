"""``bolide demo``: the stock-order scenario, end to end, checking its own claims.

Three venues publish Avro orders for a dozen symbols (message group = symbol) to a
four-partition stream. A subscriber group of three traders processes them, each symbol's orders
in sequence, while one trader leaves mid-way and the others take its partitions over. The
archiver copies everything into SQL; a durable risk client disconnects, misses a burst,
reconnects, replays what it missed up to its marker and goes live; multi-part orders are
resequenced; Spark archives and queries the same stream. It ends with SQL over the archive and
a summary whose every figure is checked.

It runs on an embedded broker and a SQLite file in a temporary directory unless told to use a
real cluster (``bootstrap``) or database (``db``).
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from confluent_kafka import ConsumerGroupState

from bolide.demo.actors import DurableWatcher, Ledger, Trader
from bolide.demo.orders import ORDER_SCHEMA, SYMBOLS, Market, wait_for
from bolide.demo.report import DemoSummary, archive_queries
from bolide.facade.broker import EmbeddedBroker
from bolide.facade.config import (
    Cluster,
    InitialOffsetScheme,
    StreamConfig,
    SubscriberConfig,
)
from bolide.facade.errors import BolideError
from bolide.facade.kafka import admin_client
from bolide.facade.schemas.avro import AvroSerde
from bolide.stores.typed_archive import typed_table_name

if TYPE_CHECKING:
    from bolide.stores import Archiver, SqlStore

__all__ = ["DemoOptions", "DemoSummary", "Progress", "run_demo"]

#: Lease of every demo subscriber: short enough for a quick failover, long enough that group
#: joins on the embedded Tansu engine (about half the session timeout) settle.
LEASE_MS = 4_000
PARTITIONS = 4
MEMBERS = 3


@dataclass(frozen=True, kw_only=True)
class DemoOptions:
    """How to run the demo.

    Args:
        quick: Skip the Spark step.
        bootstrap: A Kafka cluster to use instead of an embedded broker.
        db: A database URL to use instead of a SQLite file in ``workdir``.
        workdir: Where files go (kept); a temporary directory (removed) when ``None``.
        orders: Plain orders to publish, in three bursts.
        blocks: Multi-part orders to publish.
        seed: Seed of the generated orders.
        timeout_s: Longest wait for any one step.
    """

    quick: bool = False
    bootstrap: str | None = None
    db: str | None = None
    workdir: str | None = None
    orders: int = 3_000
    blocks: int = 8
    seed: int = 7
    timeout_s: float = 30.0


class Progress:
    """Prints one line per step, with the seconds since the start."""

    def __init__(self, out: TextIO | None = None) -> None:
        self._out = out
        self._began = time.monotonic()

    def __call__(self, text: str) -> None:
        out = self._out if self._out is not None else sys.stdout
        print(f"[{time.monotonic() - self._began:5.1f}s] {text}", file=out, flush=True)


class _Failed(BolideError):
    """A step did not finish in time; the demo reports it and stops."""


def run_demo(options: DemoOptions, say: Callable[[str], None] | None = None) -> DemoSummary:
    """Run the scenario and return its checked summary.

    Args:
        options: Where and how much to run.
        say: Receives one progress line per step (default: print to stdout).

    Returns:
        The summary; ``summary.ok`` tells whether every check passed.

    Raises:
        BolideError: The broker or the database cannot be reached, or a step stalled.
    """
    progress = say if say is not None else Progress()
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        if options.workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bolide-demo-")))
        else:
            workdir = Path(options.workdir)
            workdir.mkdir(parents=True, exist_ok=True)
        summary = _Scenario(options, progress, workdir, stack).run()
        summary.workdir = options.workdir
    summary.elapsed_s = time.monotonic() - began
    return summary.finish()


class _Scenario:
    """The steps of one run, sharing what they set up."""

    def __init__(
        self,
        options: DemoOptions,
        say: Callable[[str], None],
        workdir: Path,
        stack: contextlib.ExitStack,
    ) -> None:
        self.options = options
        self.say = say
        self.workdir = workdir
        self.stack = stack
        self.run_id = uuid.uuid4().hex[:6]  # fresh names: a rerun on a real cluster starts clean
        self.summary = DemoSummary(symbols=len(SYMBOLS), partitions=PARTITIONS, members=MEMBERS)
        self.ledger = Ledger()
        self._flat_out = [0, 0.0]  # orders published flat out, and the seconds it took

    def wait(self, what: str, check: Callable[[], bool]) -> None:
        if not wait_for(check, self.options.timeout_s):
            raise _Failed(f"demo step stalled: {what} (waited {self.options.timeout_s:.0f}s)")

    # -- set-up ----------------------------------------------------------------------------

    def _cluster(self) -> Cluster:
        if self.options.bootstrap:
            self.say(f"kafka: using the cluster at {self.options.bootstrap}")
            return Cluster(self.options.bootstrap)
        broker = self.stack.enter_context(EmbeddedBroker())
        self.summary.embedded = True
        engine = "Apache Kafka" if broker.engine == "kafka" else "Tansu"
        self.say(f"kafka: embedded broker ({engine}) started at {broker.bootstrap_servers}")
        return broker.cluster()

    def _store(self) -> SqlStore:
        from bolide.stores import SqlStore

        url = self.options.db or f"sqlite:///{self.workdir / 'bolide-demo.db'}"
        store = SqlStore(url, check_schema=False)
        self.stack.callback(store.close)
        store.upgrade()
        self.summary.db = store.url
        self.say(f"history store: {store.url} (schema at revision {store.current()})")
        return store

    def run(self) -> DemoSummary:
        s = self.summary
        cluster = self._cluster()
        s.bootstrap = cluster.bootstrap_servers
        store = self._store()
        stream = StreamConfig(
            name=f"demo_orders_{self.run_id}",  # its typed table: bolide_avro_demo_orders_...
            partitions=PARTITIONS,
            global_order=False,
            store=store,
        )
        s.stream = stream.name
        serde = AvroSerde(ORDER_SCHEMA, registry=store)
        market = Market(cluster, stream, serde, self.options.seed)
        self.stack.callback(market.close)
        s.publishers = len(market.publishers)
        self.say(
            f"stream {stream.name}: {PARTITIONS} partitions, message group = symbol, Avro "
            f"schema id {serde.schema_id(stream.name)} in the SQL schema registry"
        )
        traders = self._traders(cluster, stream, serde)
        archiver = self._archiver(cluster, store, stream, serde)
        durable = self._durable(cluster, stream, serde)

        per_burst = self.options.orders // 3
        first_blocks = self.options.blocks // 2
        self._burst(1, market, per_burst, first_blocks, durable)
        durable.disconnect()
        away_from = market.published
        self.say(f"durable client: disconnected (keep-alive) after {durable.seen} records")

        self._failover(cluster, market, traders, per_burst)
        s.missed = market.published - away_from
        self._reconnect(durable)

        live_before, published_before = durable.live, market.published
        self._burst(3, market, self.options.orders - 2 * per_burst,
                    self.options.blocks - first_blocks, durable)  # fmt: skip
        s.live_after_reconnect = durable.live - live_before
        s.check(
            "durable client read the last burst live",
            s.live_after_reconnect == market.published - published_before,
        )
        self._finish_archive(archiver, store, stream, market.published)
        self._blocks(market)
        if not self.options.quick:
            self._spark(cluster, stream, market)
        self._wrap_up(market, traders, durable, store, stream)
        return s

    def _traders(self, cluster: Cluster, stream: StreamConfig, serde: AvroSerde) -> list[Trader]:
        group = f"demo-traders-{self.run_id}"

        def member(i: int) -> Trader:
            config = SubscriberConfig(
                stream=stream,
                group=group,
                initial_offset_scheme=InitialOffsetScheme.EARLIEST,
                lease_timeout_ms=LEASE_MS,
                serde=serde,
                consumer_config={"client.id": f"trader-{i}"},
            )
            trader = Trader(f"trader-{i}", cluster, config, self.ledger).start()
            self.stack.callback(trader.leave)
            return trader

        first = member(1)
        self.wait("trader-1 joins", lambda: first.assigned)
        traders = [first, member(2), member(3)]
        admin = admin_client(cluster)

        def settled() -> bool:
            # Tansu describes no group members: each trader says what it holds.
            described = admin.describe_consumer_groups([group])[group].result()
            stable = described.state == ConsumerGroupState.STABLE
            return bool(stable and all(t.assigned for t in traders))

        # Let every join finish before anyone leaves: Tansu wedges a group
        # whose leader leaves in the middle of a rebalance (docs/compatibility.md).
        self.wait("the traders' group settles", settled)
        self.say(f"subscriber group {group}: {MEMBERS} members joined and hold partitions")
        return traders

    def _archiver(
        self, cluster: Cluster, store: SqlStore, stream: StreamConfig, serde: AvroSerde
    ) -> Archiver:
        from bolide.stores import Archiver

        # With the serde, the archiver also writes the decoded fields into a typed table.
        archiver = Archiver(
            cluster,
            store,
            [stream],
            group=f"demo-archiver-{self.run_id}",
            serdes={stream.name: serde},
        )
        archiver.start()
        self.stack.callback(archiver.stop)
        self.say(
            f"archiver: following {stream.name} into the history store (raw records, and "
            f"the decoded Avro fields as columns of {typed_table_name(stream.name)})"
        )
        return archiver

    def _durable(self, cluster: Cluster, stream: StreamConfig, serde: AvroSerde) -> DurableWatcher:
        durable_id = f"risk-desk-{self.run_id}"

        def config_for(on_live: Callable[[], None]) -> SubscriberConfig:
            return SubscriberConfig(
                stream=stream,
                durable_id=durable_id,
                durable_timeout_s=300,
                lease_timeout_ms=LEASE_MS,
                serde=serde,
                on_live=on_live,
            )

        durable = DurableWatcher(cluster, config_for)
        durable.connect()
        self.stack.callback(durable.close)
        self.wait("the durable client goes live", lambda: durable.went_live == 1)
        self.say(f"durable client {durable_id}: connected ({durable.state}), live")
        return durable

    # -- the bursts ------------------------------------------------------------------------

    def _burst(
        self, n: int, market: Market, orders: int, blocks: int, durable: DurableWatcher
    ) -> None:
        before = market.published
        began = time.monotonic()
        market.publish_orders(orders)
        self._flat_out[0] += orders
        self._flat_out[1] += time.monotonic() - began
        made = market.publish_blocks(blocks)
        seconds = time.monotonic() - began
        parts = sum(b.parts for b in made)
        self.say(
            f"burst {n}: {len(market.venues)} venues published {orders} orders and {blocks} "
            f"multi-part orders ({parts} parts) in {seconds:.2f}s"
        )
        total = market.published
        self.wait(f"the traders process burst {n}", lambda: self.ledger.processed >= total)
        self.wait(f"the durable client reads burst {n}", lambda: durable.seen >= total)
        by_member = ", ".join(
            f"{k} {v} from partitions {sorted(self.ledger.partitions[k])}"
            for k, v in sorted(self.ledger.by_member.items())
        )
        self.say(f"burst {n}: traders processed {total - before} records; so far {by_member}")
        self.say(f"burst {n}: the durable client read every record live")

    def _failover(
        self, cluster: Cluster, market: Market, traders: list[Trader], orders: int
    ) -> None:
        s = self.summary
        before = self.ledger.processed
        stop = threading.Event()
        self.stack.callback(stop.set)  # a failed step stops the flow too
        # A steady flow of about two seconds: it goes on while the lease moves.
        flow = threading.Thread(
            target=market.publish_orders,
            args=(orders,),
            kwargs={"chunk": max(1, orders // 25), "pause_s": 0.08, "stop": stop},
            name="demo-burst-2",
            daemon=True,
        )
        flow.start()
        self.say(f"burst 2: {orders} orders flowing while the durable client is away")
        self.wait(
            "burst 2 reaches the traders", lambda: self.ledger.processed >= before + orders // 3
        )
        # Not the first to join (the group's leader stays), and one that holds work.
        holding = [t for t in traders[1:] if self.ledger.partitions.get(t.name)]
        if not holding:
            raise _Failed("no trader but the first processed anything: nothing to fail over")
        leaver = holding[-1]
        moved = sorted(self.ledger.partitions[leaver.name])
        left_at = time.monotonic()
        if not leaver.leave():
            raise _Failed(f"{leaver.name} did not leave the group in time")
        s.left_member, s.moved_partitions = leaver.name, moved
        self.say(
            f"{leaver.name} left the group after confirming its work (partitions {moved}); "
            "the other traders keep polling"
        )
        flow.join(self.options.timeout_s)
        if flow.is_alive():
            raise _Failed("burst 2 did not finish publishing in time")
        total = market.published
        self.wait("the traders finish burst 2", lambda: self.ledger.processed >= total)

        def taken_over() -> bool:
            return all(p in self.ledger.moved_at for p in moved)

        self.wait("the leaver's partitions move", taken_over)
        s.failover_s = min(self.ledger.moved_at[p][0] for p in moved) - left_at
        takers = sorted({self.ledger.moved_at[p][1] for p in moved})
        self.say(
            f"failover: partitions {moved} taken over by {', '.join(takers)} in "
            f"{s.failover_s:.2f}s; burst 2 done ({total - before} records processed)"
        )

    def _reconnect(self, durable: DurableWatcher) -> None:
        s = self.summary
        replayed_before = durable.replayed
        durable.connect()
        s.durable_state = durable.state
        s.marker = {str(p): o for p, o in sorted(durable.marker.items())}
        self.say(
            f"durable client: reconnected ({durable.state}), marker {s.marker}; "
            f"{s.missed} records were published while it was away"
        )
        self.wait("the durable client replays and goes live", lambda: durable.went_live == 1)
        s.replayed = durable.replayed - replayed_before
        self.say(f"durable client: replayed {s.replayed} records up to its marker, then went live")

    # -- the ending ------------------------------------------------------------------------

    def _finish_archive(
        self, archiver: Archiver, store: SqlStore, stream: StreamConfig, total: int
    ) -> None:
        import sqlalchemy as sa

        engine = store.engine
        count_sql = sa.text("SELECT COUNT(*) FROM bolide_records WHERE stream = :s")

        def archived() -> int:
            with engine.connect() as conn:
                return int(conn.execute(count_sql, {"s": stream.name}).scalar_one())

        self.summary.records = total
        self.wait("the archiver catches up", lambda: archived() >= total)
        stats = archiver.stop()
        self.summary.archived = archived()
        table = typed_table_name(stream.name)
        with engine.connect() as conn:
            count = sa.select(sa.func.count()).select_from(sa.table(table))
            typed = int(conn.execute(count).scalar_one())
        self.summary.typed_rows = typed
        self.summary.check("every record in the typed Avro table", typed == total)
        self.say(
            f"archiver: {self.summary.archived} records in the history store, {typed} rows in "
            f"{table} ({stats.batches} transactions, Kafka offsets committed after each)"
        )

    def _blocks(self, market: Market) -> None:
        s = self.summary
        s.blocks = len(market.blocks)
        s.block_parts = sum(b.parts for b in market.blocks)
        whole = 0
        for block in market.blocks:
            booked = self.ledger.blocks.get(block.block_id)
            if booked is not None and booked.parts == list(range(block.parts)):
                whole += 1
            arrival = list(dict.fromkeys(booked.arrival)) if booked is not None else []
            if arrival != sorted(arrival):
                s.blocks_out_of_order += 1
        self.summary.check("every multi-part order released whole, in sequence", whole == s.blocks)
        self.summary.check("some multi-part orders arrived out of order", s.blocks_out_of_order > 0)
        self.say(
            f"resequencer: {whole}/{s.blocks} multi-part orders released whole and in sequence "
            f"({s.blocks_out_of_order} arrived out of order)"
        )

    def _spark(self, cluster: Cluster, stream: StreamConfig, market: Market) -> None:
        from bolide.demo.spark import run_spark

        written, rows = run_spark(cluster, stream.name, self.workdir, self.say)
        self.summary.spark_archived = written
        self.summary.spark_rows = rows
        self.summary.check("Spark archived every record", written == market.published)
        self.summary.check(
            "Spark SQL counts every record", sum(int(r[1]) for r in rows) == market.published
        )
        for row in rows:
            self.say(f"spark sql: partition {row[0]}: {row[1]} records, {row[2]} groups")

    def _wrap_up(
        self,
        market: Market,
        traders: list[Trader],
        durable: DurableWatcher,
        store: SqlStore,
        stream: StreamConfig,
    ) -> None:
        s = self.summary
        ledger = self.ledger
        s.orders = sum(market.orders_per_symbol().values())
        s.processed, s.redelivered = ledger.processed, ledger.redelivered
        s.processed_by_member = dict(sorted(ledger.by_member.items()))
        s.order_violations = list(ledger.violations)
        s.publish_rate_per_s = self._flat_out[0] / max(self._flat_out[1], 1e-9)
        complete = all(
            ledger.last.get(sym, -1) == n - 1 for sym, n in market.orders_per_symbol().items()
        )
        errors = [t.error for t in traders if t.error is not None] + (
            [durable.error] if durable.error is not None else []
        )
        s.check("every record processed by the group", s.processed == market.published)
        s.check("every symbol's orders processed in order", not s.order_violations and complete)
        s.check("every record archived", s.archived == market.published)
        s.check("replayed count equals records missed", s.replayed == s.missed > 0)
        s.check("durable client went live once, after its replay", durable.replayed_after_live == 0)
        s.check("a trader left and its partitions failed over", s.failover_s is not None)
        s.check("no consumer failed", not errors)
        s.queries = archive_queries(store.engine, stream.name, typed_table_name(stream.name))
        self.say(f"queried the archive with {len(s.queries)} SQL statements")
