"""What a cluster's brokers support, from Kafka's ApiVersions request (v3, KIP-511): the API
keys and versions each serves, and the finalized feature levels (KIP-584), such as
``share.version`` that share groups need (KIP-932).

librdkafka keeps what it learns from ApiVersions to itself, and a share consumer on a broker
without share groups just receives nothing; so the question is asked here, once, over a plain
connection to a bootstrap server. Clusters reached over TLS or SASL are not probed (``None``).
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass, field

from bolide.facade.cluster import Cluster
from bolide.facade.errors import BrokerError
from bolide.facade.kafka.wire import Reader, Wire, string

__all__ = ["SHARE_GROUP_APIS", "BrokerFeatures", "bootstrap_wire", "broker_features"]

log = logging.getLogger(__name__)

_API_VERSIONS = 18
#: ShareGroupHeartbeat, ShareGroupDescribe, ShareFetch, ShareAcknowledge.
SHARE_GROUP_APIS = (76, 77, 78, 79)
_TAG_FINALIZED_FEATURES = 2


@dataclass(frozen=True)
class BrokerFeatures:
    """One broker's answer: ``api_keys`` maps an API key to its (min, max) version;
    ``finalized`` a feature name to its finalized (max) level."""

    api_keys: dict[int, tuple[int, int]] = field(default_factory=dict)
    finalized: dict[str, int] = field(default_factory=dict)

    def share_groups(self) -> str | None:
        """``None`` when share groups work here, else what is missing."""
        missing = [key for key in SHARE_GROUP_APIS if key not in self.api_keys]
        if missing:
            return (
                "the broker has no share group APIs (Apache Kafka 4.1 or later has them; "
                "the embedded Tansu engine does not)"
            )
        if self.finalized.get("share.version", 0) < 1:
            return (
                "share groups are not enabled on the cluster (finalized feature "
                "share.version < 1: kafka-features.sh upgrade --feature share.version=1)"
            )
        return None


def bootstrap_wire(cluster: Cluster, timeout_s: float = 10.0) -> Wire | None:
    """A connection to the first bootstrap server that answers; ``None`` when the cluster
    is reached over TLS or SASL (not spoken to directly).

    Raises:
        BrokerError: No bootstrap server answered.
    """
    protocol = str(cluster.settings.get("security.protocol", "plaintext")).lower()
    if protocol != "plaintext":
        return None
    errors = []
    for server in cluster.bootstrap_servers.split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            return Wire(host, int(port), timeout_s)
        except (OSError, ValueError) as exc:
            errors.append(f"{server}: {exc}")
    raise BrokerError(f"no bootstrap server answered: {'; '.join(errors)}")


def broker_features(cluster: Cluster, timeout_s: float = 10.0) -> BrokerFeatures | None:
    """Ask a bootstrap server (ApiVersions v3); ``None`` when the cluster is reached over TLS
    or SASL (not probed here).

    Raises:
        BrokerError: No bootstrap server answered.
    """
    wire = bootstrap_wire(cluster, timeout_s)
    if wire is None:
        return None
    try:
        with wire:
            return _parse(wire.call(_API_VERSIONS, 3, string("bolide") + string("1") + b"\x00"))
    except (OSError, ValueError, struct.error) as exc:
        raise BrokerError(f"ApiVersions failed: {exc}") from exc


def _parse(reader: Reader) -> BrokerFeatures:
    error = reader.fixed(">h")
    if error:  # UNSUPPORTED_VERSION from a broker older than ApiVersions v3: no share groups
        log.debug("ApiVersions v3 refused (error %d)", error)
        return BrokerFeatures()
    keys = {}
    for _ in range(reader.uvarint() - 1):
        key, low, high = reader.fixed(">h"), reader.fixed(">h"), reader.fixed(">h")
        reader.tags()
        keys[key] = (low, high)
    reader.fixed(">i")  # throttle time
    finalized: dict[str, int] = {}
    raw = reader.tags().get(_TAG_FINALIZED_FEATURES)
    if raw is not None:
        features = Reader(raw)
        for _ in range(features.uvarint() - 1):
            name = features.string() or ""
            finalized[name] = features.fixed(">h")
            features.fixed(">h")  # min level
            features.tags()
    return BrokerFeatures(keys, finalized)
