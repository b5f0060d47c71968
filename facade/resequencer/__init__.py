"""Resequencing: records of a sequence group released in sequence order, crash-safe."""

from bolide.facade.resequencer.core import (
    DeadLetterHandler,
    Reason,
    Resequencer,
    ResequencerMetrics,
    publish_sequence,
)

__all__ = ["DeadLetterHandler", "Reason", "Resequencer", "ResequencerMetrics", "publish_sequence"]
