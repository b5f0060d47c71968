"""A Spark standalone cluster on this machine: a master and workers from the installed PySpark.

Started with PySpark's own ``bin/spark-class`` (``org.apache.spark.deploy.master.Master`` and
``...worker.Worker``), on loopback ports picked free, so jobs run with executors in other JVMs
and Python workers than the driver, as on a real cluster. It is how bolide's tests and
benchmarks run the Spark jobs on a cluster, and a way to try a job on one before submitting it
for real (docs/spark.md)::

    from bolide.testing.spark_cluster import StandaloneCluster

    cluster = StandaloneCluster(Path("/tmp/spark-cluster"))
    cluster.start(workers=2)
    try:
        spark = cluster.session("my-job")
        archive(spark, stream, "postgresql+psycopg://...", "/tmp/ckpt", bootstrap=kafka)
    finally:
        spark.stop()
        cluster.stop()

It needs the ``spark`` extra: this module imports PySpark, and nothing in bolide imports it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyspark

from bolide.facade.broker import free_ports, log_tail, stop_process
from bolide.facade.broker.leash import Leash

__all__ = ["DRIVER_SETTINGS", "StandaloneCluster", "session_settings"]

_SPARK_HOME = Path(pyspark.__file__).parent
_MASTER = "org.apache.spark.deploy.master.Master"
_WORKER = "org.apache.spark.deploy.worker.Worker"

#: What a driver on this machine needs to use the cluster: loopback addresses (the workers
#: listen on 127.0.0.1 only) and executors that fit a worker's 1 GiB and 1 core.
DRIVER_SETTINGS: Mapping[str, str] = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.executor.memory": "512m",
    "spark.executor.cores": "1",
}


def session_settings(workers: int) -> dict[str, str]:
    """``DRIVER_SETTINGS`` for a session taking the cores of ``workers`` workers: its creation
    waits (up to 2 minutes) until all its executors have registered, so that a job does not
    start on part of the cluster."""
    return {
        **DRIVER_SETTINGS,
        "spark.cores.max": str(workers),
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
    }


@dataclass
class StandaloneCluster:
    """A running master and its workers (``start``), stopped with ``stop``.

    Attributes:
        directory: Where the daemons write their logs and the workers their work folders.
        master_url: ``spark://127.0.0.1:<port>``, for ``spark_session(master=...)``.
        workers: The worker processes, in start order (a test may kill one).
    """

    directory: Path
    master_url: str = ""
    ui_port: int = 0
    master: subprocess.Popen[bytes] | None = None
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _ports: set[int] = field(default_factory=set, init=False, repr=False)  # the daemons' ports
    # Each daemon's process group dies with this process, however it dies (by pid).
    _leashes: dict[int, Leash] = field(default_factory=dict, init=False, repr=False)

    def _spawn(self, name: str, cls: str, *args: str) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "SPARK_HOME": str(_SPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": "256m",
            "PYSPARK_PYTHON": sys.executable,
        }
        log = (self.directory / f"{name}.log").open("wb")
        with log:
            process = subprocess.Popen(
                [str(_SPARK_HOME / "bin" / "spark-class"), cls, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # a kill reaches the worker's executors too
            )
        self._leashes[process.pid] = Leash(process.pid)
        return process

    def _unleash(self, process: subprocess.Popen[bytes]) -> None:
        leash = self._leashes.pop(process.pid, None)
        if leash is not None:
            leash.release()

    def start(self, workers: int = 2, timeout_s: float = 180.0) -> None:
        """Start the master and ``workers`` workers (1 core, 1 GiB each); wait until every
        worker has registered."""
        self.directory.mkdir(parents=True, exist_ok=True)
        # Picked together: the JVMs bind them seconds later, and a worker's UI on the
        # master's port would answer the master's questions.
        port, self.ui_port, *ui_ports = free_ports(2 + workers)
        self._ports = {port, self.ui_port, *ui_ports}
        self.master_url = f"spark://127.0.0.1:{port}"
        ports = ["--port", str(port), "--webui-port", str(self.ui_port)]
        master_args = ["--host", "127.0.0.1", *ports]
        self.master = self._spawn("master", _MASTER, *master_args)
        self.workers = [self._worker(n, ui) for n, ui in enumerate(ui_ports)]
        self.wait_workers(workers, timeout_s)

    def _worker(self, n: int, ui_port: int | None = None) -> subprocess.Popen[bytes]:
        if ui_port is None:
            ui_port = free_ports(1, taken=self._ports)[0]
            self._ports.add(ui_port)
        work = self.directory / f"work-{n}"
        work.mkdir(exist_ok=True)
        args = ["--host", "127.0.0.1", "--cores", "1", "--memory", "1g"]
        args += ["--webui-port", str(ui_port), "--work-dir", str(work), self.master_url]
        return self._spawn(f"worker-{n}", _WORKER, *args)

    def add_worker(self, timeout_s: float = 180.0) -> None:
        """Start one more worker; wait until the master counts every worker alive. Sessions
        created before it do not count on its core (see ``session``)."""
        self.workers.append(self._worker(len(self.workers)))
        self.wait_workers(len(self.workers), timeout_s)

    def kill_worker(self, n: int) -> None:
        """SIGKILL worker ``n`` with its executors and their Python workers (its process
        group), as when its machine is lost."""
        process = self.workers[n]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)
        self._unleash(process)

    def restart_worker(self, n: int, timeout_s: float = 180.0) -> None:
        """Start worker ``n`` again (after ``kill_worker``); wait until the master counts
        every worker alive."""
        self._unleash(self.workers[n])  # a worker that died by itself kept its watcher
        self.workers[n] = self._worker(n)
        self.wait_workers(len(self.workers), timeout_s)

    def alive_workers(self) -> int:
        """How many workers the master counts as alive (0 while its UI does not answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
                state: dict[str, Any] = json.load(r)
        except (OSError, ValueError):  # not up yet, or not its JSON yet
            return 0
        return int(state.get("aliveworkers", 0))

    def wait_workers(self, count: int, timeout_s: float) -> None:
        """Wait until the master counts ``count`` alive workers; fail with the logs' tails."""
        deadline = time.monotonic() + timeout_s
        while self.alive_workers() < count:
            processes = [self.master, *self.workers]
            dead = [p for p in processes if p is not None and p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(
                    f"--- {p.name}:\n{log_tail(p)}" for p in sorted(self.directory.glob("*.log"))
                )
                raise RuntimeError(f"the standalone cluster did not come up:\n{logs}")
            time.sleep(0.2)

    def session(self, app_name: str = "bolide", config: Mapping[str, str] | None = None) -> Any:
        """A bolide SparkSession on this cluster (``bolide.spark.spark_session``) whose
        executors take every worker's core (``session_settings``; ``config`` overrides them).

        Executors run this process's Python (``PYSPARK_PYTHON``), so they see the same
        packages, as on a cluster whose machines share the driver's environment.

        Raises:
            RuntimeError: A session on another master is active: Spark allows one
                SparkContext per process, and would hand that one back; stop it first.
        """
        from pyspark.sql import SparkSession

        from bolide.spark import spark_session

        active = SparkSession.getActiveSession()
        if active is not None and active.sparkContext.master != self.master_url:
            raise RuntimeError(
                f"a SparkSession on {active.sparkContext.master} is active in this process "
                "(one SparkContext per process): stop it before using the cluster"
            )
        os.environ["PYSPARK_PYTHON"] = sys.executable
        settings = {**session_settings(len(self.workers)), **(config or {})}
        return spark_session(app_name, self.master_url, config=settings)

    def stop(self) -> None:
        """Stop the workers (their executors with them), then the master."""
        for process in [*self.workers, self.master]:
            if process is not None:
                stop_process(process, 30)
                with contextlib.suppress(ProcessLookupError):  # executors left behind
                    os.killpg(process.pid, signal.SIGKILL)
                self._unleash(process)
