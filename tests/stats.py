"""Goodness-of-fit helper for the statistical losslessness tests."""

from __future__ import annotations

from collections import Counter

from scipy.stats import chisquare


def chi2_pvalue(samples, probs: dict, min_expected: float = 5.0) -> float:
    """p-value of Pearson's chi-square test that `samples` were drawn from `probs`.

    Outcomes with an expected count below `min_expected` are pooled into one bin. An outcome
    with probability zero that was observed makes the p-value 0: that can never happen when
    the sampler is right.
    """
    counts = Counter(samples)
    n = sum(counts.values())
    if any(probs.get(outcome, 0.0) <= 0.0 for outcome in counts):
        return 0.0
    observed, expected = [], []
    pooled_obs = pooled_exp = 0.0
    for outcome, p in probs.items():
        if n * p >= min_expected:
            observed.append(counts.get(outcome, 0))
            expected.append(n * p)
        else:
            pooled_obs += counts.get(outcome, 0)
            pooled_exp += n * p
    if pooled_exp > 0:
        observed.append(pooled_obs)
        expected.append(pooled_exp)
    total = sum(expected)
    expected = [e * n / total for e in expected]  # exact sum: probs may miss float rounding
    return float(chisquare(observed, expected).pvalue)
