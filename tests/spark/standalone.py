"""A Spark standalone cluster for the tests: a master and workers from the installed PySpark.

Started with PySpark's own ``bin/spark-class`` (``org.apache.spark.deploy.master.Master`` and
``...worker.Worker``), on loopback ports picked free, so the jobs run with executors in other
JVMs and Python workers than the driver, as on a real cluster. One SparkContext per process:
``Sessions`` switches the tests' process between the local session and the cluster's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyspark

from bolide.facade.broker._process import free_port, log_tail, stop_process

__all__ = ["Sessions", "StandaloneCluster"]

_SPARK_HOME = Path(pyspark.__file__).parent
_MASTER = "org.apache.spark.deploy.master.Master"
_WORKER = "org.apache.spark.deploy.worker.Worker"


@dataclass
class StandaloneCluster:
    """A running master and its workers (``start``), stopped with ``stop``.

    Attributes:
        master_url: ``spark://127.0.0.1:<port>``, for ``spark_session(master=...)``.
        workers: The worker processes, in start order (a test may kill one).
    """

    directory: Path
    master_url: str = ""
    ui_port: int = 0
    master: subprocess.Popen[bytes] | None = None
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

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
            return subprocess.Popen(
                [str(_SPARK_HOME / "bin" / "spark-class"), cls, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # a kill reaches the worker's executors too
            )

    def start(self, workers: int = 2, timeout_s: float = 180.0) -> None:
        """Start the master and ``workers`` workers (1 core, 1 GiB each); wait until every
        worker has registered."""
        port, self.ui_port = free_port(), free_port()
        self.master_url = f"spark://127.0.0.1:{port}"
        ports = ["--port", str(port), "--webui-port", str(self.ui_port)]
        master_args = ["--host", "127.0.0.1", *ports]
        self.master = self._spawn("master", _MASTER, *master_args)
        for n in range(workers):
            work = self.directory / f"work-{n}"
            work.mkdir(exist_ok=True)
            args = ["--host", "127.0.0.1", "--cores", "1", "--memory", "1g"]
            args += ["--webui-port", str(free_port()), "--work-dir", str(work), self.master_url]
            self.workers.append(self._spawn(f"worker-{n}", _WORKER, *args))
        self.wait_workers(workers, timeout_s)

    def alive_workers(self) -> int:
        """How many workers the master counts as alive (0 while its UI does not answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
                state: dict[str, Any] = json.load(r)
        except OSError:
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

    def stop(self) -> None:
        """Stop the workers (their executors with them), then the master."""
        for process in [*self.workers, self.master]:
            if process is not None:
                stop_process(process, 30)


class Sessions:
    """The process's one SparkSession: the local one or the cluster's, created on demand.

    Spark allows one SparkContext per process, so asking for the other kind stops the live one.
    """

    def __init__(self, local_config: dict[str, str]) -> None:
        self.local_config = local_config
        self.live: Any = None
        self.master: str | None = None

    def get(self, master: str, config: dict[str, str] | None = None) -> Any:
        """The live session when it runs on ``master``, else a new one there."""
        from bolide.spark import spark_session

        if self.live is not None and self.master == master:
            return self.live
        self.stop()
        # Executors start their Python workers with the driver's PYSPARK_PYTHON: this one.
        os.environ["PYSPARK_PYTHON"] = sys.executable
        settings = {**self.local_config, **(config or {})}
        self.live = spark_session("bolide-tests", master, config=settings)
        self.master = master
        return self.live

    def stop(self) -> None:
        """Stop the live session, if any."""
        if self.live is not None:
            self.live.stop()
            self.live = None
            self.master = None
