"""The dead-letter workbench: list, show, replay and purge the dead letters of a stream.

The names live in ``bolide.stores.deadletters.letters``; this package names them."""

from bolide.stores.deadletters.letters import (
    DeadLetter,
    DeadLetters,
)

__all__ = [
    "DeadLetter",
    "DeadLetters",
]
