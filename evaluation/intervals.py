"""95% confidence intervals for the results page: Wilson score intervals of a mean retention.

A sample's retention is the share of its gold answers kept (0 or 1 on single-answer tasks, steps of
1/4 or 1/5 on multi-answer ones). The interval treats the mean over n samples as a binomial
proportion: exact Wilson for 0/1 cells, a close, slightly conservative approximation otherwise.
Unlike a bootstrap it does not collapse to a point when every sample scores the same (10 of 10
kept is [72%, 100%], not [100%, 100%]).
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile


def wilson(mean: float, n: int, z: float = Z95) -> tuple[float, float]:
    """(low, high) of the Wilson score interval for a proportion `mean` in [0, 1] over n trials."""
    if n <= 0:
        raise ValueError(f"n: must be >= 1 (got {n})")
    if not 0.0 <= mean <= 1.0:
        raise ValueError(f"mean: must be within [0, 1] (got {mean})")
    z2 = z * z
    centre = (mean + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(mean * (1 - mean) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)
