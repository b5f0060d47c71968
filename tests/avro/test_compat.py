"""The schema compatibility checker against Avro's resolution rules and fastavro's resolution."""

from __future__ import annotations

import contextlib
import copy
import json
from io import BytesIO
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.utils import generate_many
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bolide.facade.errors import SchemaIncompatibleError
from bolide.facade.schemas.avro_compat import reader_incompatibilities
from bolide.facade.schemas.registry import Compatibility, check_compatible


def rec(name: str, *fields: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": list(fields), **extra}


def field(name: str, type_: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, **extra}


PROMOTIONS = [
    ("int", "long"),
    ("int", "float"),
    ("int", "double"),
    ("long", "float"),
    ("long", "double"),
    ("float", "double"),
    ("string", "bytes"),
    ("bytes", "string"),
]


@pytest.mark.parametrize(("writer", "reader"), PROMOTIONS)
def test_promotions_are_readable_one_way(writer: str, reader: str) -> None:
    assert reader_incompatibilities(reader, writer) == []
    if (reader, writer) not in PROMOTIONS:
        expected = [f"/: {reader} cannot be read as {writer}"]
        assert reader_incompatibilities(writer, reader) == expected


COMPATIBLE = [
    pytest.param(rec("R", field("a", "int")), rec("R", field("a", "int")), id="same"),
    pytest.param(
        rec("R", field("a", "int"), field("b", "string", default="x")),
        rec("R", field("a", "int")),
        id="reader adds a field with a default",
    ),
    pytest.param(
        rec("R", field("a", "int")),
        rec("R", field("a", "int"), field("b", "string")),
        id="writer has an extra field",
    ),
    pytest.param(
        rec("R", field("b", "int", aliases=["a"])),
        rec("R", field("a", "int")),
        id="field renamed with an alias",
    ),
    pytest.param(rec("ns.R", field("a", "int")), rec("other.R", field("a", "int")), id="namespace"),
    pytest.param(
        rec("New", field("a", "int"), aliases=["Old"]), rec("Old", field("a", "int")), id="alias"
    ),
    pytest.param(["null", "long"], "int", id="reader union with a promoted branch"),
    pytest.param(["null", "string", "int"], ["int", "null"], id="writer union in reader union"),
    pytest.param(
        {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]},
        {"type": "enum", "name": "E", "symbols": ["A", "B"]},
        id="enum gains a symbol",
    ),
    pytest.param(
        {"type": "enum", "name": "E", "symbols": ["A"], "default": "A"},
        {"type": "enum", "name": "E", "symbols": ["A", "B"]},
        id="enum loses a symbol but has a default",
    ),
    pytest.param(
        {"type": "array", "items": "double"}, {"type": "array", "items": "int"}, id="array items"
    ),
    pytest.param({"type": "map", "values": "long"}, {"type": "map", "values": "int"}, id="map"),
    pytest.param(
        {"type": "fixed", "name": "F", "size": 4},
        {"type": "fixed", "name": "F", "size": 4},
        id="fixed",
    ),
    pytest.param({"type": "int", "logicalType": "date"}, "int", id="logical types do not matter"),
    pytest.param(
        rec("Node", field("v", "int"), field("next", ["null", "Node"], default=None)),
        rec("Node", field("v", "int"), field("next", ["null", "Node"], default=None)),
        id="recursive",
    ),
]


@pytest.mark.parametrize(("reader", "writer"), COMPATIBLE)
def test_compatible_pairs(reader: Any, writer: Any) -> None:
    assert reader_incompatibilities(reader, writer) == []


INCOMPATIBLE = [
    pytest.param(
        rec("R", field("a", "int"), field("b", "string")),
        rec("R", field("a", "int")),
        "/b: reader field 'b' has no default and the writer has no such field",
        id="reader adds a field without default",
    ),
    pytest.param(
        rec("R", field("a", "string")),
        rec("R", field("a", "int")),
        "/a: int cannot be read as string",
        id="type change",
    ),
    pytest.param(
        rec("R", field("a", "int")),
        rec("R", field("a", "long")),
        "/a: long cannot be read as int",
        id="narrowing",
    ),
    pytest.param(
        rec("S", field("a", "int")),
        rec("R", field("a", "int")),
        "/: record name S does not match the writer's R",
        id="record renamed",
    ),
    pytest.param(
        {"type": "enum", "name": "E", "symbols": ["A"]},
        {"type": "enum", "name": "E", "symbols": ["A", "B"]},
        "/: enum E lacks writer symbols ['B'] and no default",
        id="enum loses a symbol",
    ),
    pytest.param(
        {"type": "fixed", "name": "F", "size": 4},
        {"type": "fixed", "name": "F", "size": 8},
        "/: fixed F has size 4, writer's 8",
        id="fixed size",
    ),
    pytest.param(
        "int", ["null", "int"], "/: null cannot be read as int", id="writer union branch unreadable"
    ),
    pytest.param(
        ["null", "int"],
        "string",
        "/: the reader's union has no branch that reads string",
        id="reader union lacks the type",
    ),
    pytest.param(
        {"type": "array", "items": "int"},
        {"type": "map", "values": "int"},
        "/: map cannot be read as array",
        id="array vs map",
    ),
    pytest.param(
        rec("R", field("xs", {"type": "array", "items": "int"})),
        rec("R", field("xs", {"type": "array", "items": "string"})),
        "/xs/items: string cannot be read as int",
        id="nested path",
    ),
]


@pytest.mark.parametrize(("reader", "writer", "reason"), INCOMPATIBLE)
def test_incompatible_pairs_name_the_reason(reader: Any, writer: Any, reason: str) -> None:
    assert reader_incompatibilities(reader, writer) == [reason]


def test_levels_check_the_right_direction() -> None:
    old = rec("R", field("a", "int"))
    added_no_default = rec("R", field("a", "int"), field("b", "int"))
    removed = rec("R")
    # Adding a field without default: old data lacks it (BACKWARD fails), FORWARD is fine.
    check_compatible("s", Compatibility.FORWARD, _t(added_no_default), [_t(old)])
    with pytest.raises(SchemaIncompatibleError) as info:
        check_compatible("s", Compatibility.BACKWARD, _t(added_no_default), [_t(old)])
    assert info.value.subject == "s"
    assert info.value.reasons == [
        "new schema cannot read old data: /b: reader field 'b' has no default and the writer "
        "has no such field"
    ]
    # Removing a field without default: old readers need it (FORWARD fails), BACKWARD is fine.
    check_compatible("s", Compatibility.BACKWARD, _t(removed), [_t(old)])
    with pytest.raises(SchemaIncompatibleError, match="old schema cannot read new data: /a"):
        check_compatible("s", Compatibility.FORWARD, _t(removed), [_t(old)])
    with pytest.raises(SchemaIncompatibleError):
        check_compatible("s", Compatibility.FULL, _t(removed), [_t(old)])
    check_compatible("s", Compatibility.NONE, _t(rec("Other")), [_t(old)])


def test_transitive_levels_check_every_version() -> None:
    v1 = rec("R", field("a", "string"))
    v2 = rec("R", field("b", "int", default=0))
    new = rec("R", field("a", "int", default=0), field("b", "int", default=0))
    versions = [_t(v1), _t(v2)]
    check_compatible("s", Compatibility.BACKWARD, _t(new), versions)  # reads v2's data
    with pytest.raises(SchemaIncompatibleError, match="/a: string cannot be read as int"):
        check_compatible("s", Compatibility.BACKWARD_TRANSITIVE, _t(new), versions)
    assert Compatibility.of("full") is Compatibility.FULL
    with pytest.raises(ValueError, match="not one of"):
        Compatibility.of("SIDEWAYS")


def _t(schema: Any) -> str:
    return json.dumps(schema)


# -- properties: the checker never says "compatible" when fastavro cannot resolve --------------

PRIMS = ["null", "boolean", "int", "long", "float", "double", "bytes", "string"]
DEFAULTS: dict[str, Any] = {
    "boolean": False,
    "int": 0,
    "long": 0,
    "float": 0.0,
    "double": 0.0,
    "bytes": "",
    "string": "",
}


@st.composite
def schemas(draw: st.DrawFn, depth: int = 0, names: list[str] | None = None) -> Any:
    names = names if names is not None else []
    kinds = ["prim", "prim", "union"] + (["record", "array", "map", "enum"] if depth < 2 else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "prim":
        return draw(st.sampled_from(PRIMS[1:]))
    if kind == "union":
        return ["null", draw(st.sampled_from(PRIMS[1:]))]
    if kind == "array":
        return {"type": "array", "items": draw(schemas(depth + 1, names))}
    if kind == "map":
        return {"type": "map", "values": draw(schemas(depth + 1, names))}
    name = f"N{len(names)}"
    names.append(name)
    if kind == "enum":
        symbols = draw(st.lists(st.sampled_from("ABCDE"), min_size=1, max_size=4, unique=True))
        return {"type": "enum", "name": name, "symbols": symbols}
    count = draw(st.integers(1, 4))
    return rec(name, *(field(f"f{i}", draw(schemas(depth + 1, names))) for i in range(count)))


def _mutate(schema: Any, draw: st.DrawFn) -> Any:
    """One random evolution step somewhere in ``schema`` (compatible or not)."""
    if isinstance(schema, str):
        choices = [w for w, r in PROMOTIONS if r == schema] + [schema] + PRIMS[1:]
        return draw(st.sampled_from(choices))
    if isinstance(schema, list):
        return draw(st.sampled_from([schema, schema[1], ["null", "string"], [*schema, "string"]]))
    out = copy.deepcopy(schema)
    if out["type"] == "array":
        out["items"] = _mutate(out["items"], draw)
    elif out["type"] == "map":
        out["values"] = _mutate(out["values"], draw)
    elif out["type"] == "enum":
        action = draw(st.sampled_from(["add", "drop", "default", "same"]))
        if action == "add":
            out["symbols"] = [*out["symbols"], "Z"]
        elif action == "drop" and len(out["symbols"]) > 1:
            out["symbols"] = out["symbols"][1:]
        elif action == "default":
            out["default"] = out["symbols"][0]
    else:
        action = draw(st.sampled_from(["add", "add_default", "drop", "change"]))
        fields = out["fields"]
        if action == "add":
            fields.append(field("extra", "int"))
        elif action == "add_default":
            kind = draw(st.sampled_from(sorted(DEFAULTS)))
            fields.append(field("extra", kind, default=DEFAULTS[kind]))
        elif action == "drop" and len(fields) > 1:
            fields.pop(draw(st.integers(0, len(fields) - 1)))
        else:
            i = draw(st.integers(0, len(fields) - 1))
            fields[i] = {**fields[i], "type": _mutate(fields[i]["type"], draw)}
    return out


@st.composite
def schema_pairs(draw: st.DrawFn) -> tuple[Any, Any]:
    writer = draw(schemas())
    return writer, _mutate(writer, draw)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema_pairs())
def test_checker_agrees_with_fastavro_resolution(pair: tuple[Any, Any]) -> None:
    writer, reader = pair
    assert reader_incompatibilities(writer, writer) == []
    if reader_incompatibilities(reader, writer):
        return
    parsed_writer, parsed_reader = parse_schema(writer), parse_schema(reader)
    for value in generate_many(parsed_writer, 5):
        out = BytesIO()
        schemaless_writer(out, parsed_writer, value)
        out.seek(0)
        # Must not raise; but bytes -> string promotion needs UTF-8 content (data, not schemas).
        with contextlib.suppress(UnicodeDecodeError):
            schemaless_reader(out, parsed_writer, parsed_reader)
