"""Java artifacts fetched once from Maven Central into a user cache, and the Java to run them.

The embedded Apache Kafka engine and Spark's Kafka connector are plain jars. ``fetch`` runs
``mvn dependency:copy-dependencies`` on a small pom shipped beside the code and copies the jars
into ``$BOLIDE_CACHE`` (default ``~/.cache/bolide``); a stamp file marks a complete copy, so an
interrupted fetch is redone, and a finished one is never fetched again.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bolide.facade.errors import BrokerError

__all__ = [
    "KAFKA",
    "KAFKA_VERSION",
    "MIN_JAVA",
    "Artifacts",
    "cache_dir",
    "fetch",
    "find_java",
    "java_major",
]

log = logging.getLogger(__name__)

#: The Apache Kafka release the embedded engine runs (``org.apache.kafka:kafka_2.13``).
KAFKA_VERSION = "4.3.1"

#: Apache Kafka 4.x brokers need Java 17 or newer.
MIN_JAVA = 17

_STAMP = ".complete"


def cache_dir() -> Path:
    """Where fetched jars live: ``$BOLIDE_CACHE``, else ``$XDG_CACHE_HOME/bolide``, else
    ``~/.cache/bolide``."""
    explicit = os.environ.get("BOLIDE_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "bolide"


@dataclass(frozen=True)
class Artifacts:
    """One set of jars resolved from a pom template.

    Args:
        name: Short name, used for the cache folder and in messages (``bolide fetch NAME``).
        pom: The pom template (``@VERSION@`` is replaced by ``version``).
        version: Version of the main artifact.
        include: ``artifactId`` values to keep; all runtime dependencies when empty.
    """

    name: str
    pom: Path
    version: str
    include: tuple[str, ...] = ()

    @property
    def folder(self) -> Path:
        """The cache folder of this set (jars directly inside)."""
        return cache_dir() / f"{self.name}-{self.version}"

    def jars(self) -> list[Path] | None:
        """The cached jars, or ``None`` when they have not been fetched (completely)."""
        if not (self.folder / _STAMP).exists():
            return None
        return sorted(self.folder.glob("*.jar"))

    @property
    def fetch_command(self) -> str:
        """The command that fetches this set, for error messages."""
        return f"bolide fetch {self.name}"


#: The embedded broker's jars: Apache Kafka with a log4j2 backend for its SLF4J logging.
KAFKA = Artifacts("kafka", Path(__file__).with_name("kafka-pom.xml"), KAFKA_VERSION)


def fetch(artifacts: Artifacts, *, force: bool = False, quiet: bool = True) -> list[Path]:
    """Copy ``artifacts`` into the cache with Maven, unless already there.

    Returns:
        The jar files.

    Raises:
        BrokerError: Maven is missing or cannot resolve the artifacts (its output's tail is in
            the message).
    """
    if not force and (jars := artifacts.jars()) is not None:
        return jars
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError(
            f"fetching the {artifacts.name} jars needs Maven (mvn) on PATH; "
            "install it (Debian: apt-get install maven) and run " + artifacts.fetch_command
        )
    target = artifacts.folder
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{artifacts.name}-", dir=target.parent))
    try:
        pom = staging / "pom.xml"
        pom.write_text(artifacts.pom.read_text().replace("@VERSION@", artifacts.version))
        args = [
            mvn,
            "-B",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={staging / 'libs'}",
        ]
        if quiet:
            args.insert(1, "-q")
        if artifacts.include:
            args.append("-DincludeArtifactIds=" + ",".join(artifacts.include))
        log.info("fetching %s %s with Maven", artifacts.name, artifacts.version)
        done = subprocess.run(args, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise BrokerError(
                f"Maven could not fetch the {artifacts.name} {artifacts.version} jars "
                f"(exit {done.returncode}); is Maven Central reachable?\n{tail}"
            )
        if target.exists():
            shutil.rmtree(target)
        (staging / "libs").rename(target)
        (target / _STAMP).write_text(artifacts.version + "\n")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    jars = artifacts.jars()
    assert jars is not None
    return jars


def find_java() -> str | None:
    """The ``java`` to run: ``$JAVA_HOME/bin/java`` when set, else the one on ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


@functools.lru_cache(maxsize=8)
def java_major(java: str) -> int:
    """The major version of ``java`` (``17`` for ``17.0.15``, ``8`` for ``1.8.0``), asked once
    per path: ``EmbeddedBroker(engine="auto")`` checks it when choosing and when starting.

    Raises:
        BrokerError: It does not run or prints no version.
    """
    try:
        done = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BrokerError(f"{java} -version failed: {exc}") from exc
    match = _VERSION.search(done.stderr + done.stdout)
    if match is None:
        raise BrokerError(f"cannot read the version of {java}: {done.stderr.strip()[:200]}")
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major
