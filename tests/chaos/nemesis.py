"""The nemesis: from a seed, faults at random moments, overlapping.

Kinds:

``broker-kill``
    SIGKILL a broker (a partition leader two times in three), restart it 1-10 s later;
``broker-pause``
    SIGSTOP a broker for 1-20 s (a long GC pause), then SIGCONT;
``worker-kill``
    SIGKILL a worker process (its supervisor starts a new one);
``worker-pause``
    SIGSTOP a worker for 1-20 s, often past its lease: it wakes a zombie, and fencing must hold;
``pg-restart``
    crash the campaign's own PostgreSQL (``pg_ctl restart -m immediate``) and start it again
    (only with a workload that uses it).

At most one broker is impaired at a time (two of three down stops every write at
``min.insync.replicas=2``: that tests nothing but patience). Every fault is recorded in the
history (``fault`` with ``phase`` ``start`` and ``end``).
"""

from __future__ import annotations

import random
import signal
import threading
from collections.abc import Callable, Sequence

from bolide.facade import EmbeddedBroker
from bolide.facade.kafka import admin_client
from tests.chaos.history import History
from tests.chaos.postgres import PrivatePostgres
from tests.chaos.supervisor import Supervisor

__all__ = ["KINDS", "Nemesis"]

KINDS = ("broker-kill", "broker-pause", "worker-kill", "worker-pause", "pg-restart")


class Nemesis(threading.Thread):
    """Injects faults until ``stop``; ``heal`` then undoes every fault still in effect."""

    def __init__(
        self,
        broker: EmbeddedBroker,
        workers: Sequence[Supervisor],
        topics: Sequence[str],
        history: History,
        seed: int,
        kinds: Sequence[str] = KINDS,
        postgres: PrivatePostgres | None = None,
    ) -> None:
        super().__init__(name="nemesis", daemon=True)
        self.broker = broker
        self.workers = list(workers)
        self.topics = list(topics)
        self.history = history
        self.rng = random.Random(seed)
        self.kinds = list(kinds)
        self.postgres = postgres
        self.counts: dict[str, int] = dict.fromkeys(KINDS, 0)
        self._halt = threading.Event()
        self._broker_busy = threading.Lock()
        self._pending: list[threading.Thread] = []
        self._deck: list[str] = []

    def run(self) -> None:
        while not self._halt.wait(self.rng.uniform(1.0, 6.0)):
            kind = self._draw()
            if kind is None:
                continue
            if kind.startswith("broker") and not self._broker_busy.acquire(blocking=False):
                continue
            try:
                self._inject(kind)
            except Exception as exc:  # a fault that could not be injected is recorded, not fatal
                self.history.add("fault-error", kind=kind, error=f"{type(exc).__name__}: {exc}")
                if kind.startswith("broker"):
                    self._broker_busy.release()

    def _draw(self) -> str | None:
        """The next kind from a shuffled deck of every kind, so that even a short run injects
        each; a broker fault waits in the deck while another broker fault lasts."""
        if not self._deck:
            self._deck = self.rng.sample(self.kinds, len(self.kinds))
        for i, kind in enumerate(self._deck):
            if not (kind.startswith("broker") and self._broker_busy.locked()):
                return self._deck.pop(i)
        # Only broker faults left while one lasts (a restart can take a minute): faults of
        # other kinds go on meanwhile, outside the deck.
        others = [kind for kind in self.kinds if not kind.startswith("broker")]
        return self.rng.choice(others) if others else None

    def stop(self) -> None:
        self._halt.set()

    def heal(self) -> None:
        """Wait for the end of every fault in effect (each ends within 20 s)."""
        self.stop()
        if self.ident is not None:
            self.join()
        for thread in self._pending:
            thread.join()

    def _later(self, delay_s: float, action: Callable[[], None]) -> None:
        def run() -> None:
            self._halt.wait(delay_s)  # cut short by stop: healing does not wait out a pause
            action()

        thread = threading.Thread(target=run, name="nemesis-end", daemon=True)
        self._pending.append(thread)
        thread.start()

    def _inject(self, kind: str) -> None:
        self.counts[kind] += 1
        if kind == "pg-restart" and self.postgres is not None:
            self.history.add("fault", kind=kind, target="postgres", phase="start")
            self.postgres.restart()
            self.history.add("fault", kind=kind, target="postgres", phase="end")
            return
        if kind == "worker-kill" or kind == "worker-pause":
            worker = self.rng.choice(self.workers)
            if kind == "worker-kill":
                self.history.add("fault", kind=kind, target=worker.proc, phase="start")
                worker.signal(signal.SIGKILL)
                return
            duration = self.rng.uniform(1.0, 20.0)
            proc = worker.proc
            self.history.add("fault", kind=kind, target=proc, phase="start", seconds=duration)
            worker.signal(signal.SIGSTOP)
            self._later(duration, lambda: self._resume_worker(worker, kind, proc))
            return
        node = self._target_node()
        if kind == "broker-kill":
            self.history.add("fault", kind=kind, target=node, phase="start")
            self.broker.kill_node(node)
            delay = self.rng.uniform(1.0, 10.0)
            self._later(delay, lambda: self._end_broker_fault(self.broker.start_node, node, kind))
            return
        duration = self.rng.uniform(1.0, 20.0)
        self.history.add("fault", kind=kind, target=node, phase="start", seconds=duration)
        self.broker.pause_node(node)
        self._later(duration, lambda: self._end_broker_fault(self.broker.resume_node, node, kind))

    def _resume_worker(self, worker: Supervisor, kind: str, proc: str) -> None:
        worker.signal(signal.SIGCONT)
        self.history.add("fault", kind=kind, target=proc, phase="end")

    def _end_broker_fault(self, action: Callable[[int], None], node: int, kind: str) -> None:
        """``start_node`` or ``resume_node``, then the next broker fault may come."""
        try:
            action(node)
            self.history.add("fault", kind=kind, target=node, phase="end")
        finally:
            self._broker_busy.release()

    def _target_node(self) -> int:
        """A partition leader two times in three, else any node."""
        if self.rng.random() < 2 / 3:
            topic = self.rng.choice(self.topics)
            try:
                meta = admin_client(self.broker.cluster()).list_topics(topic, timeout=5)
                leaders = sorted(
                    {p.leader for p in meta.topics[topic].partitions.values() if p.leader > 0}
                )
            except Exception:
                leaders = []
            if leaders:
                return self.rng.choice(leaders)
        return self.rng.choice(self.broker.node_ids)
