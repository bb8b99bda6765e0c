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


def paired_difference(pairs: list[tuple[float, float]], resamples: int = 4000, seed: int = 0,
                      level: float = 0.95) -> tuple[float, float, float]:
    """Mean of a - b over paired samples [(a, b), ...] and its percentile-bootstrap interval (low, high):
    the samples are resampled with replacement `resamples` times (a fixed seed, so the page is stable).
    Returns (mean, low, high); a single pair has the interval of its own difference."""
    import numpy as np

    if not pairs:
        raise ValueError("pairs: at least one paired sample is required")
    diff = np.array([a - b for a, b in pairs], dtype=np.float64)
    picks = np.random.default_rng(seed).integers(0, len(diff), size=(resamples, len(diff)))
    means = diff[picks].mean(axis=1)
    tail = (1.0 - level) / 2
    return float(diff.mean()), float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def rank_sum_test(a: list[float], b: list[float]) -> float:
    """Two-sided p-value of the Wilcoxon rank-sum (Mann-Whitney U) test that samples `a` and `b` come
    from one distribution: the normal approximation with the tie correction (fine from ~20 per side).
    A small p says one sample tends to be larger (e.g. one kind of request answers faster)."""
    import numpy as np

    n, m = len(a), len(b)
    if n < 2 or m < 2:
        raise ValueError("a, b: at least two values each are required")
    values = np.concatenate([np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)])
    order = values.argsort(kind="stable")
    ranks = np.empty(n + m)
    ranks[order] = np.arange(1, n + m + 1)
    uniques, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    ranks = np.bincount(inverse, weights=ranks)[inverse] / counts[inverse]  # ties share their mean rank
    u = ranks[:n].sum() - n * (n + 1) / 2
    ties = float((counts ** 3 - counts).sum())
    variance = n * m / 12.0 * ((n + m + 1) - ties / ((n + m) * (n + m - 1)))
    if variance <= 0:
        return 1.0
    z = (u - n * m / 2.0) / math.sqrt(variance)
    return math.erfc(abs(z) / math.sqrt(2.0))
