"""Adaptive gamma: per iteration, the draft length that maximises expected tokens per unit time.

The paper picks one gamma from alpha and c (section 3.4) and assumes verifying gamma+1 tokens
costs one target step. Here both inputs are running estimates and verification costs what the
measured curve T(k)/T(1) says, so each iteration takes

    gamma* = argmax_g  E[tokens](alpha, g) / (g c + T(g+1)/T(1)),   E[tokens] = (1 - alpha^(g+1)) / (1 - alpha)

over g = 0..max_gamma. g = 0 (plain decoding) scores 1, so speculation switches itself off when
no gamma can win. While it is off the loop keeps scoring the drafter's would-be proposal against
the target's distribution ("shadow" drafting, nearly free for a cheap drafter), so it switches
back on when the drafter becomes useful again (for instance when the output starts copying).
"""

from __future__ import annotations

from typing import Sequence

from .analysis.formulas import expected_tokens, verify_curve


class AdaptiveGamma:
    """Running estimates of alpha (acceptance) and c (draft cost) feeding the cost model above.

    verify_ratios: T(k)/T(1) for k = 1..K (entry 0 unused), e.g. `Profile.verify_ratios`.
    decay: weight of the past in the exponential moving averages (per observed position).
    """

    def __init__(self, verify_ratios: Sequence[float], max_gamma: int = 8, prior_alpha: float = 0.5,
                 prior_cost: float = 0.0, decay: float = 0.9, shadow_cost_limit: float = 0.2,
                 probe_every: int = 16) -> None:
        if max_gamma < 1:
            raise ValueError(f"max_gamma must be >= 1, got {max_gamma}")
        if not (0.0 <= prior_alpha <= 1.0):
            raise ValueError(f"prior_alpha must be in [0, 1], got {prior_alpha}")
        if not (0.0 < decay < 1.0):
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        self.cost = verify_curve(verify_ratios)
        self.max_gamma = max_gamma
        self.alpha = prior_alpha
        self.cost_ratio = prior_cost
        self.decay = decay
        self.shadow_cost_limit = shadow_cost_limit
        self.probe_every = probe_every
        self._since_shadow = 0
        self._iterations = 0
        self.step_seconds: float | None = None  # running estimate of T(1)

    def expected_rate(self, gamma: int) -> float:
        """Expected tokens per T(1) of time at draft length gamma."""
        return expected_tokens(self.alpha, gamma) / (gamma * self.cost_ratio + self.cost(gamma + 1))

    def choose(self, limit: int) -> int:
        """The best gamma in 0..min(max_gamma, limit)."""
        best, best_rate = 0, self.expected_rate(0)
        for gamma in range(1, min(self.max_gamma, limit) + 1):
            rate = self.expected_rate(gamma)
            if rate > best_rate:
                best, best_rate = gamma, rate
        return best

    def shadow(self) -> bool:
        """Whether to score the drafter while speculation is off: every iteration if that is cheap,
        else every `probe_every` iterations, so a stale estimate of alpha or c can still recover."""
        self._since_shadow += 1
        if self.cost_ratio <= self.shadow_cost_limit or self._since_shadow >= self.probe_every:
            self._since_shadow = 0
            return True
        return False

    def observe(self, betas: Sequence[float], verified: int, target_seconds: float, draft_seconds: float,
                drafted: int) -> None:
        """One iteration: acceptance probabilities seen, tokens verified, and what it cost."""
        for beta in betas:
            self.alpha = self.decay * self.alpha + (1 - self.decay) * beta
        self._iterations += 1
        if self._iterations == 1:  # the prefill: both models read the whole prompt, nothing like a step
            return
        step = target_seconds / self.cost(verified)  # this call, in units of one-token steps
        self.step_seconds = step if self.step_seconds is None else 0.8 * self.step_seconds + 0.2 * step
        if drafted:
            c = draft_seconds / drafted / self.step_seconds
            self.cost_ratio = 0.8 * self.cost_ratio + 0.2 * c
