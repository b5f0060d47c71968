"""The campaign: a three-node cluster, the workloads' producers and workers, the nemesis for
``minutes``, then healing, a drain, the final reads and the checks.

Whatever happens (the end, an error, Ctrl-C, SIGTERM) every process the run started ends with
it, and what the history holds so far is checked and reported. Ctrl-C (SIGINT) interrupts a
run even when it was started with SIGINT ignored, as a shell starts a background command.
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from bolide.facade import EmbeddedBroker
from bolide.facade.kafka import ensure_topic
from bolide.stores import SqlStore
from tests.chaos.history import History, read_history
from tests.chaos.nemesis import KINDS, Nemesis
from tests.chaos.postgres import PrivatePostgres
from tests.chaos.supervisor import Supervisor
from tests.chaos.worker import ledger, stream
from tests.chaos.workloads import (
    WORKLOADS,
    OutboxWriter,
    Producer,
    Workload,
    acknowledged,
    check,
)

__all__ = ["REPLICATED", "Outcome", "run"]

#: The cluster's replication: every write on two of three replicas before it is acknowledged.
REPLICATED = {"default.replication.factor": "3", "min.insync.replicas": "2"}


@dataclass
class Outcome:
    """A run's figures: what was injected, what happened, and each workload's anomalies."""

    seed: int
    minutes: float
    faults: dict[str, int]
    operations: int
    interrupted: bool
    results: dict[str, dict[str, int]]
    failures: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


#: What a workload's results count that is not an anomaly.
_COUNTS = ("acknowledged", "worker-exits")


class _Interrupted(BaseException):
    """SIGTERM, raised as KeyboardInterrupt is: past the ``except Exception`` of a wait."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Interrupted


#: The longest drain, in drain windows (each ``drain_s``).
_DRAIN_CAP = 3


def _drain(
    folder: Path, workloads: list[Workload], supervisors: list[Supervisor], timeout_s: float
) -> None:
    """Keep the workers going until each acknowledged record is processed, or nothing more
    was processed for ``timeout_s`` (stuck), or ``_DRAIN_CAP`` times that passed: a backlog
    still going down at the end of the window (keys that run one record at a time through
    retry tiers, on a busy machine) is given time, a stall is not."""
    start = time.monotonic()
    deadline, finished = start + timeout_s, -1
    while time.monotonic() < deadline:
        for sup in supervisors:
            sup.check()
        events = read_history(folder.glob("*.jsonl"))
        done = [(set(acknowledged(events, w)), w.done(events)) for w in workloads]
        if all(acked <= got for acked, got in done):
            return
        now_finished = sum(len(acked & got) for acked, got in done)
        if now_finished > finished:
            finished = now_finished
            deadline = min(time.monotonic() + timeout_s, start + _DRAIN_CAP * timeout_s)
        time.sleep(5.0)


def _run_phase(deadline: float, supervisors: list[Supervisor], nemesis: Nemesis | None) -> None:
    if nemesis is not None:
        nemesis.start()
    while time.monotonic() < deadline:
        for sup in supervisors:
            sup.check()
        time.sleep(0.5)


@dataclass
class _Parts:
    """What a run started, so that all of it ends with the run."""

    broker: EmbeddedBroker
    postgres: PrivatePostgres | None = None
    supervisors: list[Supervisor] = field(default_factory=list)
    producers: list[Producer | OutboxWriter] = field(default_factory=list)
    nemesis: Nemesis | None = None

    def end(self) -> None:
        if self.nemesis is not None:
            self.nemesis.stop()
        for producer in self.producers:
            producer.halt.set()
        for sup in self.supervisors:
            sup.finish(5)
        self.broker.stop()
        if self.postgres is not None:
            self.postgres.stop()


def _database(parts: _Parts, folder: Path, workloads: list[Workload]) -> str:
    """The URL of the campaign's own PostgreSQL, its tables made; ``-`` when none is needed."""
    if not any(w.database for w in workloads):
        return "-"
    parts.postgres = PrivatePostgres(folder / "postgres.log")
    parts.postgres.start()
    with SqlStore(parts.postgres.url) as store:
        store.upgrade()
        for w in workloads:
            if w.name == "sql":
                ledger(w.output).create(store.engine)
    return parts.postgres.url


def _start(parts: _Parts, folder: Path, workloads: list[Workload], rate: float) -> str:
    parts.broker.start()
    db = _database(parts, folder, workloads)
    cluster = parts.broker.cluster()
    for w in workloads:
        ensure_topic(cluster, stream(w.topic, w.partitions))
        if w.name in ("eos", "outbox"):
            ensure_topic(cluster, stream(w.output, w.partitions))
    runner = History(folder / "supervisors.jsonl", "runner")
    for w in workloads:
        history = History(folder / f"producer-{w.name}.jsonl", "producer")
        if w.name == "outbox":
            parts.producers.append(OutboxWriter(db, w, history, rate))
        else:
            parts.producers.append(Producer(cluster, w, history, rate))
        for slot in range(1, w.workers + 1):
            args = w.worker_args(parts.broker.bootstrap_servers, slot, db)
            parts.supervisors.append(Supervisor(folder, w.name, slot, args, runner))
    for sup in parts.supervisors:
        sup.start()
    for producer in parts.producers:
        producer.start()
    return db


def run(
    folder: Path,
    *,
    minutes: float,
    workloads: list[str],
    seed: int,
    kinds: tuple[str, ...] = KINDS,
    rate: float = 40.0,
    drain_s: float = 240.0,
) -> Outcome:
    """Run a campaign in ``folder`` (its histories, logs and ``outcome.json``)."""
    folder.mkdir(parents=True, exist_ok=True)
    chosen = [WORKLOADS[name] for name in workloads]
    runner = History(folder / "runner.jsonl", "runner")
    runner.add("campaign", seed=seed, minutes=minutes, workloads=workloads, kinds=list(kinds))
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    # Started with SIGINT ignored (a shell's background command, ``nohup ./dev test &``),
    # Python raises no KeyboardInterrupt: Ctrl-C would not end the faults. The run takes it.
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    parts = _Parts(EmbeddedBroker(
        engine="kafka", brokers=3, broker_settings=REPLICATED, heap="512m",
        log_path=folder / "broker.log", startup_timeout_s=180,
    ))  # fmt: skip
    try:
        db = _start(parts, folder, chosen, rate)
        if parts.postgres is None:
            kinds = tuple(kind for kind in kinds if kind != "pg-restart")
        parts.nemesis = Nemesis(
            parts.broker, parts.supervisors, [w.watched for w in chosen],
            History(folder / "nemesis.jsonl", "nemesis"), seed, kinds, parts.postgres,
        )  # fmt: skip
        interrupted = _faults_then_drain(parts, folder, chosen, minutes, drain_s, runner)
        for sup in parts.supervisors:
            sup.finish(30)
        return _check(folder, parts, chosen, seed, minutes, interrupted, db)
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
        parts.end()
        runner.close()


def _faults_then_drain(
    parts: _Parts,
    folder: Path,
    workloads: list[Workload],
    minutes: float,
    drain_s: float,
    runner: History,
) -> bool:
    """The nemesis for ``minutes``, healing, then the drain; True when interrupted."""
    assert parts.nemesis is not None
    try:
        _run_phase(time.monotonic() + minutes * 60, parts.supervisors, parts.nemesis)
    except (KeyboardInterrupt, _Interrupted):
        return _heal(parts, runner, interrupted=True)
    _heal(parts, runner, interrupted=False)
    runner.add("drain")
    try:
        _drain(folder, workloads, parts.supervisors, drain_s)
    except (KeyboardInterrupt, _Interrupted):
        return True
    return False


def _heal(parts: _Parts, runner: History, *, interrupted: bool) -> bool:
    runner.add("heal")
    assert parts.nemesis is not None
    parts.nemesis.heal()
    for producer in parts.producers:
        producer.halt.set()
    for producer in parts.producers:
        producer.join(180)
    return interrupted


def _check(
    folder: Path,
    parts: _Parts,
    workloads: list[Workload],
    seed: int,
    minutes: float,
    interrupted: bool,
    db: str,
) -> Outcome:
    events = read_history(folder.glob("*.jsonl"))
    cluster = parts.broker.cluster()
    url = None if db == "-" else db
    evidence: dict[str, Any] = {}
    results = {w.name: check(cluster, w, events, url, evidence) for w in workloads}
    if evidence:
        (folder / "evidence.json").write_text(json.dumps(evidence, indent=2, default=str) + "\n")
    for w in workloads:
        exits = [e for e in events if e["type"] == "worker-exit" and e["target"].startswith(w.name)]
        results[w.name]["worker-exits"] = len(exits)
    failures = [
        f"{name}: {anomaly} {count}"
        for name, counts in results.items()
        for anomaly, count in counts.items()
        if count
        and anomaly not in (*_COUNTS, *WORKLOADS[name].allowed)
        # Unfinished work is stuck only when a drain after healing did not finish it.
        and not (interrupted and anomaly == "stuck")
    ]
    outcome = Outcome(
        seed=seed,
        minutes=minutes,
        faults=dict(parts.nemesis.counts) if parts.nemesis is not None else {},
        operations=len(events),
        interrupted=interrupted,
        results=results,
        failures=failures,
    )
    (folder / "outcome.json").write_text(json.dumps(outcome.as_json(), indent=2) + "\n")
    return outcome
