"""Prepared fastavro encode/decode: parse once, then no per-record schema work.

fastavro's public ``schemaless_writer``/``schemaless_reader`` re-run ``parse_schema`` and build
their option dicts on every call. Both delegate to ``write_data``/``_read_data`` of fastavro's
compiled modules, which take the parsed schema, its named types and the options; calling those
with everything prepared once is what makes a serde as fast as bare fastavro while it also
frames, looks up and checks each payload.

Those two functions are not public API, so at import they are checked against the public
functions on a probe schema (plain and resolved reads, unions, named types); if they are missing
or disagree, ``write_data``/``read_data`` fall back to wrappers over the public functions with
the same signatures.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from io import BytesIO
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer

__all__ = ["FAST", "READ_OPTIONS", "WRITE_OPTIONS", "prepare", "read_data", "write_data"]

WRITE_OPTIONS: dict[str, Any] = {
    "strict": False,
    "strict_allow_default": False,
    "disable_tuple_notation": False,
}
READ_OPTIONS: dict[str, Any] = {
    "return_record_name": False,
    "return_record_name_override": False,
    "handle_unicode_errors": "strict",
    "return_named_type": False,
    "return_named_type_override": False,
}

WriteData = Callable[[bytearray, Any, Any, dict[str, Any], str, dict[str, Any]], None]
ReadData = Callable[[BytesIO, Any, dict[str, Any], Any, dict[str, Any]], Any]


def prepare(schema: Any) -> tuple[Any, dict[str, Any]]:
    """Parse a schema (JSON data) once; return it with its named types."""
    named: dict[str, Any] = {}
    return parse_schema(schema, named), named


def _public_write(
    out: bytearray,
    value: Any,
    parsed: Any,
    named: dict[str, Any],
    fname: str,
    options: dict[str, Any],
) -> None:
    body = BytesIO()
    schemaless_writer(body, parsed, value)
    out += body.getvalue()


def _public_read(
    fo: BytesIO, writer: Any, named: dict[str, Any], reader: Any, options: dict[str, Any]
) -> Any:
    return schemaless_reader(fo, writer, reader)


_PROBE_WRITER = {
    "type": "record",
    "name": "Probe",
    "namespace": "bolide",
    "fields": [
        {"name": "n", "type": "long"},
        {"name": "s", "type": ["null", "string"]},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}},
        {"name": "again", "type": ["null", "E"]},
        {"name": "items", "type": {"type": "array", "items": "int"}},
    ],
}
_PROBE_READER = {
    **_PROBE_WRITER,
    "fields": [
        *_PROBE_WRITER["fields"][:3],
        {"name": "items", "type": {"type": "array", "items": "double"}},
        {"name": "added", "type": "string", "default": "d"},
    ],
}
_PROBE_VALUE = {"n": -3, "s": "x", "e": "B", "again": "A", "items": [1, 2]}


def _probe() -> tuple[WriteData, ReadData, bool]:
    try:
        # Private names, so looked up rather than imported (fastavro's stubs omit them).
        _read_data = importlib.import_module("fastavro._read")._read_data
        _write_data = importlib.import_module("fastavro._write").write_data
    except (ImportError, AttributeError):  # pragma: no cover - fastavro changed
        return _public_write, _public_read, False
    try:
        writer, named_w = prepare(_PROBE_WRITER)
        reader, named_r = prepare(_PROBE_READER)
        out = bytearray(b"\x00")
        _write_data(out, _PROBE_VALUE, writer, named_w, "", WRITE_OPTIONS)
        public = BytesIO()
        schemaless_writer(public, _PROBE_WRITER, _PROBE_VALUE)
        body = public.getvalue()
        named = {"writer": named_w, "reader": {}}
        plain = _read_data(BytesIO(body), writer, named, None, READ_OPTIONS)
        named = {"writer": named_w, "reader": named_r}
        resolved = _read_data(BytesIO(body), writer, named, reader, READ_OPTIONS)
        agrees = (
            bytes(out[1:]) == body
            and plain == schemaless_reader(BytesIO(body), _PROBE_WRITER)
            and resolved == schemaless_reader(BytesIO(body), _PROBE_WRITER, _PROBE_READER)
        )
    except Exception:  # pragma: no cover - fastavro changed its internals
        agrees = False
    if not agrees:  # pragma: no cover
        return _public_write, _public_read, False
    return _write_data, _read_data, True


write_data, read_data, FAST = _probe()
