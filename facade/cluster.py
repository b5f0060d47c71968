"""The cluster: connection settings shared by every client of one Kafka cluster, and how
librdkafka settings are checked (they pass through untouched as dicts of dotted keys).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from bolide.facade.redaction import redact, redact_url
from bolide.facade.validate import check_int

__all__ = ["TOPIC_NAME", "Cluster", "check_settings", "safe_repr"]

#: What Kafka accepts as a topic name.
TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_SettingValue = str | int | float | bool


def safe_repr(obj: Any) -> str:
    """A dataclass repr that keeps librdkafka secrets and database passwords out."""
    parts = []
    for item in fields(obj):
        if not item.repr:
            continue
        value = getattr(obj, item.name)
        if isinstance(value, Mapping) and item.name.endswith("_config"):
            value = redact(value)
        elif isinstance(value, str) and "://" in value:
            value = redact_url(value)
        parts.append(f"{item.name}={value!r}")
    return f"{type(obj).__name__}({', '.join(parts)})"


def check_settings(name: str, settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """``settings`` (librdkafka's) as a plain dict: names and value types checked."""
    if settings is None:
        return {}
    if not isinstance(settings, Mapping):
        raise TypeError(f"{name} must be a mapping of librdkafka settings")
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"{name}: setting names must be non-empty strings, got {key!r}")
        if not (isinstance(value, _SettingValue) or callable(value)):
            raise TypeError(
                f"{name}: setting {key!r} must be str, int, float, bool or callable, "
                f"not {type(value).__name__}"
            )
        out[key] = value
    return out


def _check_log_starts(
    overrides: Mapping[str, Mapping[int, int]] | None,
) -> dict[str, dict[int, int]]:
    """``log_start_overrides`` as a plain copy: topic names, partitions and offsets checked."""
    if overrides is None:
        return {}
    if not isinstance(overrides, Mapping):
        raise TypeError("log_start_overrides must be a mapping {topic: {partition: offset}}")
    out: dict[str, dict[int, int]] = {}
    for topic, starts in overrides.items():
        if not isinstance(topic, str):
            raise TypeError(f"log_start_overrides: topic names must be str, got {topic!r}")
        if not TOPIC_NAME.match(topic):
            raise ValueError(f"log_start_overrides: {topic!r} is not a topic name")
        if not isinstance(starts, Mapping):
            raise TypeError(
                f"log_start_overrides[{topic!r}] must be a mapping {{partition: offset}}"
            )
        out[topic] = {
            check_int(f"log_start_overrides[{topic!r}] partition", p): check_int(
                f"log_start_overrides[{topic!r}][{p!r}]", offset
            )
            for p, offset in starts.items()
        }
    return out


class Cluster:
    """Connection settings shared by every client talking to one Kafka cluster.

    Args:
        bootstrap_servers: ``host:port[,host:port...]``.
        fetch_gap_settle_ms: How long a skip in a partition's offsets must persist before a
            reader takes it for a real gap (transaction markers, compaction) rather than a
            fetch answered before an earlier batch was visible. ``0`` (Apache Kafka) checks
            once; the embedded broker needs a window (docs/compatibility.md).
        log_start_overrides: ``{topic: {partition: offset}}``: the first offset Kafka is
            taken to hold, at least (``bolide.facade.kafka.log_starts`` answers the larger of
            this and the broker's). It emulates retention on a broker that never deletes
            records; set it through ``EmbeddedBroker.cluster(log_start_overrides=...)``.
            Not a librdkafka setting: never part of ``client_config()``.
        **overrides: Any librdkafka setting, by its dotted name, passed to every client
            (``**{"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", ...}``).

    Secret settings (passwords, keys) never appear in ``repr`` or logs.
    """

    __slots__ = ("_log_start_overrides", "_settings", "bootstrap_servers", "fetch_gap_settle_ms")

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        fetch_gap_settle_ms: int = 0,
        log_start_overrides: Mapping[str, Mapping[int, int]] | None = None,
        **overrides: Any,
    ) -> None:
        if not isinstance(bootstrap_servers, str) or not bootstrap_servers.strip():
            raise ValueError("bootstrap_servers must be a non-empty 'host:port' string")
        if (
            isinstance(fetch_gap_settle_ms, bool)
            or not isinstance(fetch_gap_settle_ms, int)
            or fetch_gap_settle_ms < 0
        ):
            raise ValueError(
                f"fetch_gap_settle_ms must be a non-negative int, got {fetch_gap_settle_ms!r}"
            )
        self.fetch_gap_settle_ms = fetch_gap_settle_ms
        if "bootstrap.servers" in overrides:
            raise ValueError("bootstrap_servers: pass it as the first argument, not an override")
        self.bootstrap_servers = bootstrap_servers.strip()
        self._settings = check_settings("Cluster overrides", overrides)
        self._log_start_overrides = _check_log_starts(log_start_overrides)

    @property
    def settings(self) -> dict[str, Any]:
        """The librdkafka passthrough settings (a copy; secrets included)."""
        return dict(self._settings)

    @property
    def log_start_overrides(self) -> dict[str, dict[int, int]]:
        """``{topic: {partition: offset}}``: log starts assumed on top of the broker's (a copy)."""
        return {topic: dict(starts) for topic, starts in self._log_start_overrides.items()}

    def replace(self, **changes: Any) -> Cluster:
        """A copy with ``changes`` applied, like ``dataclasses.replace``: ``bootstrap_servers``,
        ``fetch_gap_settle_ms``, ``log_start_overrides`` or librdkafka settings."""
        current: dict[str, Any] = {
            "fetch_gap_settle_ms": self.fetch_gap_settle_ms,
            "log_start_overrides": self._log_start_overrides,
            **self._settings,
        }
        bootstrap = changes.pop("bootstrap_servers", self.bootstrap_servers)
        return Cluster(bootstrap, **{**current, **changes})

    def client_config(self, *layers: Mapping[str, Any] | None) -> dict[str, Any]:
        """Build a librdkafka config: bootstrap servers, cluster overrides, then ``layers``."""
        config: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers}
        config.update(self._settings)
        for layer in layers:
            if layer:
                config.update(layer)
        return config

    def __repr__(self) -> str:
        settle = self.fetch_gap_settle_ms
        extra = f", fetch_gap_settle_ms={settle}" if settle else ""
        if self._log_start_overrides:
            extra += f", log_start_overrides={self._log_start_overrides!r}"
        return f"Cluster({self.bootstrap_servers!r}, {redact(self._settings)!r}{extra})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Cluster):
            return NotImplemented
        return (
            self.bootstrap_servers,
            self._settings,
            self.fetch_gap_settle_ms,
            self._log_start_overrides,
        ) == (
            other.bootstrap_servers,
            other._settings,
            other.fetch_gap_settle_ms,
            other._log_start_overrides,
        )

    def __hash__(self) -> int:
        return hash(self.bootstrap_servers)
