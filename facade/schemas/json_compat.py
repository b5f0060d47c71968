"""JSON Schema compatibility: does a reader's schema accept every value a writer's accepts?

Confluent Schema Registry answers this per content model, and so does this check:

* an **open** content model (``additionalProperties`` absent or ``true``) lets a writer put any
  property in; so a reader that adds a property to it (with a type) may meet values it refuses:
  incompatible ("property added to an open content model"). Adding a property to a writer whose
  model is **closed** (``additionalProperties: false``) is fine: no writer value has it;
* a reader whose model is closed refuses properties the writer declares and the reader dropped
  ("property removed from a closed content model");
* a property the reader requires and the writer does not, narrower ``type`` (``integer`` is a
  ``number``), an ``enum`` that lost values, tighter string or number bounds, and ``items``,
  ``additionalProperties`` schemas and ``anyOf``/``oneOf`` branches compared the same way.

``$ref`` is followed inside the document (``#/definitions/...``, ``#/$defs/...``) and to the
schemas it references by name; a ``$ref`` that cannot be resolved is compared as text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = ["json_incompatibilities", "load_json_schema"]

Resolve = Callable[[str], Any]
_BOUNDS = (
    ("maxLength", max),
    ("minLength", min),
    ("maximum", max),
    ("minimum", min),
    ("exclusiveMaximum", max),
    ("exclusiveMinimum", min),
    ("maxItems", max),
    ("minItems", min),
)


def load_json_schema(text: str) -> Any:
    """Parse and check a JSON Schema.

    Raises:
        ValueError: Not JSON, not an object or boolean, or not a valid JSON Schema.
    """
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"a JSON Schema must be JSON: {exc}") from exc
    if not isinstance(schema, dict | bool):
        raise ValueError("a JSON Schema is an object or a boolean")
    try:
        from jsonschema.exceptions import SchemaError
        from jsonschema.validators import validator_for
    except ImportError:  # pragma: no cover - without the extra, JSON is all that is checked
        return schema
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        raise ValueError(f"invalid JSON Schema: {exc.message}") from exc
    return schema


class _Checker:
    def __init__(self, reader_root: Any, writer_root: Any, named: Mapping[str, Any]) -> None:
        self.roots = {"reader": reader_root, "writer": writer_root}
        self.named = named
        self.seen: set[tuple[int, int]] = set()

    def follow(self, schema: Any, side: str) -> Any:
        for _ in range(32):
            if not isinstance(schema, dict) or "$ref" not in schema:
                return schema
            ref = schema["$ref"]
            target = self._pointer(self.roots[side], ref) if ref.startswith("#") else None
            if target is None:
                name, _, fragment = ref.partition("#")
                doc = self.named.get(name)
                target = self._pointer(doc, "#" + fragment) if doc is not None else None
            if target is None:
                return schema
            schema = target
        return schema

    @staticmethod
    def _pointer(doc: Any, ref: str) -> Any:
        node = doc
        for part in ref.lstrip("#").split("/"):
            if not part:
                continue
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    def check(self, reader: Any, writer: Any, path: str) -> Iterator[str]:
        r, w = self.follow(reader, "reader"), self.follow(writer, "writer")
        if w is False or r is True or r == {}:
            return
        at = path or "/"
        if r is False:
            yield f"{at}: the reader accepts no value here"
            return
        if w is True or w == {}:
            yield f"{at}: the writer allows any value, the reader does not"
            return
        key = (id(r), id(w))
        if key in self.seen:
            return
        self.seen.add(key)
        if "$ref" in r or "$ref" in w:
            if r.get("$ref") != w.get("$ref"):
                yield f"{at}: $ref {w.get('$ref')!r} became {r.get('$ref')!r}"
            return
        yield from self._branches(r, w, at)
        yield from self._types(r, w, at)
        yield from self._values(r, w, at)
        yield from self._object(r, w, path)
        if isinstance(r.get("items"), dict | bool):
            yield from self.check(r["items"], w.get("items", True), f"{path}/items")

    def _branches(self, r: dict[str, Any], w: dict[str, Any], at: str) -> Iterator[str]:
        for word in ("anyOf", "oneOf"):
            if word not in r:
                continue
            writers = w.get("anyOf") or w.get("oneOf") or [w]
            for i, branch in enumerate(writers):
                if not any(not list(self.check(option, branch, at)) for option in r[word]):
                    yield f"{at}: the writer's branch {i} matches none of the reader's {word}"

    @staticmethod
    def _types(r: dict[str, Any], w: dict[str, Any], at: str) -> Iterator[str]:
        if "type" not in r:
            return
        wanted = {r["type"]} if isinstance(r["type"], str) else set(r["type"])
        if "number" in wanted:
            wanted.add("integer")
        if "type" not in w:
            yield f"{at}: the reader requires type {sorted(wanted)}, the writer any"
            return
        given = {w["type"]} if isinstance(w["type"], str) else set(w["type"])
        lost = sorted(given - wanted)
        if lost:
            yield f"{at}: type {lost} is no longer accepted"

    @staticmethod
    def _values(r: dict[str, Any], w: dict[str, Any], at: str) -> Iterator[str]:
        if "enum" in r:
            missing = [v for v in w.get("enum", ()) if v not in r["enum"]]
            if "enum" not in w or missing:
                yield f"{at}: enum lost values {missing or 'the writer allows'}"
        for word, wider in _BOUNDS:
            if word not in r:
                continue
            if word not in w or wider(r[word], w[word]) != r[word]:
                yield f"{at}: {word} narrowed to {r[word]} (the writer's: {w.get(word)})"
        if "pattern" in r and r.get("pattern") != w.get("pattern"):
            yield f"{at}: pattern {w.get('pattern')!r} became {r['pattern']!r}"

    def _object(self, r: dict[str, Any], w: dict[str, Any], path: str) -> Iterator[str]:
        at = path or "/"
        added_required = sorted(set(r.get("required", ())) - set(w.get("required", ())))
        if added_required:
            yield f"{at}: properties {added_required} became required"
        r_props, w_props = r.get("properties", {}), w.get("properties", {})
        r_more, w_more = r.get("additionalProperties", True), w.get("additionalProperties", True)
        for name, schema in r_props.items():
            if name in w_props:
                yield from self.check(schema, w_props[name], f"{path}/{name}")
            elif w_more is not False and list(self.check(schema, w_more, "")):
                yield f"{path}/{name}: property added to an open content model"
        for name, schema in w_props.items():
            if name in r_props:
                continue
            if r_more is False:
                yield f"{path}/{name}: property removed from a closed content model"
            else:
                yield from self.check(r_more, schema, f"{path}/{name}")
        if r_more is not True and w_more is not False and (r_props or w_props or r_more):
            if r_more is False:
                yield f"{at}: the reader's content model is closed, the writer's open"
            else:
                yield from self.check(r_more, w_more, f"{path}/*")


def json_incompatibilities(
    reader: str, writer: str, named: Mapping[str, Any] | None = None
) -> list[str]:
    """Why ``reader`` refuses values ``writer`` accepts (empty: it accepts them all).

    Args:
        reader: The reader's schema text.
        writer: The writer's schema text.
        named: Referenced schemas by the name a ``$ref`` uses.
    """
    r, w = load_json_schema(reader), load_json_schema(writer)
    return list(dict.fromkeys(_Checker(r, w, named or {}).check(r, w, "")))
