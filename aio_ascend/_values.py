"""What counts as a number in an argument, for every layer: the one rule for integers (sizes,
counts, ids, fields) and for seconds.

Integers: any integer type (``operator.index``: numpy's included, since sizes and counts are
often worked out from array shapes), never a bool (``True`` is an ``int`` to Python, and as a
size or a count it is always a mistake). Seconds: any real number, numpy's included, never a
bool; the caller checks the range.
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import cast

import numpy as np

__all__ = ["check_close_args", "integer", "seconds"]


def integer(what: str, value: object) -> int:
    """``value`` as an int (``TypeError`` naming ``what`` for a bool or a non-integer)."""
    if type(value) is int:
        return value
    if not isinstance(value, bool | np.bool_):
        try:
            return operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            pass
    raise TypeError(f"{what}: expected an int, got {type(value).__name__}")


def seconds(what: str, value: object) -> float:
    """``value`` as a float of seconds (``TypeError`` naming ``what`` for a bool or a
    non-number; the range is the caller's to check)."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a number of seconds, got {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:  # (an int past a float's range: as long as an infinite wait)
        return math.inf if cast(float, value) > 0 else -math.inf


def check_close_args(cancel: object, timeout: object) -> float | None:
    """The arguments of ``aclose`` (a stream's or a device's): a bool, and None or seconds
    (returned as a float)."""
    if not isinstance(cancel, bool):
        raise TypeError(f"cancel must be a bool, got {type(cancel).__name__}")
    if timeout is None:
        return None
    value = seconds("timeout (None or seconds)", timeout)
    if not value >= 0:  # NaN too
        raise ValueError(f"timeout={timeout!r} must be None or >= 0")
    return None if value == math.inf else value  # (no bound: as None)
