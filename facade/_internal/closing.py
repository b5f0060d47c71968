"""``Closing``: the one context-manager shape every closeable bolide object shares."""

from __future__ import annotations

from typing import Self

__all__ = ["Closing"]


class Closing:
    """A base for objects released by ``close()``: ``with obj: ...`` closes them on exit."""

    __slots__ = ()

    def close(self) -> None:
        """Release what the object holds."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
