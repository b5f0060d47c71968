"""Decode Confluent-framed Avro, Protobuf and JSON Schema in Spark with pandas UDFs.

Spark's own ``from_avro`` lives in the spark-avro package, another jar that cannot always be
installed, and it does not understand Confluent's 5-byte framing anyway. ``from_avro_udf``
decodes with bolide's ``AvroSerde`` inside the Python workers instead::

    decode = from_avro_udf(AvroSerde(schema, registry=SqlSchemaRegistry(store)))
    orders = df.select(decode("value").alias("order")).select("order.*")

Every record is read into one shape, the UDF's schema (the serde's reader schema, else its
schema), by Avro resolution, whatever compatible schema it was written with; the result is a
struct column whose Spark type follows that schema. The registry travels to the workers as a
description (a database URL, a Confluent URL and settings, or the schemas an in-process
registry holds) and is rebuilt there once per worker process.

``from_schema_udf`` does the same for a ``ProtobufSerde`` (its message class shapes the struct)
or a ``JsonSchemaSerde`` (its schema's properties do), on the serde's plain values.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pandas as pd

from bolide.facade.errors import SerializationError
from bolide.facade.schemas.avro import AvroSerde
from bolide.facade.schemas.avro_compat import parse_with_names
from bolide.facade.schemas.base import SchemaSerde
from bolide.facade.schemas.json_schema import JsonSchemaSerde
from bolide.facade.schemas.plain import json_plain_schema, plain_schema
from bolide.facade.schemas.protobuf import ProtobufSerde
from bolide.facade.schemas.registry import (
    ConfluentSchemaRegistry,
    MemorySchemaRegistry,
    Schema,
    SchemaReference,
    SchemaRegistry,
)

__all__ = ["avro_spark_type", "from_avro_udf", "from_schema_udf"]

_WORKER_SERDES: dict[str, SchemaSerde] = {}
_WORKER_LOCK = threading.Lock()


def avro_spark_type(schema: Any) -> Any:
    """The Spark SQL type of values of an Avro ``schema`` (JSON text, dict or list).

    Records become structs, arrays arrays, maps maps with string keys; ``[null, T]`` is a
    nullable ``T``; other unions become JSON strings; enums and uuids strings; fixed and bytes
    binary; decimal, date and timestamps their Spark types; times microseconds as longs.
    """
    parsed, named = parse_with_names(schema)
    return _spark_type(parsed, named)


def _spark_type(schema: Any, named: dict[str, Any]) -> Any:
    from pyspark.sql import types as T

    primitives = {
        "null": T.NullType(),
        "boolean": T.BooleanType(),
        "int": T.IntegerType(),
        "long": T.LongType(),
        "float": T.FloatType(),
        "double": T.DoubleType(),
        "bytes": T.BinaryType(),
        "string": T.StringType(),
    }
    if isinstance(schema, str):
        return primitives[schema] if schema in primitives else _spark_type(named[schema], named)
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        return _spark_type(branches[0], named) if len(branches) == 1 else T.StringType()
    logical = schema.get("logicalType")
    if logical == "decimal":
        return T.DecimalType(schema["precision"], schema.get("scale", 0))
    if logical == "date":
        return T.DateType()
    if logical in ("timestamp-millis", "timestamp-micros"):
        return T.TimestampType()
    if logical in ("local-timestamp-millis", "local-timestamp-micros"):
        return T.TimestampNTZType()
    if logical in ("time-millis", "time-micros"):
        return T.LongType()
    kind = schema["type"]
    if isinstance(kind, dict | list) or kind in named:
        return _spark_type(kind, named)
    if kind in primitives:
        return primitives[kind]
    if kind in ("enum",):
        return T.StringType()
    if kind == "fixed":
        return T.BinaryType()
    if kind == "array":
        return T.ArrayType(_spark_type(schema["items"], named), True)
    if kind == "map":
        return T.MapType(T.StringType(), _spark_type(schema["values"], named), True)
    return T.StructType(
        [T.StructField(f["name"], _spark_type(f["type"], named), True) for f in schema["fields"]]
    )


def _registry_spec(registry: SchemaRegistry) -> dict[str, Any]:
    """A picklable description of ``registry`` that workers rebuild it from."""
    if isinstance(registry, MemorySchemaRegistry):
        schemas = {
            i: [s.text, s.schema_type, [[r.name, r.subject, r.version] for r in s.references]]
            for i, s in registry.typed_schemas().items()
        }
        return {"kind": "memory", "schemas": schemas, "subjects": registry.subjects()}
    if isinstance(registry, ConfluentSchemaRegistry):
        if registry.url.startswith("mock://"):
            raise ValueError("a mock:// registry lives in one process: Spark workers cannot see it")
        return {"kind": "confluent", "url": registry.url, "conf": dict(registry.conf)}
    from bolide.stores.schema_registry import SqlSchemaRegistry

    if isinstance(registry, SqlSchemaRegistry):
        url = registry.store.engine.url.render_as_string(hide_password=False)
        return {"kind": "sql", "url": url}
    raise TypeError(f"cannot ship a {type(registry).__name__} to Spark workers")


def serde_spec(serde: SchemaSerde, *, reader_schema: Any = None) -> dict[str, Any]:
    """A picklable description of ``serde`` that Spark's Python workers rebuild it from
    (``worker_serde``); ``reader_schema`` replaces an ``AvroSerde``'s own when given. A
    ``ProtobufSerde`` is rebuilt decode-only (classes from the registry), which is all a
    worker does.

    Raises:
        ValueError: The registry is confluent-kafka's in-process mock.
        TypeError: A registry that cannot be described, or a serde of another kind.
    """
    common = {
        "subject": serde.subject,
        "subject_name_strategy": serde.subject_name_strategy,
        "registry": _registry_spec(serde.registry),
    }
    if isinstance(serde, AvroSerde):
        return {
            "format": "AVRO",
            "schema": serde.schema,
            "reader_schema": reader_schema if reader_schema is not None else serde.reader_schema,
            **common,
        }
    if isinstance(serde, ProtobufSerde):
        return {"format": "PROTOBUF", "value_as": serde.value_as, **common}
    if isinstance(serde, JsonSchemaSerde):
        return {
            "format": "JSON",
            "schema": serde.schema.text,
            "references": [[r.name, r.subject, r.version] for r in serde.schema.references],
            "validate_decoded": serde.validate_decoded,
            **common,
        }
    raise TypeError(f"cannot ship a {type(serde).__name__} to Spark workers")


def _worker_registry(spec: dict[str, Any]) -> Any:
    kind = spec["kind"]
    if kind == "memory":
        schemas = {
            int(i): Schema(text, kind, tuple(SchemaReference(*r) for r in refs))
            for i, (text, kind, refs) in spec["schemas"].items()
        }
        return MemorySchemaRegistry(schemas, subjects=spec["subjects"])
    if kind == "confluent":
        return ConfluentSchemaRegistry(spec["url"], **spec["conf"])
    return spec["url"]


def _build(spec: dict[str, Any]) -> SchemaSerde:
    registry = _worker_registry(spec["registry"])
    kind = spec.get("format", "AVRO")
    strategy = spec.get("subject_name_strategy", "TopicNameStrategy")
    if kind == "PROTOBUF":
        return ProtobufSerde(
            registry=registry,
            subject=spec["subject"],
            value_as=spec["value_as"],
            subject_name_strategy=strategy,
        )
    if kind == "JSON":
        references = [SchemaReference(n, s, v) for n, s, v in spec["references"]]
        return JsonSchemaSerde(
            spec["schema"],
            registry=registry,
            subject=spec["subject"],
            references=references,
            validate_decoded=spec["validate_decoded"],
            subject_name_strategy=strategy,
        )
    return AvroSerde(
        spec["schema"],
        registry=registry,
        subject=spec["subject"],
        reader_schema=spec["reader_schema"],
        subject_name_strategy=strategy,
    )


def worker_serde(spec: dict[str, Any]) -> Any:
    """This worker process's serde for ``spec`` (``serde_spec``), built on first use."""
    key = json.dumps(spec, sort_keys=True)
    serde = _WORKER_SERDES.get(key)
    if serde is None:
        with _WORKER_LOCK:
            serde = _WORKER_SERDES.get(key)
            if serde is None:
                serde = _WORKER_SERDES[key] = _build(spec)
    return serde


def from_avro_udf(schema_or_serde: Any, *, stream: str = "spark", on_error: str = "raise") -> Any:
    """A pandas UDF decoding a binary column of Confluent-framed Avro into a struct column.

    Args:
        schema_or_serde: An ``AvroSerde`` (its registry resolves the schema ids; its reader
            schema, else its schema, shapes the result), or a schema, for a serde on the
            process-wide in-memory registry.
        stream: The stream named in decoding errors.
        on_error: ``"raise"`` fails the Spark task with the ``SerializationError``; ``"null"``
            gives a null value (all fields null for records) for payloads that do not decode.

    Returns:
        A ``pandas_udf`` to call on a binary column (``df.value``).

    Raises:
        ValueError: ``on_error`` is neither ``"raise"`` nor ``"null"``, or the registry is
            confluent-kafka's in-process mock.
    """
    if on_error not in ("raise", "null"):
        raise ValueError(f"on_error must be 'raise' or 'null', got {on_error!r}")
    from pyspark.sql import types as T
    from pyspark.sql.pandas.functions import pandas_udf

    if isinstance(schema_or_serde, AvroSerde):
        serde = schema_or_serde
    else:
        serde = AvroSerde(schema_or_serde)
    schema = serde.reader_schema or serde.schema
    spec = serde_spec(serde, reader_schema=schema)
    spark_type = avro_spark_type(schema)
    raise_errors = on_error == "raise"

    if isinstance(spark_type, T.StructType):
        names = [f.name for f in spark_type.fields]

        def decode_records(payloads: pd.Series) -> pd.DataFrame:
            values = _decode_all(payloads, spec, stream, raise_errors)
            rows = [v if v is not None else dict.fromkeys(names) for v in values]
            return pd.DataFrame.from_records(rows, columns=names)

        udf: Any = decode_records
    else:

        def decode_values(payloads: pd.Series) -> pd.Series:
            return pd.Series(_decode_all(payloads, spec, stream, raise_errors), dtype=object)

        udf = decode_values
    return pandas_udf(udf, returnType=spark_type)  # Spark infers the kind from the hints


def from_schema_udf(serde: SchemaSerde, *, stream: str = "spark", on_error: str = "raise") -> Any:
    """A pandas UDF decoding a binary column of any Confluent-framed format into a struct.

    Args:
        serde: An ``AvroSerde`` (as ``from_avro_udf``), a ``ProtobufSerde`` with its message
            class (the struct follows the message: ``bolide.facade.schemas.plain``), or a
            ``JsonSchemaSerde`` (the struct follows its schema's properties; what a column
            cannot type is a JSON string).
        stream: The stream named in decoding errors.
        on_error: ``"raise"`` or ``"null"``, as for ``from_avro_udf``.

    Raises:
        ValueError: ``on_error`` is unknown, the registry is confluent-kafka's mock, or a
            ``ProtobufSerde`` has no message class (nothing to shape the struct).
    """
    if isinstance(serde, AvroSerde):
        return from_avro_udf(serde, stream=stream, on_error=on_error)
    if on_error not in ("raise", "null"):
        raise ValueError(f"on_error must be 'raise' or 'null', got {on_error!r}")
    from pyspark.sql import types as T
    from pyspark.sql.pandas.functions import pandas_udf

    if isinstance(serde, ProtobufSerde):
        if serde.message_class is None:
            raise ValueError("from_schema_udf needs the ProtobufSerde's message class")
        shape = plain_schema(serde.message_class.DESCRIPTOR)
    elif isinstance(serde, JsonSchemaSerde):
        shape = json_plain_schema(json.loads(serde.schema.text))
    else:
        raise TypeError(f"serde must be a schema serde, not {type(serde).__name__}")
    spark_type: Any = _spark_type(shape, {})
    if not isinstance(spark_type, T.StructType):
        spark_type = T.StructType([T.StructField("value", spark_type, True)])
        shape = {"type": "record", "name": "value", "fields": [{"name": "value", "type": shape}]}
        wrap = True
    else:
        wrap = False
    spec = serde_spec(serde)
    names = [f.name for f in spark_type.fields]
    raise_errors = on_error == "raise"

    def decode_records(payloads: pd.Series) -> pd.DataFrame:
        worker = worker_serde(spec)
        rows = []
        for value in _decode_all(payloads, spec, stream, raise_errors):
            plain = None if value is None else worker.plain(value)
            plain = {"value": plain} if wrap and value is not None else plain
            rows.append(dict.fromkeys(names) if plain is None else _fit(plain, spark_type))
        return pd.DataFrame.from_records(rows, columns=names)

    udf: Any = decode_records
    return pandas_udf(udf, returnType=spark_type)  # Spark infers the kind from the hints


def _fit(value: Any, spark_type: Any) -> Any:
    """``value`` as ``spark_type`` holds it: structs by field, JSON text where a string is
    expected and something else came."""
    from pyspark.sql import types as T

    if value is None:
        return None
    if isinstance(spark_type, T.StructType):
        if not isinstance(value, dict):
            return None
        return {f.name: _fit(value.get(f.name), f.dataType) for f in spark_type.fields}
    if isinstance(spark_type, T.ArrayType):
        items = value if isinstance(value, list) else [value]
        return [_fit(v, spark_type.elementType) for v in items]
    if isinstance(spark_type, T.StringType) and not isinstance(value, str):
        return json.dumps(value, default=str, ensure_ascii=False)
    return value


def _decode_all(
    payloads: pd.Series, spec: dict[str, Any], stream: str, raise_errors: bool
) -> list[Any]:
    """Decode a batch in a worker; ``None`` for nulls, and for errors unless they raise."""
    worker = worker_serde(spec)
    values: list[Any] = []
    for data in payloads:
        if data is None:
            values.append(None)
            continue
        try:
            values.append(worker.decode(bytes(data), stream=stream))
        except SerializationError:
            if raise_errors:
                raise
            values.append(None)
    return values
