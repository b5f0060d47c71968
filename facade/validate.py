"""Argument checks shared by every config and constructor in bolide.

Each raises ``TypeError`` for a value of the wrong type and ``ValueError`` for one out of
range, naming the argument, and returns the value so a check can sit in an assignment.
``bool`` is refused wherever a number is wanted (``True`` is an ``int`` to Python, never a
count or a timeout to a user).
"""

from __future__ import annotations

__all__ = ["check_int", "check_seconds"]


def check_int(name: str, value: object, *, minimum: int = 0, maximum: int | None = None) -> int:
    """``value`` as an int within ``[minimum, maximum]``.

    Raises:
        TypeError: ``value`` is not an int (or is a bool).
        ValueError: ``value`` is out of range.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_seconds(name: str, value: object) -> float:
    """``value`` as a positive number of seconds (an int or a float).

    Raises:
        TypeError: ``value`` is not a number (or is a bool).
        ValueError: ``value`` is not above zero.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return float(value)
