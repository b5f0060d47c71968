"""The workarounds for brokers that deviate from Apache Kafka, where the stores and the Spark
source have always imported them: they live in ``bolide.facade.kafka.compat``."""

from bolide.facade.kafka.compat import (
    FetchGaps,
    confirm_ends,
    confirm_time_offsets,
    stale_watermarks,
)

__all__ = ["FetchGaps", "confirm_ends", "confirm_time_offsets", "stale_watermarks"]
