"""Summary statistics shared by the bench, the demo and the plots."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["cpu_ratio", "percentile"]


def percentile(values: Sequence[float] | npt.NDArray[np.float64], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, the nearest-rank sample; NaN when empty.

    ``numpy.percentile(..., method="nearest")``: the sample at rank ``round(q / 100 * (n - 1))``
    of the sorted values, ties to the even rank (as Python's ``round``).
    """
    if len(values) == 0:
        return float("nan")
    return float(np.percentile(np.asarray(values, dtype=np.float64), q, method="nearest"))


def cpu_ratio(c: dict[str, Any], a: dict[str, Any]) -> float:
    """Host CPU per launch of row ``c`` over row ``a``: the median of their per-round ratios
    where they were measured in the same rounds, else the ratio of their medians."""
    c_rounds, a_rounds = c.get("cpu_us_rounds"), a.get("cpu_us_rounds")
    if c_rounds and a_rounds and len(c_rounds) == len(a_rounds):
        return float(statistics.median([x / y for x, y in zip(c_rounds, a_rounds, strict=True)]))
    return float(c["cpu_us_per_launch"] / a["cpu_us_per_launch"])
