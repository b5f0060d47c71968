"""A real schema registry for the tests: Apicurio Registry, whose Confluent-compatible API
(``/apis/ccompat/v7``) confluent-kafka's client speaks, from Maven Central and on Java 17.

Apicurio 3.0.9's ``all`` distribution (the runner jar and its ``lib/``) is fetched with Maven
into bolide's cache once, then started with in-memory storage on a free loopback port.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

from bolide.facade.broker._process import free_port
from bolide.facade.broker.jars import cache_dir, find_java

__all__ = ["APICURIO_VERSION", "Apicurio", "fetch_apicurio"]

#: The newest Apicurio Registry that runs on Java 17 (3.1 and later need Java 21).
APICURIO_VERSION = "3.0.9"
_ARTIFACT = f"io.apicurio:apicurio-registry-app:{APICURIO_VERSION}:zip:all"


def fetch_apicurio() -> Path:
    """The runner jar, fetched with Maven and unpacked into the cache on first use.

    Raises:
        RuntimeError: Maven is missing or could not fetch the distribution.
    """
    home = cache_dir() / f"apicurio-{APICURIO_VERSION}"
    runner = home / f"apicurio-registry-app-{APICURIO_VERSION}-runner.jar"
    if runner.exists():
        return runner
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError("fetching Apicurio Registry needs Maven (mvn) on PATH")
    home.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=home.parent) as staging:
        done = subprocess.run(
            [
                mvn,
                "-q",
                "-B",
                "dependency:copy",
                f"-Dartifact={_ARTIFACT}",
                f"-DoutputDirectory={staging}",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"Maven could not fetch {_ARTIFACT}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
            )
        archive = next(Path(staging).glob("*.zip"))
        unpacked = Path(staging) / "unpacked"
        with zipfile.ZipFile(archive) as zipped:
            zipped.extractall(unpacked)
        found = next(unpacked.rglob(runner.name))
        try:
            found.parent.rename(home)
        except OSError:  # another test process unpacked it first
            if not runner.exists():
                raise
    return runner


class Apicurio:
    """One Apicurio Registry process (in-memory storage) on a free loopback port."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/apis/ccompat/v7"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 180) -> None:
        """Start it and wait until its Confluent API answers.

        Raises:
            RuntimeError: Java is missing, or it exited or did not answer in time (its log's
                tail in the message).
        """
        java = find_java()
        if java is None:
            raise RuntimeError("Apicurio Registry needs Java 17 (java on PATH or JAVA_HOME)")
        runner = fetch_apicurio()
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(
                [
                    java,
                    "-Xmx256m",
                    "-XX:+UseSerialGC",
                    "-Dquarkus.http.host=127.0.0.1",
                    f"-Dquarkus.http.port={self.port}",
                    "-jar",
                    str(runner),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=runner.parent,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"Apicurio Registry exited: {self._log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/subjects", timeout=5) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"Apicurio Registry did not answer in {timeout_s} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Stop the process (and wait for it)."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
