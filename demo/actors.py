"""The demo's consumers: a subscriber group of traders and a durable risk client.

Each trader polls in its own thread, hands every record to its ``Resequencer`` (plain orders
pass straight through, block parts wait for their group) and confirms only up to the
resequencer's safe offset, so a failover never skips an unfinished block. What the traders
process goes to one ``Ledger``, which checks each symbol's orders arrive in sequence.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from bolide.demo.orders import is_block_part
from bolide.facade.config import Cluster, SubscriberConfig
from bolide.facade.record import Record
from bolide.facade.resequencer.core import Resequencer
from bolide.facade.subscriber import Subscriber

__all__ = ["DurableWatcher", "Ledger", "Trader"]


@dataclass
class _Block:
    parts: list[int] = field(default_factory=list)  # sequence numbers in release order
    arrival: list[int] = field(default_factory=list)  # sequence numbers in offset order
    size: int = 0


class Ledger:
    """Everything the traders processed, checked as it arrives.

    A symbol's order ``seq`` must be the next one (``last + 1``) or one already seen: an
    at-least-once redelivery after a lease moved. Anything else (a gap, or an unseen order
    older than the last) is an order violation.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.last: dict[str, int] = {}
        self.processed = 0
        self.redelivered = 0
        self.violations: list[str] = []
        self.by_member: dict[str, int] = defaultdict(int)
        self.partitions: dict[str, set[int]] = defaultdict(set)
        self.blocks: dict[str, _Block] = defaultdict(_Block)
        self.first_seen: dict[int, tuple[float, str]] = {}  # partition -> first (time, member)
        self.moved_at: dict[int, tuple[float, str]] = {}

    def order(self, member: str, record: Record) -> None:
        """Book one plain order (``record.value`` decoded)."""
        value: dict[str, Any] = record.value
        symbol, seq = value["symbol"], int(value["seq"])
        with self._lock:
            self._touch(member, record)
            last = self.last.get(symbol, -1)
            if seq == last + 1:
                self.last[symbol] = seq
                self.processed += 1
                self.by_member[member] += 1
            elif seq <= last:
                self.redelivered += 1
            else:
                self.violations.append(f"{symbol}: order {seq} arrived after {last}")

    def block_part(self, member: str, record: Record) -> None:
        """Book a part released by a resequencer (in release order)."""
        value: dict[str, Any] = record.value
        with self._lock:
            self._touch(member, record)
            block = self.blocks[value["block_id"]]
            if int(value["seq"]) in block.parts:
                self.redelivered += 1
                return
            block.parts.append(int(value["seq"]))
            block.size = int(record.header("bolide.seq.size") or b"0")
            self.processed += 1
            self.by_member[member] += 1

    def arrived(self, record: Record) -> None:
        """Note a block part's arrival, before resequencing."""
        value: dict[str, Any] = record.value
        with self._lock:
            self.blocks[value["block_id"]].arrival.append(int(value["seq"]))

    def _touch(self, member: str, record: Record) -> None:
        p = record.partition if record.partition is not None else 0
        self.partitions[member].add(p)
        now = time.monotonic()
        first = self.first_seen.setdefault(p, (now, member))
        if first[1] != member and p not in self.moved_at:
            self.moved_at[p] = (now, member)


class Trader:
    """One member of the traders' subscriber group, polling in its own thread.

    Args:
        name: The member's name in the progress lines.
        cluster: Where the stream lives.
        config: The subscriber's config (the group, the serde, the lease).
        ledger: Where processed orders are booked.
    """

    def __init__(
        self, name: str, cluster: Cluster, config: SubscriberConfig, ledger: Ledger
    ) -> None:
        self.name = name
        self.ledger = ledger
        self.subscriber = Subscriber(cluster, config)
        self.resequencer = Resequencer(mode="batch", timeout_s=20.0, capacity=1_000)
        self.assigned = False
        self.error: BaseException | None = None
        self._leave = threading.Event()
        self._left = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"demo-{name}", daemon=True)

    def start(self) -> Trader:
        """Start polling."""
        self._thread.start()
        return self

    def _run(self) -> None:
        sub = self.subscriber
        try:
            while not self._leave.is_set():
                batch = sub.poll(100)
                touched: set[int] = set()
                for record in batch:
                    if is_block_part(record.value):
                        self.ledger.arrived(record)
                    for released in self.resequencer.offer(record):
                        if is_block_part(released.value):
                            self.ledger.block_part(self.name, released)
                        else:
                            self.ledger.order(self.name, released)
                    touched.add(record.partition if record.partition is not None else 0)
                for p in touched:
                    safe = self.resequencer.safe_offset(p)
                    if safe is not None:
                        sub.confirm(safe, partition=p)
                self.assigned = sub.is_assigned()
            self._confirm_and_wait()
        except BaseException as exc:  # reported by the demo's checks
            self.error = exc
        finally:
            sub.close()
            self._left.set()

    def _confirm_and_wait(self) -> None:
        """Before leaving: wait (briefly) until every confirm reached Kafka."""
        sub = self.subscriber
        wanted = {
            p: self.resequencer.safe_offset(p) for p in self.ledger.partitions.get(self.name, ())
        }
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            committed = sub.committed()
            if all(s is None or (committed.get(p) or 0) > s for p, s in wanted.items()):
                return
            sub.poll(20)

    def leave(self, timeout_s: float = 15.0) -> bool:
        """Confirm, leave the group cleanly and stop; ``False`` if it did not stop in time."""
        self._leave.set()
        return self._left.wait(timeout_s)

    @property
    def running(self) -> bool:
        """True until the member has left."""
        return not self._left.is_set()


class DurableWatcher:
    """The durable risk client: counts live and replayed records across reconnects.

    Args:
        cluster: Where the stream lives.
        config_for: ``fn(on_live) -> SubscriberConfig`` for a connection (``durable_id`` set).
    """

    def __init__(self, cluster: Cluster, config_for: Any) -> None:
        self._cluster = cluster
        self._config_for = config_for
        self.live = 0
        self.replayed = 0
        self.replayed_after_live = 0
        self.went_live = 0
        self.state = ""
        self.marker: dict[int, int] = {}
        self.error: BaseException | None = None
        self._sub: Subscriber | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def seen(self) -> int:
        """Records received, live and replayed."""
        return self.live + self.replayed

    def connect(self) -> None:
        """Connect (claim the id, take the marker) and start polling in a thread."""
        self._stop.clear()
        self._sub = Subscriber(self._cluster, self._config_for(self._on_live))
        session = self._sub.durable
        self.state = session.state if session is not None else "?"
        self.marker = self._sub.marker
        self._thread = threading.Thread(target=self._run, name="demo-durable", daemon=True)
        self._thread.start()

    def _on_live(self) -> None:
        self.went_live += 1

    def _run(self) -> None:
        assert self._sub is not None
        try:
            while not self._stop.is_set():
                for record in self._sub.poll(100):
                    if record.replayed:
                        self.replayed += 1
                        if self.went_live:
                            self.replayed_after_live += 1
                    else:
                        self.live += 1
        except BaseException as exc:  # reported by the demo's checks
            self.error = exc

    def disconnect(self) -> None:
        """Stop polling and close with ``keep_alive=True``: the queue stays for a reconnect."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        if self._sub is not None:
            self._sub.close(keep_alive=True)
        self.went_live = 0

    def close(self) -> None:
        """Stop and unregister the client (``keep_alive=False``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        if self._sub is not None:
            self._sub.close(keep_alive=False)
