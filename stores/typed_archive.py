"""The typed archive's public names, where docs/schemas.md and earlier releases import them from.

The code lives in ``bolide.stores.archive`` (writing) and ``bolide.stores.schema`` (naming).
"""

from bolide.facade.ports import TypedSerde
from bolide.stores.archive import RejectHandler, write_typed
from bolide.stores.schema import TYPED_TABLE_PREFIX, is_typed_table, typed_table_name

__all__ = [
    "TYPED_TABLE_PREFIX",
    "RejectHandler",
    "TypedSerde",
    "is_typed_table",
    "typed_table_name",
    "write_typed",
]
