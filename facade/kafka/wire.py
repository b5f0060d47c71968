"""A few Kafka requests spoken directly over a socket, for what librdkafka does not expose:
ApiVersions' finalized features (``bolide.facade.kafka.features``), and the share group calls its
admin client lacks (``bolide.facade.ops.shares``). Flexible versions only (compact strings and
arrays, tagged fields), plaintext connections only."""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Iterable
from typing import TypeVar

__all__ = ["Reader", "Wire", "array", "i8", "i16", "i32", "nullable_array", "string"]

T = TypeVar("T")
_API_VERSIONS = 18


def uvarint(value: int) -> bytes:
    """An unsigned varint (lengths and tag counts of flexible versions)."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def string(text: str) -> bytes:
    """A compact string."""
    raw = text.encode()
    return uvarint(len(raw) + 1) + raw


def array(items: Iterable[bytes]) -> bytes:
    """A compact array of encoded items."""
    encoded = list(items)
    return uvarint(len(encoded) + 1) + b"".join(encoded)


def nullable_array(items: Iterable[bytes] | None) -> bytes:
    """A compact array, or null."""
    return b"\x00" if items is None else array(items)


def i8(value: int) -> bytes:
    return struct.pack(">b", value)


def i16(value: int) -> bytes:
    return struct.pack(">h", value)


def i32(value: int) -> bytes:
    return struct.pack(">i", value)


class Reader:
    """Kafka's wire types, read in order from one response body."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def fixed(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return int(value)

    def skip(self, count: int) -> None:
        self.at += count

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            byte = self.data[self.at]
            self.at += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def string(self) -> str | None:
        size = self.uvarint() - 1
        if size < 0:
            return None
        text = self.data[self.at : self.at + size].decode()
        self.at += size
        return text

    def array(self, item: Callable[[Reader], T]) -> list[T]:
        count = self.uvarint() - 1
        return [item(self) for _ in range(max(count, 0))]

    def tags(self) -> dict[int, bytes]:
        out = {}
        for _ in range(self.uvarint()):
            tag, size = self.uvarint(), self.uvarint()
            out[tag] = self.data[self.at : self.at + size]
            self.at += size
        return out


class Wire:
    """One plaintext connection to one broker, for requests in flexible versions."""

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self._sock = socket.create_connection((host.strip("[]"), port), timeout_s)
        self._sock.settimeout(timeout_s)
        self._correlation = 0

    def call(self, api_key: int, version: int, body: bytes) -> Reader:
        """Send one request (header v2) and return its response body (after the response
        header: v0 for ApiVersions, v1 with tagged fields for the others)."""
        self._correlation += 1
        client = b"bolide"
        header = struct.pack(">hhih", api_key, version, self._correlation, len(client)) + client
        request = header + b"\x00" + body
        self._sock.sendall(struct.pack(">i", len(request)) + request)
        size = struct.unpack(">i", self._read(4))[0]
        reader = Reader(self._read(size))
        reader.fixed(">i")  # the correlation id
        if api_key != _API_VERSIONS:
            reader.tags()
        return reader

    def _read(self, count: int) -> bytes:
        out = bytearray()
        while len(out) < count:
            chunk = self._sock.recv(count - len(out))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            out += chunk
        return bytes(out)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
