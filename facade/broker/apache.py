"""The Apache Kafka engine: official broker jars in KRaft mode, one JVM per node.

Each node is a combined broker and controller with its storage formatted in a temporary
folder, listening on free loopback ports. With three nodes the controllers form a quorum and
the internal topics are replicated three times, so one node can be killed and brought back.
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bolide.facade.broker._process import (
    free_port,
    log_tail,
    signal_process,
    stop_process,
    wait_ready,
)
from bolide.facade.broker.jars import KAFKA, KAFKA_VERSION, MIN_JAVA, find_java, java_major
from bolide.facade.broker.leash import Leash
from bolide.facade.broker.security import BrokerSecurity
from bolide.facade.errors import BrokerError

__all__ = [
    "DEFAULT_HEAP",
    "FAST_GROUP_SETTINGS",
    "GROUP_SETTINGS",
    "GroupSettings",
    "KafkaEngine",
    "check_group_settings",
    "kafka_classpath",
    "kafka_unavailable",
]

log = logging.getLogger(__name__)

#: The maximum heap of each node (``-Xmx``).
DEFAULT_HEAP = "768m"

#: ``"fast"``: the development group settings below; ``"stock"``: Kafka's own defaults.
GroupSettings = Literal["fast", "stock"]

#: The values ``EmbeddedBroker(group_settings=...)`` accepts.
GROUP_SETTINGS: tuple[str, ...] = ("fast", "stock")

#: What ``group_settings="fast"`` (the default) sets over Kafka's stock values (3000, 6000 and
#: 15000): groups form at once, a lease (session) may be as short as 500 ms, and a share
#: group's record lock as short as a second, so tests of a member's death wait seconds.
FAST_GROUP_SETTINGS: dict[str, str] = {
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "500",
    "group.share.min.record.lock.duration.ms": "1000",
}


def check_group_settings(group_settings: str) -> None:
    """Raise ``ValueError`` naming the choices unless ``group_settings`` is one of them."""
    if group_settings not in GROUP_SETTINGS:
        raise ValueError(
            f"group_settings must be one of {', '.join(GROUP_SETTINGS)}, got {group_settings!r}"
        )


_LOG4J = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = OUT
logger.server.name = kafka.server.BrokerServer
logger.server.level = INFO
logger.startup.name = kafka.server.KafkaRaftServer
logger.startup.level = INFO
"""


def kafka_classpath() -> list[Path] | None:
    """The broker's jars: ``$BOLIDE_KAFKA_HOME/libs`` (an unpacked Apache Kafka distribution)
    when set, else the user cache filled by ``bolide fetch kafka``; ``None`` when absent."""
    home = os.environ.get("BOLIDE_KAFKA_HOME")
    if home:
        jars = sorted((Path(home) / "libs").glob("*.jar"))
        return jars or None
    return KAFKA.jars()


def kafka_unavailable() -> str | None:
    """Why the Apache Kafka engine cannot run here, or ``None`` when it can."""
    java = find_java()
    if java is None:
        return f"Apache Kafka needs Java {MIN_JAVA}+ and no java was found (set JAVA_HOME)"
    try:
        major = java_major(java)
    except BrokerError as exc:
        return str(exc)
    if major < MIN_JAVA:
        return f"Apache Kafka needs Java {MIN_JAVA}+, and {java} is Java {major} (set JAVA_HOME)"
    if kafka_classpath() is None:
        where = os.environ.get("BOLIDE_KAFKA_HOME")
        if where:
            return f"BOLIDE_KAFKA_HOME={where} has no libs/*.jar"
        return (
            f"the Apache Kafka {KAFKA_VERSION} jars are not in {KAFKA.folder}; "
            f"fetch them with: {KAFKA.fetch_command}"
        )
    return None


@dataclass
class _Node:
    node_id: int
    port: int
    controller_port: int
    folder: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    leash: Leash | None = None  # kills the node if this Python process dies hard

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def unleash(self) -> None:
        """Forget the watcher of a node that has exited (or been stopped)."""
        leash, self.leash = self.leash, None
        if leash is not None:
            leash.release()


class KafkaEngine:
    """``brokers`` Apache Kafka nodes (ids 1..N) in KRaft combined mode."""

    name = "kafka"

    def __init__(
        self,
        *,
        host: str,
        port: int | None,
        brokers: int,
        log_path: Path,
        heap: str = DEFAULT_HEAP,
        settings: dict[str, str] | None = None,
        security: str = "plaintext",
        group_settings: GroupSettings = "fast",
    ) -> None:
        check_group_settings(group_settings)
        reason = kafka_unavailable()
        if reason is not None:
            raise BrokerError(reason)
        if brokers < 1:
            raise ValueError(f"brokers must be at least 1, got {brokers!r}")
        self.host = host
        self.log_path = log_path
        self._heap = heap
        self._settings = dict(settings or {})
        self.group_settings = group_settings
        self._java = find_java() or "java"
        self._classpath = os.pathsep.join(str(jar) for jar in kafka_classpath() or [])
        self._root = Path(tempfile.gettempdir()) / f"bolide-kafka-{uuid.uuid4().hex[:12]}"
        self._cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        self._nodes: dict[int, _Node] = {}
        self.security = (
            BrokerSecurity(security, self._root / "security", host)
            if security != "plaintext"
            else None
        )
        for node_id in range(1, brokers + 1):
            node_log = (
                log_path
                if node_id == 1
                else log_path.with_name(f"{log_path.stem}-node{node_id}{log_path.suffix}")
            )
            self._nodes[node_id] = _Node(
                node_id=node_id,
                port=port if (port and node_id == 1) else free_port(),
                controller_port=free_port(),
                folder=self._root / f"node-{node_id}",
                log_path=node_log,
            )
        self.port = self._nodes[1].port
        self._formatted = False

    @property
    def node_ids(self) -> tuple[int, ...]:
        return tuple(self._nodes)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{self.host}:{node.port}" for node in self._nodes.values())

    def pids(self) -> tuple[int, ...]:
        return tuple(n.process.pid for n in self._nodes.values() if n.process and n.alive())

    def running(self) -> bool:
        return all(node.alive() for node in self._nodes.values())

    # -- configuration -------------------------------------------------------------------

    def _properties(self, node: _Node) -> str:
        replicas = min(3, len(self._nodes))
        voters = ",".join(
            f"{other.node_id}@{self.host}:{other.controller_port}" for other in self._nodes.values()
        )
        client = "PLAINTEXT" if self.security is None else self.security.protocol
        controller = "PLAINTEXT" if self.security is None else "SASL_PLAINTEXT"
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": (
                f"{client}://{self.host}:{node.port},CONTROLLER://{self.host}:{node.controller_port}"
            ),
            "advertised.listeners": f"{client}://{self.host}:{node.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": client,
            "listener.security.protocol.map": f"{client}:{client},CONTROLLER:{controller}",
            "log.dirs": str(node.folder / "data"),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "offsets.topic.replication.factor": str(replicas),
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": str(replicas),
            "transaction.state.log.min.isr": str(min(2, replicas)),
            "transaction.state.log.num.partitions": "10",
            "share.coordinator.state.topic.replication.factor": str(replicas),
            "share.coordinator.state.topic.min.isr": str(min(2, replicas)),
            "share.coordinator.state.topic.num.partitions": "10",
            # A development broker: retention and transaction timeouts act within seconds
            # (and, with the fast group settings, groups form at once).
            "log.retention.check.interval.ms": "1000",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
            "transaction.remove.expired.transaction.cleanup.interval.ms": "5000",
            "auto.create.topics.enable": "true",
        }
        if self.group_settings == "fast":
            props.update(FAST_GROUP_SETTINGS)
        if self.security is not None:
            props.update(self.security.listener_properties(client))
        props.update(self._settings)
        return "".join(f"{key}={value}\n" for key, value in props.items())

    def _java_args(self, main: str, *args: str, heap: str | None = None) -> list[str]:
        jvm = [self._java, "-Djava.awt.headless=true", "-XX:+ExitOnOutOfMemoryError"]
        if heap:
            jvm += ["-Xms128m", f"-Xmx{heap}", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20"]
        else:
            jvm += ["-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
        log4j = self._root / "log4j2.properties"
        return [*jvm, f"-Dlog4j2.configurationFile={log4j}", "-cp", self._classpath, main, *args]

    def _format(self) -> None:
        """Write every node's properties and format its storage (in parallel: one JVM each)."""
        self._root.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self._root / "log4j2.properties").write_text(_LOG4J)
        if self.security is not None:
            self.security.generate()
        scram = self.security.format_arguments() if self.security is not None else []
        running: list[tuple[_Node, subprocess.Popen[bytes]]] = []
        for node in self._nodes.values():
            node.folder.mkdir(parents=True, exist_ok=True)
            (node.folder / "server.properties").write_text(self._properties(node))
            args = self._java_args(
                "kafka.tools.StorageTool",
                "format",
                # One argument: a random id may start with "-", which would read as an option.
                f"--cluster-id={self._cluster_id}",
                "--config",
                str(node.folder / "server.properties"),
                "--ignore-formatted",
                *scram,
            )
            with node.log_path.open("ab") as out:
                running.append(
                    (node, subprocess.Popen(args, stdout=out, stderr=out, stdin=subprocess.DEVNULL))
                )
        for node, process in running:
            if process.wait(120) != 0:
                raise BrokerError(
                    f"formatting the storage of Kafka node {node.node_id} failed "
                    f"(exit {process.returncode}); the end of {node.log_path}:\n"
                    f"{log_tail(node.log_path)}"
                )
        self._formatted = True

    # -- life cycle ----------------------------------------------------------------------

    def _launch(self, node: _Node) -> None:
        if node.alive():
            return
        node.unleash()  # the last run's, if it died
        args = self._java_args(
            "kafka.Kafka", str(node.folder / "server.properties"), heap=self._heap
        )
        with node.log_path.open("ab") as out:
            # A session of its own: a terminal's Ctrl-C reaches the program that owns this
            # broker, which stops it in order, and not the nodes behind its back.
            node.process = subprocess.Popen(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        node.leash = Leash(node.process.pid)
        log.info(
            "Apache Kafka node %d starting on %s:%d (log %s)",
            node.node_id,
            self.host,
            node.port,
            node.log_path,
        )

    def _dead(self, nodes: list[_Node]) -> str | None:
        for node in nodes:
            if node.process is not None and node.process.poll() is not None:
                return f"Kafka node {node.node_id} exited with code {node.process.returncode}"
        return None

    def start(self, timeout_s: float) -> None:
        if not self._formatted:
            self._format()
        nodes = list(self._nodes.values())
        for node in nodes:
            self._launch(node)
        try:
            wait_ready(
                self.bootstrap,
                alive=lambda: self._dead(nodes),
                brokers=len(nodes),
                timeout_s=timeout_s,
                log_path=nodes[0].log_path,
                settings=self.cluster_settings(),
            )
        except BrokerError:
            self.kill()
            raise

    def start_node(self, node_id: int, timeout_s: float) -> None:
        node = self._node(node_id)
        self._launch(node)
        wait_ready(
            f"{self.host}:{node.port}",
            alive=lambda: self._dead([node]),
            brokers=sum(1 for other in self._nodes.values() if other.alive()),
            timeout_s=timeout_s,
            log_path=node.log_path,
            settings=self.cluster_settings(),
        )

    def stop(self, timeout_s: float) -> None:
        # Every node at once: a controlled shutdown waits for the others' answers.
        threads = [
            threading.Thread(target=stop_process, args=(node.process, timeout_s))
            for node in self._nodes.values()
            if node.process is not None
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for node in self._nodes.values():
            node.process = None
            node.unleash()
        shutil.rmtree(self._root, ignore_errors=True)
        self._formatted = False

    def kill(self) -> None:
        for node_id in self._nodes:
            self.kill_node(node_id)

    def kill_node(self, node_id: int) -> None:
        node = self._node(node_id)
        process, node.process = node.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        node.unleash()

    def pause_node(self, node_id: int) -> None:
        node = self._node(node_id)
        signal_process(node.process, signal.SIGSTOP, f"Kafka node {node_id}")

    def resume_node(self, node_id: int) -> None:
        node = self._node(node_id)
        if node.alive() and node.process is not None:
            node.process.send_signal(signal.SIGCONT)

    def _node(self, node_id: int) -> _Node:
        try:
            return self._nodes[node_id]
        except KeyError:
            raise ValueError(f"no node {node_id!r}; nodes are {self.node_ids}") from None

    def cluster_settings(self) -> dict[str, Any]:
        return {} if self.security is None else self.security.client_settings()
