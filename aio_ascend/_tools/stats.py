"""Summary statistics shared by the bench, the demo and the plots."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["percentile"]


def percentile(values: Sequence[float] | npt.NDArray[np.float64], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, the nearest-rank sample; NaN when empty.

    ``numpy.percentile(..., method="nearest")``: the sample at rank ``round(q / 100 * (n - 1))``
    of the sorted values, ties to the even rank (as Python's ``round``).
    """
    if len(values) == 0:
        return float("nan")
    return float(np.percentile(np.asarray(values, dtype=np.float64), q, method="nearest"))
