"""Avro records: the fastavro serde with Confluent's wire format, and schema registries."""

from bolide.facade.avro.registry import (
    Compatibility,
    ConfluentSchemaRegistry,
    MemorySchemaRegistry,
    RegisteredSchema,
    SchemaRegistry,
)
from bolide.facade.avro.serde import MAGIC_BYTE, AvroSerde, default_registry, split_header

__all__ = [
    "MAGIC_BYTE",
    "AvroSerde",
    "Compatibility",
    "ConfluentSchemaRegistry",
    "MemorySchemaRegistry",
    "RegisteredSchema",
    "SchemaRegistry",
    "default_registry",
    "split_header",
]
