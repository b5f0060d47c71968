"""An embedded broker for development and tests: Apache Kafka (the reference) or Tansu.

The names live in ``bolide.facade.broker.embedded``; this package names them."""

from bolide.facade.broker.embedded import (
    ENGINES,
    FAST_GROUP_SETTINGS,
    FETCH_GAP_SETTLE_MS,
    GROUP_SETTINGS,
    SECURITY,
    EmbeddedBroker,
    EngineName,
    GroupSettings,
    SecurityName,
    free_port,
    free_ports,
    log_tail,
    port_taken,
    resolve_engine,
    stop_process,
)

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
