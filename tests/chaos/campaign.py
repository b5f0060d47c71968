"""The campaign: a three-node cluster, the workloads' producers and workers, the nemesis for
``minutes``, then healing, a drain, the final reads and the checks.

Whatever happens (the end, an error, Ctrl-C, SIGTERM) every process the run started ends with
it, and what the history holds so far is checked and reported.
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
from tests.chaos.history import History, read_history
from tests.chaos.nemesis import KINDS, Nemesis
from tests.chaos.supervisor import Supervisor
from tests.chaos.worker import stream
from tests.chaos.workloads import WORKLOADS, Producer, Workload, acknowledged, check

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


class _Interrupted(Exception):
    pass


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Interrupted


def _drain(
    folder: Path, workloads: list[Workload], supervisors: list[Supervisor], timeout_s: float
) -> None:
    """Keep the workers going until each acknowledged record is processed, or ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for sup in supervisors:
            sup.check()
        events = read_history(folder.glob("*.jsonl"))
        if all(set(acknowledged(events, w)) <= w.done(events) for w in workloads):
            return
        time.sleep(5.0)


def _run_phase(deadline: float, supervisors: list[Supervisor], nemesis: Nemesis | None) -> None:
    if nemesis is not None:
        nemesis.start()
    while time.monotonic() < deadline:
        for sup in supervisors:
            sup.check()
        time.sleep(0.5)


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
    interrupted = False
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    supervisors: list[Supervisor] = []
    nemesis: Nemesis | None = None
    broker = EmbeddedBroker(
        engine="kafka", brokers=3, broker_settings=REPLICATED, heap="512m",
        log_path=folder / "broker.log", startup_timeout_s=180,
    )  # fmt: skip
    try:
        broker.start()
        cluster = broker.cluster()
        for w in chosen:
            ensure_topic(cluster, stream(w.topic, w.partitions))
            ensure_topic(cluster, stream(w.output, w.partitions))
        producers = [Producer(cluster, w, History(folder / f"producer-{w.name}.jsonl",
                     "producer"), rate) for w in chosen]  # fmt: skip
        for w in chosen:
            for slot in range(1, w.workers + 1):
                args = w.worker_args(broker.bootstrap_servers, slot)
                supervisors.append(Supervisor(folder, w.name, slot, args, runner))
        for sup in supervisors:
            sup.start()
        for producer in producers:
            producer.start()
        nemesis = Nemesis(
            broker, supervisors, [w.topic for w in chosen],
            History(folder / "nemesis.jsonl", "nemesis"), seed, kinds,
        )  # fmt: skip
        try:
            _run_phase(time.monotonic() + minutes * 60, supervisors, nemesis)
        except (KeyboardInterrupt, _Interrupted):
            interrupted = True
        runner.add("heal")
        nemesis.heal()
        for producer in producers:
            producer.halt.set()
        for producer in producers:
            producer.join(180)
        if not interrupted:
            runner.add("drain")
            try:
                _drain(folder, chosen, supervisors, drain_s)
            except (KeyboardInterrupt, _Interrupted):
                interrupted = True
        for sup in supervisors:
            sup.finish(30)
        return _check(folder, broker, chosen, nemesis, seed, minutes, interrupted)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if nemesis is not None:
            nemesis.stop()
        for sup in supervisors:
            sup.finish(5)
        broker.stop()
        runner.close()


def _check(
    folder: Path,
    broker: EmbeddedBroker,
    workloads: list[Workload],
    nemesis: Nemesis,
    seed: int,
    minutes: float,
    interrupted: bool,
) -> Outcome:
    events = read_history(folder.glob("*.jsonl"))
    cluster = broker.cluster()
    results = {w.name: check(cluster, w, events) for w in workloads}
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
        faults=dict(nemesis.counts),
        operations=len(events),
        interrupted=interrupted,
        results=results,
        failures=failures,
    )
    (folder / "outcome.json").write_text(json.dumps(outcome.as_json(), indent=2) + "\n")
    return outcome
