"""Validators for values that arrive from outside (config, provider usage, count envelopes).

One definition of "an integer": an ``int`` that is not a ``bool`` (``True`` is an ``int``
to Python, never a count to us). The predicates are ``TypeGuard``s, so a checked value
needs no cast afterwards.
"""

from __future__ import annotations

import math
from typing import TypeGuard

__all__ = ("int_at_least", "is_int", "is_number")


def is_int(value: object) -> TypeGuard[int]:
    """An ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    """A finite ``int`` or ``float`` that is not a ``bool``."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def int_at_least(value: object, low: int) -> int | None:
    """``value`` when it is an integer (see ``is_int``) of at least ``low``, else None."""
    return value if is_int(value) and value >= low else None
