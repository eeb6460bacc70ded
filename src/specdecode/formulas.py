"""The paper's analysis (Leviathan, Kalman, Matias 2023, section 3), as plain functions.

paper   code          meaning
alpha   alpha         expected acceptance rate, E[beta] with beta = sum_x min(p(x), q(x)) = 1 - D_LK(p, q)
gamma   gamma         draft tokens per iteration
c       cost_ratio    time of one draft step / time of one target step
c_hat   ops_ratio     the same ratio in arithmetic operations (for the operations-increase formula)
T(k)    verify_cost   time of one target forward over k tokens / time of one target step (the paper
                      assumes 1 for every k <= gamma+1; measured, it is not)

Pure functions of numbers: the decode loop's gamma policies use them, and so do the analysis tools.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from .verify import acceptance


def _check(alpha: float, gamma: int) -> None:
    if not (0.0 <= alpha <= 1.0) or math.isnan(alpha):
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if gamma < 0 or int(gamma) != gamma:
        raise ValueError(f"gamma must be an integer >= 0, got {gamma}")


def d_lk(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """D_LK(p, q) = 1 - sum_x min(p(x), q(x)) (Definition 3.3); [..., V] -> [...]."""
    return 1.0 - acceptance(target_probs, draft_probs)


def expected_tokens(alpha: float, gamma: int) -> float:
    """E[tokens per iteration] = (1 - alpha^(gamma+1)) / (1 - alpha) (Equation 1)."""
    _check(alpha, gamma)
    if alpha == 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def _check_ratio(name: str, value: float) -> None:
    if not value >= 0:  # NaN fails too
        raise ValueError(f"{name} must be >= 0, got {value}")


def speedup(alpha: float, gamma: int, cost_ratio: float) -> float:
    """Expected walltime improvement (Theorem 3.8): (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)).

    Assumes verifying gamma+1 tokens costs one target step (enough parallel compute).
    """
    _check_ratio("cost ratio c", cost_ratio)
    return expected_tokens(alpha, gamma) / (gamma * cost_ratio + 1.0)


def operations_increase(alpha: float, gamma: int, ops_ratio: float) -> float:
    """Expected factor of arithmetic operations (Theorem 3.11):
    (1 - alpha)(gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1)), with c_hat = `ops_ratio`."""
    _check_ratio("operations ratio c_hat", ops_ratio)
    return (gamma * ops_ratio + gamma + 1.0) / expected_tokens(alpha, gamma)


def hardware_speedup(alpha: float, gamma: int, cost_ratio: float,
                     verify_cost: Callable[[int], float] | Sequence[float]) -> float:
    """Speedup when verifying k tokens costs T(k)/T(1) target steps rather than 1:
    E[tokens] / (gamma c + T(gamma+1)/T(1)).

    `verify_cost(k)` (or a sequence indexed by k, with entry 0 unused) gives T(k)/T(1); the
    paper's formula is the special case T(k) = T(1).
    """
    _check_ratio("cost ratio c", cost_ratio)
    cost = verify_cost(gamma + 1) if callable(verify_cost) else verify_curve(verify_cost)(gamma + 1)
    return expected_tokens(alpha, gamma) / (gamma * cost_ratio + cost)


def verify_curve(ratios: Sequence[float]) -> Callable[[int], float]:
    """T(k)/T(1) from measured ratios[k] (k = 1..K), extended linearly past K."""
    ratios = list(ratios)
    if len(ratios) < 2:
        raise ValueError("need measured ratios for at least k = 1")
    last = len(ratios) - 1
    slope = (ratios[last] - ratios[last - 1]) if last >= 2 else 0.0

    def cost(k: int) -> float:
        if k <= last:
            return ratios[k]
        return ratios[last] + slope * (k - last)

    return cost


def optimal_gamma(alpha: float, cost_ratio: float, max_gamma: int = 64,
                  verify_cost: Callable[[int], float] | Sequence[float] | None = None) -> tuple[int, float]:
    """The integer gamma in 0..max_gamma that maximises the expected speedup, and that speedup.

    gamma = 0 (speedup 1, plain decoding) wins when no gamma helps.
    """
    best = (0, 1.0)
    for gamma in range(1, max_gamma + 1):
        s = (speedup(alpha, gamma, cost_ratio) if verify_cost is None
             else hardware_speedup(alpha, gamma, cost_ratio, verify_cost))
        if s > best[1]:
            best = (gamma, s)
    return best
