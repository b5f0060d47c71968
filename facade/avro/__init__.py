"""Avro records: the serde in Confluent's wire format and the schema registries (the modules
live in ``bolide.facade.schemas`` beside the other formats; this package keeps their names)."""

from bolide.facade.schemas.avro import MAGIC_BYTE, AvroSerde, default_registry, split_header
from bolide.facade.schemas.registry import (
    Compatibility,
    ConfluentSchemaRegistry,
    MemorySchemaRegistry,
    RegisteredSchema,
    SchemaRegistry,
)

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
