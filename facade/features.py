"""What a cluster's brokers support, from Kafka's ApiVersions request (v3, KIP-511): the API
keys and versions each serves, and the finalized feature levels (KIP-584), such as
``share.version`` that share groups need (KIP-932).

librdkafka keeps what it learns from ApiVersions to itself, and a share consumer on a broker
without share groups just receives nothing; so the question is asked here, once, over a plain
connection to a bootstrap server. Clusters reached over TLS or SASL are not probed (``None``).
"""

from __future__ import annotations

import logging
import socket
import struct
from dataclasses import dataclass, field

from bolide.facade.cluster import Cluster
from bolide.facade.errors import BrokerError

__all__ = ["SHARE_GROUP_APIS", "BrokerFeatures", "broker_features"]

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


def broker_features(cluster: Cluster, timeout_s: float = 10.0) -> BrokerFeatures | None:
    """Ask the first reachable bootstrap server; ``None`` when the cluster is reached over
    TLS or SASL (not probed here).

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
            with socket.create_connection((host.strip("[]"), int(port)), timeout_s) as sock:
                sock.settimeout(timeout_s)
                return _parse(_exchange(sock))
        except (OSError, ValueError, struct.error) as exc:
            errors.append(f"{server}: {exc}")
    raise BrokerError(f"no bootstrap server answered ApiVersions: {'; '.join(errors)}")


def _exchange(sock: socket.socket) -> bytes:
    """Send ApiVersions v3 (request header v2) and return the response body."""
    client = b"bolide"
    header = struct.pack(">hhih", _API_VERSIONS, 3, 1, len(client)) + client + b"\x00"
    body = _compact(b"bolide") + _compact(b"1") + b"\x00"
    request = header + body
    sock.sendall(struct.pack(">i", len(request)) + request)
    size = struct.unpack(">i", _read(sock, 4))[0]
    payload = _read(sock, size)
    return payload[4:]  # the correlation id (ApiVersions answers with response header v0)


def _read(sock: socket.socket, count: int) -> bytes:
    out = bytearray()
    while len(out) < count:
        chunk = sock.recv(count - len(out))
        if not chunk:
            raise ValueError("the broker closed the connection")
        out += chunk
    return bytes(out)


def _compact(text: bytes) -> bytes:
    return _uvarint(len(text) + 1) + text


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class _Reader:
    """Kafka's wire types, read from one response body."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def fixed(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += size
        return int(value)

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            byte = self.data[self.at]
            self.at += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def string(self) -> str:
        size = self.uvarint() - 1
        text = self.data[self.at : self.at + size].decode()
        self.at += size
        return text

    def tags(self) -> dict[int, bytes]:
        out = {}
        for _ in range(self.uvarint()):
            tag, size = self.uvarint(), self.uvarint()
            out[tag] = self.data[self.at : self.at + size]
            self.at += size
        return out


def _parse(body: bytes) -> BrokerFeatures:
    reader = _Reader(body)
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
        features = _Reader(raw)
        for _ in range(features.uvarint() - 1):
            name = features.string()
            finalized[name] = features.fixed(">h")
            features.fixed(">h")  # min level
            features.tags()
    return BrokerFeatures(keys, finalized)
