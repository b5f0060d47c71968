"""Schema formats in Confluent's wire format (Avro, Protobuf, JSON Schema), the registries that
number their schemas, and the compatibility checks those registries apply."""

from bolide.facade.schemas.avro import AvroSerde
from bolide.facade.schemas.base import SchemaSerde, default_registry
from bolide.facade.schemas.json_schema import JsonSchemaSerde
from bolide.facade.schemas.protobuf import ProtobufSerde
from bolide.facade.schemas.registry import (
    Compatibility,
    ConfluentSchemaRegistry,
    MemorySchemaRegistry,
    RegisteredSchema,
    Schema,
    SchemaReference,
    SchemaRegistry,
    TypedSchemaRegistry,
)

__all__ = [
    "AvroSerde",
    "Compatibility",
    "ConfluentSchemaRegistry",
    "JsonSchemaSerde",
    "MemorySchemaRegistry",
    "ProtobufSerde",
    "RegisteredSchema",
    "Schema",
    "SchemaReference",
    "SchemaRegistry",
    "SchemaSerde",
    "TypedSchemaRegistry",
    "default_registry",
]
