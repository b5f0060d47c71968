"""An embedded broker for development and tests: Apache Kafka (the reference) or Tansu.

``EmbeddedBroker(engine="auto")`` runs Apache Kafka from its official jars when Java 17+ and
the jars (``bolide fetch kafka``) are here, else the light Tansu engine. One module per engine
(``apache``, ``tansu``), both behind the ``Engine`` interface.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from bolide.facade.broker._engine import Engine
from bolide.facade.broker._process import (
    free_port,
    free_ports,
    log_tail,
    port_taken,
    stop_process,
)
from bolide.facade.broker.apache import (
    FAST_GROUP_SETTINGS,
    GROUP_SETTINGS,
    GroupSettings,
    KafkaEngine,
    check_group_settings,
    kafka_unavailable,
)
from bolide.facade.broker.security import (
    SECURITY,
    BrokerSecurity,
    SecurityName,
    check_security,
)
from bolide.facade.broker.tansu import FETCH_GAP_SETTLE_MS, TansuEngine
from bolide.facade.config import Cluster
from bolide.facade.errors import BrokerError

__all__ = [
    "ENGINES",
    "FAST_GROUP_SETTINGS",
    "FETCH_GAP_SETTLE_MS",
    "GROUP_SETTINGS",
    "SECURITY",
    "EmbeddedBroker",
    "EngineName",
    "GroupSettings",
    "SecurityName",
    "free_port",
    "free_ports",
    "log_tail",
    "port_taken",
    "resolve_engine",
    "stop_process",
]

log = logging.getLogger("bolide.facade.broker")

EngineName = Literal["auto", "kafka", "tansu"]

#: The engine names ``EmbeddedBroker`` accepts.
ENGINES: tuple[str, ...] = ("auto", "kafka", "tansu")


def resolve_engine(engine: str) -> str:
    """``"kafka"`` or ``"tansu"`` for ``engine``; ``"auto"`` picks Apache Kafka when it can
    run here (``$BOLIDE_ENGINE`` overrides the choice).

    Raises:
        ValueError: An unknown engine name.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "auto":
        chosen = os.environ.get("BOLIDE_ENGINE", "auto")
        if chosen in ("kafka", "tansu"):
            return chosen
        reason = kafka_unavailable()
        if reason is None:
            return "kafka"
        log.info("embedded broker: Tansu, since %s", reason)
        return "tansu"
    return engine


def _check_tansu_options(
    broker_settings: Mapping[str, str] | None, security: str, group_settings: str
) -> None:
    """Refuse, with ``BrokerError``, the options only the Apache Kafka engine has."""
    if broker_settings:
        raise BrokerError("broker_settings apply to the Apache Kafka engine only")
    if security != "plaintext":
        raise BrokerError(f"security={security!r} needs the Apache Kafka engine")
    if group_settings != "fast":
        raise BrokerError(f"group_settings={group_settings!r} needs the Apache Kafka engine")


class EmbeddedBroker:
    """Runs an embedded broker on free loopback ports for as long as the context.

    Args:
        engine: ``"kafka"`` (Apache Kafka, KRaft), ``"tansu"``, or ``"auto"``: Apache Kafka when
            Java 17+ and its jars are here, else Tansu.
        brokers: Number of nodes (Apache Kafka only beyond 1); their ids are ``1..brokers``.
        port: Client port of the first node; a free one when ``None``.
        log_path: File that receives the (first node's) broker output; a temporary file when
            ``None``. Other nodes log beside it (``NAME-node2.log``).
        startup_timeout_s: How long to wait for the broker to answer.
        heap: Apache Kafka's maximum heap per node (``-Xmx``).
        broker_settings: Apache Kafka ``server.properties`` entries over the embedded defaults.
        group_settings: ``"fast"`` (the development values in ``FAST_GROUP_SETTINGS``:
            groups form at once, leases down to 500 ms) or ``"stock"``: Kafka's own group
            defaults (a 3 s delay before a new group's first rebalance, leases of 6 s or
            more), as a production broker runs. Apache Kafka only.
        security: The client listener (Apache Kafka only): ``"plaintext"``; ``"sasl_ssl"`` or
            ``"sasl_plaintext"`` (SCRAM-SHA-512 users); ``"ssl"`` (mutual TLS: a user is a
            client certificate). Secured, the broker runs Kafka's ``StandardAuthorizer`` with
            ``allow.everyone.if.no.acl.found=false`` and the super user ``admin``; TLS uses
            a CA of its own (``ca_location``). See ``add_user``.
        **cluster_overrides: Settings for the ``Cluster`` that ``cluster()`` returns (librdkafka
            names, which have a dot, or ``fetch_gap_settle_ms``).

    Raises:
        BrokerError: The engine cannot run here (the message says why and how to fix it), or
            ``port`` is taken.
        ValueError: An unknown ``security`` or ``group_settings``.
        TypeError: A keyword argument that is neither a parameter nor a librdkafka setting.

    Only the processes this object started are ever stopped; ``stop`` removes its data.
    """

    def __init__(
        self,
        *,
        engine: EngineName = "auto",
        brokers: int = 1,
        port: int | None = None,
        log_path: str | os.PathLike[str] | None = None,
        startup_timeout_s: float = 90.0,
        heap: str | None = None,
        broker_settings: Mapping[str, str] | None = None,
        security: SecurityName = "plaintext",
        group_settings: GroupSettings = "fast",
        **cluster_overrides: Any,
    ) -> None:
        check_security(security)
        check_group_settings(group_settings)
        for key in cluster_overrides:
            if "." not in key and key != "fetch_gap_settle_ms":
                raise TypeError(
                    f"EmbeddedBroker() got an unexpected keyword argument {key!r} (client "
                    "settings are librdkafka names, such as 'client.id')"
                )
        if isinstance(brokers, bool) or not isinstance(brokers, int) or brokers < 1:
            raise ValueError(f"brokers must be a positive int, got {brokers!r}")
        if port is not None and port_taken(port):
            raise BrokerError(f"port {port} is taken on 127.0.0.1; pass port=None for a free one")
        self.host = "127.0.0.1"
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="bolide-broker-", suffix=".log")
            os.close(fd)
            log_path = name
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self._overrides = cluster_overrides
        name = resolve_engine(engine)
        self._engine: Engine
        if name == "kafka":
            extra = {"heap": heap} if heap else {}
            self._engine = KafkaEngine(
                host=self.host,
                port=port,
                brokers=brokers,
                log_path=self.log_path,
                settings=dict(broker_settings or {}),
                security=security,
                group_settings=group_settings,
                **extra,
            )
        else:
            _check_tansu_options(broker_settings, security, group_settings)
            self._engine = TansuEngine(
                host=self.host, port=port or free_port(), brokers=brokers, log_path=self.log_path
            )
        self.port = self._engine.port

    @property
    def engine(self) -> str:
        """The engine that runs: ``"kafka"`` or ``"tansu"``."""
        return self._engine.name

    @property
    def node_ids(self) -> tuple[int, ...]:
        """The node ids (``1..brokers``)."""
        return self._engine.node_ids

    @property
    def pids(self) -> tuple[int, ...]:
        """Process ids of the nodes that run (for measuring them; stop with ``kill_node``)."""
        return self._engine.pids()

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` of every node, comma-separated, so a client still bootstraps while a
        node is down (``port`` is the first node's)."""
        return self._engine.bootstrap

    def cluster(
        self,
        *,
        log_start_overrides: Mapping[str, Mapping[int, int]] | None = None,
        **overrides: Any,
    ) -> Cluster:
        """A ``Cluster`` pointed at this broker, with what its engine's clients need.

        Args:
            log_start_overrides: ``{topic: {partition: offset}}``: emulate retention on a
                broker that cannot trim its log (Tansu): every client of the returned
                ``Cluster`` takes the partition to start at that offset. On Apache Kafka trim
                for real instead (``bolide.facade.kafka.delete_records``).
            **overrides: ``Cluster`` settings over the broker's (librdkafka names, or
                ``fetch_gap_settle_ms``).
        """
        settings = {**self._engine.cluster_settings(), **self._overrides, **overrides}
        if log_start_overrides is not None:
            settings["log_start_overrides"] = log_start_overrides
        return Cluster(self.bootstrap_servers, **settings)

    @property
    def security(self) -> str:
        """The client listener's security: one of ``SECURITY``."""
        kafka = self._engine if isinstance(self._engine, KafkaEngine) else None
        return "plaintext" if kafka is None or kafka.security is None else kafka.security.mode

    @property
    def group_settings(self) -> str:
        """The group settings the broker runs: ``"fast"`` or ``"stock"`` (one of
        ``GROUP_SETTINGS``); Tansu's are its own, reported as ``"fast"``."""
        kafka = self._engine if isinstance(self._engine, KafkaEngine) else None
        return "fast" if kafka is None else kafka.group_settings

    @property
    def ca_location(self) -> str | None:
        """The PEM file of the CA that signed the broker's certificate (``ssl.ca.location``),
        once started with TLS; ``None`` without TLS."""
        secured = self._secured() if self.security in ("ssl", "sasl_ssl") else None
        return str(secured.ca_location) if secured is not None else None

    def add_user(self, name: str, password: str | None = None) -> dict[str, str]:
        """Make a user of a secured, running broker, with no ACL yet (grant them with
        ``AdminClient.create_acls`` as the super user: ``cluster()``).

        SASL: SCRAM-SHA-512 credentials for ``name`` (``AdminClient.alter_user_scram_credentials``),
        once the broker knows them. ``"ssl"``: a client certificate whose common name is
        ``name``, signed by the broker's CA; the principal is ``User:<name>``.

        Returns:
            The settings that log in as the user: ``broker.cluster(**broker.add_user(...))``.

        Raises:
            BrokerError: The broker is not secured, or is not running.
            ValueError: A password for a certificate, or none for a SASL user.
        """
        secured = self._secured()
        if not self.running:
            raise BrokerError("start the broker before adding users")
        if secured.mode == "ssl":
            if password is not None:
                raise ValueError("an 'ssl' broker's users are certificates: pass no password")
            return secured.client_certificate(name)
        if not password:
            raise ValueError(f"a {secured.mode} user needs a password")
        secured.add_scram_user(self.bootstrap_servers, name, password)
        return {"sasl.username": name, "sasl.password": password}

    def _secured(self) -> BrokerSecurity:
        kafka = self._engine if isinstance(self._engine, KafkaEngine) else None
        if kafka is None or kafka.security is None:
            raise BrokerError(f"this broker is not secured (security={self.security!r})")
        return kafka.security

    @property
    def running(self) -> bool:
        """True while every node of the broker runs."""
        return self._engine.running()

    def start(self) -> EmbeddedBroker:
        """Start the broker (every node) and wait until it answers metadata requests.

        Raises:
            BrokerError: The engine is missing, exits early (the message has the tail of its
                log) or does not answer in time.
        """
        if not self.running:
            try:
                self._engine.start(self.startup_timeout_s)
            except BaseException:
                self.stop(5.0)
                raise
            log.info("embedded %s broker at %s", self.engine, self.bootstrap_servers)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the processes this object started (and nothing else); remove their data."""
        self._engine.stop(timeout_s)

    def kill(self) -> None:
        """SIGKILL every node (fault injection); ``start()`` brings it back. Apache Kafka
        keeps its records across this; Tansu, which holds them in memory, loses them."""
        self._engine.kill()

    def kill_node(self, node_id: int) -> None:
        """SIGKILL one node (fault injection); its data stays for ``start_node``."""
        self._engine.kill_node(node_id)

    def start_node(self, node_id: int) -> None:
        """Start a killed node again and wait until it answers."""
        self._engine.start_node(node_id, self.startup_timeout_s)

    def pause_node(self, node_id: int) -> None:
        """SIGSTOP one node (fault injection: a long GC pause). It keeps its sockets open and
        answers nothing, so clients and the other nodes see it time out, not disconnect;
        ``resume_node`` continues it. ``stop`` and ``kill_node`` work on a paused node.

        Raises:
            ValueError: No such node.
            BrokerError: The node is not running.
        """
        self._engine.pause_node(node_id)

    def resume_node(self, node_id: int) -> None:
        """SIGCONT a node ``pause_node`` stopped; nothing when it is not paused.

        Raises:
            ValueError: No such node.
        """
        self._engine.resume_node(node_id)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (
            f"EmbeddedBroker({self.bootstrap_servers!r}, engine={self.engine!r}, "
            f"running={self.running})"
        )
