"""``TELEMETRY``, decided once at import (``None`` without ``opentelemetry-api``), and the
functions an application calls: ``enabled``, ``configure``, ``watch_durable`` (the package
``bolide.facade.telemetry`` names them and says what they report)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bolide.facade.config import Cluster
    from bolide.facade.ports import DurableClient

try:
    from bolide.facade.telemetry._otel import Instrumentation
except ImportError:  # the otel extra is not installed: every hook is skipped
    TELEMETRY: Instrumentation | None = None
else:
    TELEMETRY = Instrumentation()

__all__ = ["TELEMETRY", "configure", "enabled", "watch_durable"]

_MISSING = "OpenTelemetry is not installed: pip install 'bolide[otel]'"


def enabled() -> bool:
    """True when ``opentelemetry-api`` is installed (bolide reports to it)."""
    return TELEMETRY is not None


def configure(tracer_provider: Any = None, meter_provider: Any = None) -> None:
    """Report to these providers instead of the global ones (``None``: back to the global).

    An application that sets the global providers (``trace.set_tracer_provider``) needs no
    call; this is for one that keeps its providers to itself, or tests with in-memory ones.

    Raises:
        ModuleNotFoundError: The otel extra is not installed (names the install command).
    """
    if TELEMETRY is None:
        raise ModuleNotFoundError(_MISSING, name="opentelemetry")
    TELEMETRY.configure(tracer_provider, meter_provider)


def watch_durable(cluster: Cluster, clients: Callable[[], Iterable[DurableClient]]) -> None:
    """Report ``bolide.durable.backlog`` for every client ``clients()`` lists, e.g.
    ``watch_durable(cluster, SqlDurableRegistry(url).list)``.

    Raises:
        ModuleNotFoundError: The otel extra is not installed.
    """
    if TELEMETRY is None:
        raise ModuleNotFoundError(_MISSING, name="opentelemetry")
    if not callable(clients):
        raise TypeError("clients must be callable (a registry's list method)")
    TELEMETRY.watch_durable(cluster, clients)
