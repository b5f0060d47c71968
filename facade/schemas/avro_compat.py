"""Avro schema resolution as a compatibility check: can a reader schema read a writer's data?

fastavro resolves data at read time but has no schema-level checker, so this module follows the
"Schema Resolution" section of the Avro specification (and the behaviour of Avro's Java
``SchemaCompatibility``, which Confluent Schema Registry uses):

* primitives match themselves, and the writer may be promoted: int -> long, float, double;
  long -> float, double; float -> double; string <-> bytes;
* records match by unqualified name (or a reader alias); every reader field needs a writer field
  of the same name (or alias) whose type it can read, or a default; extra writer fields are
  skipped;
* enums match by name; each writer symbol must exist in the reader, unless the reader has a
  default symbol;
* fixed types match by name and size; arrays by items; maps by values;
* a writer union is readable when each of its branches is; a reader union reads a writer type
  when one of its branches does;
* logical types are ignored: they never change the binary encoding.

Recursive schemas are handled co-inductively: a pair of named types already under comparison is
assumed compatible.
"""

from __future__ import annotations

import json
from typing import Any

from fastavro import parse_schema

__all__ = ["PRIMITIVES", "load_schema", "parse_with_names", "reader_incompatibilities"]

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_COMPLEX = frozenset({"record", "error", "enum", "fixed", "array", "map"})
# (writer type, reader type) pairs the reader may promote.
_PROMOTIONS = frozenset(
    {
        ("int", "long"),
        ("int", "float"),
        ("int", "double"),
        ("long", "float"),
        ("long", "double"),
        ("float", "double"),
        ("string", "bytes"),
        ("bytes", "string"),
    }
)

Named = dict[str, Any]


def load_schema(schema: Any) -> Any:
    """Return a schema as JSON data: JSON text is decoded, dicts and lists pass through.

    Raises:
        ValueError: ``schema`` is text that is neither JSON nor a primitive type name.
    """
    if isinstance(schema, str):
        text = schema.strip()
        if text in PRIMITIVES:
            return text
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"schema is not valid JSON: {exc}") from exc
    return schema


def parse_with_names(schema: Any) -> tuple[Any, Named]:
    """Parse a schema with fastavro; return it with its named types by full name."""
    named: Named = {}
    parsed = parse_schema(load_schema(schema), named, _write_hint=False)
    return parsed, named


def _at(path: str) -> str:
    return path or "/"


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


class _Checker:
    def __init__(self, reader_named: Named, writer_named: Named) -> None:
        self.reader_named = reader_named
        self.writer_named = writer_named
        self.assumed: set[tuple[int, int]] = set()

    @staticmethod
    def _norm(schema: Any, named: Named) -> Any:
        """Strip wrappers: ``{"type": "int"}`` -> ``"int"``, a named reference -> its dict."""
        while True:
            if isinstance(schema, str):
                if schema in PRIMITIVES:
                    return schema
                return named[schema]
            if isinstance(schema, dict) and schema.get("type") not in _COMPLEX:
                schema = schema["type"]
                continue
            return schema

    @staticmethod
    def _describe(schema: Any) -> str:
        if isinstance(schema, str):
            return schema
        if isinstance(schema, list):
            return "union"
        kind = str(schema["type"])
        return f"{kind} {schema['name']}" if "name" in schema else kind

    def check(self, reader: Any, writer: Any, path: str) -> list[str]:
        r = self._norm(reader, self.reader_named)
        w = self._norm(writer, self.writer_named)
        if isinstance(w, list):
            errors: list[str] = []
            for branch in w:
                errors.extend(self.check(r, branch, path))
            return errors
        if isinstance(r, list):
            for branch in r:
                if not self.check(branch, w, path):
                    return []
            return [f"{_at(path)}: the reader's union has no branch that reads {self._describe(w)}"]
        rt = r if isinstance(r, str) else r["type"]
        wt = w if isinstance(w, str) else w["type"]
        rt = "record" if rt == "error" else rt
        wt = "record" if wt == "error" else wt
        if isinstance(r, str) and isinstance(w, str):
            if rt == wt or (wt, rt) in _PROMOTIONS:
                return []
            return [f"{_at(path)}: {wt} cannot be read as {rt}"]
        if rt != wt:
            return [f"{_at(path)}: {self._describe(w)} cannot be read as {self._describe(r)}"]
        if rt == "array":
            return self.check(r["items"], w["items"], f"{path}/items")
        if rt == "map":
            return self.check(r["values"], w["values"], f"{path}/values")
        name_error = self._names(r, w, path)
        if name_error:
            return [name_error]
        if rt == "fixed":
            if r["size"] != w["size"]:
                return [
                    f"{_at(path)}: fixed {r['name']} has size {r['size']}, writer's {w['size']}"
                ]
            return []
        if rt == "enum":
            missing = [s for s in w["symbols"] if s not in r["symbols"]]
            if missing and "default" not in r:
                name = r["name"]
                return [f"{_at(path)}: enum {name} lacks writer symbols {missing} and no default"]
            return []
        return self._record(r, w, path)

    @staticmethod
    def _names(r: dict[str, Any], w: dict[str, Any], path: str) -> str | None:
        writer_name = _short(w["name"])
        aliases = {_short(a) for a in r.get("aliases", ())}
        if _short(r["name"]) == writer_name or writer_name in aliases:
            return None
        return f"{_at(path)}: {r['type']} name {r['name']} does not match the writer's {w['name']}"

    def _record(self, r: dict[str, Any], w: dict[str, Any], path: str) -> list[str]:
        key = (id(r), id(w))
        if key in self.assumed:
            return []
        self.assumed.add(key)
        writer_fields = {f["name"]: f for f in w["fields"]}
        errors: list[str] = []
        for field in r["fields"]:
            name = field["name"]
            found = writer_fields.get(name)
            if found is None:
                for alias in field.get("aliases", ()):
                    found = writer_fields.get(alias)
                    if found is not None:
                        break
            if found is None:
                if "default" not in field:
                    errors.append(
                        f"{path}/{name}: reader field {name!r} has no default and the "
                        "writer has no such field"
                    )
                continue
            errors.extend(self.check(field["type"], found["type"], f"{path}/{name}"))
        return errors


def reader_incompatibilities(reader: Any, writer: Any) -> list[str]:
    """Return why ``reader`` cannot read data written with ``writer`` (empty: it can).

    Args:
        reader: The reader's schema (JSON text, dict or list; parsed or not).
        writer: The writer's schema.

    Returns:
        One message per incompatibility, each starting with the path of the field concerned.
    """
    r, r_named = parse_with_names(reader)
    w, w_named = parse_with_names(writer)
    return _Checker(r_named, w_named).check(r, w, "")
