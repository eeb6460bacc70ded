"""Gamma policies: how many tokens the draft proposes in each iteration.

The decode loop asks a policy for a plan before every target call (`draft_length(room)`: a draft length
and whether to score a "shadow" proposal) and tells it what the call showed (`observe`). A fixed
gamma is the paper's setting; `AdaptiveGamma` re-plans every iteration.

Adaptive gamma. The paper picks one gamma from alpha and c (section 3.4) and assumes verifying
gamma+1 tokens costs one target step. Here both inputs are running estimates and verification
costs what the measured curve T(k)/T(1) says, so each iteration takes the hardware-aware optimum

    gamma* = argmax_g  E[tokens](alpha, g) / (g c + T(g+1)/T(1)),   E[tokens] = (1 - alpha^(g+1)) / (1 - alpha)

over g = 0..max_gamma (`formulas.optimal_gamma`). g = 0 (plain decoding) scores 1, so speculation
switches itself off when no gamma can win. While it is off the loop keeps scoring the drafter's
would-be proposal against the target's distribution ("shadow" drafting, nearly free for a cheap
drafter), so it switches back on when the drafter becomes useful again (for instance when the
output starts copying). A policy changes only how many tokens are proposed, never how they are
verified: the output distribution is the target's whatever it plans.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from . import defaults
from .formulas import expected_tokens, optimal_gamma, verify_curve
from .checks import check_gamma


class GammaPolicy(Protocol):
    """What the decode loop asks of a policy."""

    max_gamma: int  # the widest draft it plans (a draft tree is drafted to this, then cut by tree_size)
    context_length: int  # set by the loop before each plan: verifying rows costs more as the context grows
    forecast: tuple[float, float] | None  # what the last plan expects of its call: (tokens, cost in steps)
    sizes_trees: bool  # tree_size cuts a tree by its nodes' estimated reach

    def draft_length(self, room: int) -> tuple[int, bool]:
        """(draft length in 0..room, whether to score a one-token shadow proposal when it is 0)."""

    def shadow(self) -> bool:
        """With a draft length imposed from outside (a batch's plan) of 0: score a shadow proposal now?"""

    def tree_size(self, reach: Sequence[float], limit: int) -> int:
        """How many of a draft tree's nodes (best first, each with its estimated reach) to verify."""

    def observe(self, betas: Sequence[float], verified: int, target_seconds: float, draft_seconds: float,
                drafted: int, check_seconds: float = 0.0, checked: int = 0) -> None:
        """One iteration after the prefill: acceptance probabilities seen, tokens verified in the
        target call, what the call and the drafting cost, how many tokens were drafted, and the part
        of the call spent turning its logits into tokens (controls, grammar masks, verification),
        `check_seconds`, with the draft tokens it verified, `checked`."""

    def observe_tree(self, predicted: float, accepted: int) -> None:
        """A verified tree: the summed reach of its nodes, and the depth the target accepted."""


POLICY_MEMBERS = ("max_gamma", "context_length", "forecast", "sizes_trees", "draft_length", "shadow", "tree_size",
                  "observe", "observe_tree")


class FixedGamma:
    """The paper's setting: the same gamma every iteration (fewer only near the length limit). It
    predicts nothing (`forecast` None), never shadows, and verifies a tree whole."""

    forecast = None
    sizes_trees = False

    def __init__(self, gamma: int) -> None:
        self.gamma = self.max_gamma = check_gamma(gamma)
        self.context_length = 0

    def draft_length(self, room: int) -> tuple[int, bool]:
        return min(self.gamma, room), False

    def shadow(self) -> bool:
        return False

    def tree_size(self, reach, limit: int) -> int:
        return min(len(reach), limit)

    def observe(self, betas, verified, target_seconds, draft_seconds, drafted, check_seconds=0.0, checked=0) -> None:
        pass

    def observe_tree(self, predicted, accepted) -> None:
        pass


AUTO = "auto"


def as_policy(gamma: "int | str | GammaPolicy", target=None, max_gamma: int = defaults.MAX_GAMMA) -> GammaPolicy:
    """An integer becomes a FixedGamma, "auto" an AdaptiveGamma fed by the target's measured
    verification curve (profiled once per machine and kernel build, then cached), and a policy is
    used as it is."""
    if hasattr(gamma, "draft_length"):
        missing = [name for name in POLICY_MEMBERS if not hasattr(gamma, name)]
        if missing:
            raise TypeError(f"{type(gamma).__name__} is not a gamma policy: it lacks {', '.join(missing)}")
        return gamma
    if gamma == AUTO:
        if target is None:
            raise ValueError("gamma 'auto' needs the target whose verification cost it measures")
        from .models.profile import profile_model

        profile = profile_model(target)
        return AdaptiveGamma(profile.verify_ratios, max_gamma=max_gamma, profile_context=profile.context,
                             position_cost=profile.row_position_seconds / profile.step_seconds,
                             step_seconds=profile.step_seconds, learn_curve=True)
    return FixedGamma(gamma)


class AdaptiveGamma:
    """Running estimates of alpha (acceptance) and c (draft cost ratio) feeding the cost model above.

    verify_ratios: T(k)/T(1) for k = 1..K (entry 0 unused), e.g. `Profile.verify_ratios`, measured
    after `profile_context` cached positions.
    position_cost: what one new row costs per further cached position (its attention), in units of
    that T(1) (`Profile.row_position_seconds / step_seconds`). With it the curve follows the
    context: at L cached positions a forward over k rows costs (T(k) + k e) / (T(1) + e) steps with
    e = position_cost (L - profile_context), so long prompts verify fewer rows. The decode loop sets
    `context_length` before each plan.
    decay: weight of the past in the exponential moving averages (per observed position).
    step_seconds: T(1) as measured beforehand (the profile's), so that the first drafting call
    already prices the draft: the first cost observed replaces the prior cost, and a draft that
    costs more than it brings stops after one call, not after the average has crept up to it.

    A draft token costs its drafting (`cost_ratio`, c) and its checking (`check_cost`): turning a
    further logits row into tokens (the controls, the residual and the draws of speculative
    sampling) beyond what a plain call spends on its one row, measured apart from the forward. It is
    next to nothing when greedy and a tenth of a small model's step when sampling over a large
    vocabulary; the profile's T(k) holds the forward alone. The plan prices a token at their sum,
    `token_cost`.

    learn_curve: also time the target's calls by their rows and let what they measure take over
    from `verify_ratios` as calls of each size come (a profile taken while the machine was busy, or
    at another context length, would otherwise price verification wrongly for good). Off for
    callers that hand in a curve to be used as it is (the tests' simulated clocks).
    """

    sizes_trees = True

    def __init__(self, verify_ratios: Sequence[float], max_gamma: int = defaults.MAX_GAMMA, prior_alpha: float = 0.5,
                 prior_cost: float = 0.0, decay: float = 0.9, shadow_budget: float = 0.01,
                 position_cost: float = 0.0, profile_context: int = 256, step_seconds: float | None = None,
                 learn_curve: bool = False) -> None:
        if max_gamma < 1:
            raise ValueError(f"max_gamma must be >= 1, got {max_gamma}")
        if not (0.0 <= prior_alpha <= 1.0):
            raise ValueError(f"prior_alpha must be in [0, 1], got {prior_alpha}")
        if not (0.0 < decay < 1.0):
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        self._priors = (prior_alpha, prior_cost)
        self.verify_ratios = list(verify_ratios)
        self._curve = verify_curve(verify_ratios)  # k -> T(k)/T(1) after profile_context positions
        self.position_cost, self.profile_context = max(0.0, position_cost), profile_context
        self.context_length = profile_context
        self.max_gamma = max_gamma
        self.alpha = prior_alpha
        self.cost_ratio = prior_cost
        self.decay = decay
        self.shadow_budget = shadow_budget
        self._since_shadow = 0
        self._iterations = 0
        self._measured_step = step_seconds
        self.step_seconds: float | None = step_seconds  # running estimate of T(1)
        self._cost_seen = False  # whether a drafting call has priced the draft yet
        self.check_cost = 0.0  # checking one more draft token, in one-token steps (measured)
        self._plain_check: float | None = None  # seconds a call without draft tokens spends checking
        self._check_seen = False
        self.learn_curve = learn_curve
        self._calls: dict[int, tuple[float, int]] = {}  # rows -> (running forward seconds, calls seen)
        # draft trees: how the drafter's estimates of reaching its nodes compare with what the target
        # accepted (running sums; the prior says half)
        self._tree_accepted, self._tree_predicted = 1.0, 2.0
        # what the last plan (or tree_size) expects of its call: (tokens, cost in one-token steps,
        # drafting included); their sums over a run give the speedup the model predicted for it
        self.forecast: tuple[float, float] = (1.0, 1.0)

    def fresh(self) -> "AdaptiveGamma":
        """The same cost model (curve, bounds, priors) with its running estimates back at the priors:
        one for each new request, from a target's measured template."""
        return AdaptiveGamma(self.verify_ratios, self.max_gamma, *self._priors, decay=self.decay,
                             shadow_budget=self.shadow_budget, position_cost=self.position_cost,
                             profile_context=self.profile_context, step_seconds=self._measured_step,
                             learn_curve=self.learn_curve)

    def verify_cost(self, k: int) -> float:
        """T(k)/T(1) at the current context length."""
        extra = self.position_cost * max(0, self.context_length - self.profile_context)
        profiled = (self._curve(k) + k * extra) / (1 + extra)
        if k == 1 or k not in self._calls or 1 not in self._calls:
            return profiled
        (seconds, n), (one, _) = self._calls[k], self._calls[1]
        weight = min(n, 20)  # a first measurement moves the profile's figure a third of the way
        return (weight * max(1.0, seconds / one) + 2 * profiled) / (weight + 2)

    def tree_size(self, reach: Sequence[float], limit: int) -> int:
        """How many of a draft tree's nodes to verify. `reach` holds each node's estimated chance of
        being reached, best first (so any prefix is a tree): the n maximising expected tokens per
        unit time, (1 + k sum_{i<n} reach_i) / (T(n+1)/T(1) + n c), k calibrating the estimates
        against the accepted depths seen so far, c the drafting cost per node. n = 0 (plain
        decoding) scores 1. A chain is the case of a tree with one child a node, whose reach is
        alpha^depth."""
        best_n, self.forecast = self.best_prefix(reach, limit, self._tree_accepted / self._tree_predicted)
        return best_n

    def best_prefix(self, reach: Sequence[float], limit: int,
                    calibration: float = 1.0) -> tuple[int, tuple[float, float]]:
        """`tree_size`'s choice with the estimates scaled by `calibration` (1: taken as they are):
        (n, (expected tokens, cost in one-token steps)) of the best prefix; (0, (1, 1)) when none pays.
        Also what a drafter that chooses among its sources (`drafters.auto`) prices each one's draft by."""
        best_n, best, total, forecast = 0, 1.0, 0.0, (1.0, 1.0)
        for n in range(1, min(len(reach), limit, len(self.verify_ratios) - 2) + 1):
            total += reach[n - 1]
            tokens, cost = 1 + calibration * total, self.verify_cost(n + 1) + n * self.token_cost
            if tokens / cost > best:
                best_n, best, forecast = n, tokens / cost, (tokens, cost)
        return best_n, forecast

    def observe_tree(self, predicted: float, accepted: int) -> None:
        """A verified tree: the summed reach of its nodes, and the depth the target accepted."""
        self._tree_accepted = self.decay * self._tree_accepted + accepted
        self._tree_predicted = self.decay * self._tree_predicted + predicted

    def choose(self, limit: int) -> int:
        """The best gamma in 0..min(max_gamma, limit)."""
        gamma, rate = optimal_gamma(self.alpha, self.token_cost, min(self.max_gamma, limit), self.verify_cost)
        tokens = expected_tokens(self.alpha, gamma) if gamma else 1.0
        self.forecast = (tokens, tokens / rate)
        return gamma

    def draft_length(self, room: int) -> tuple[int, bool]:
        gamma = self.choose(room)
        return gamma, gamma == 0 and room > 0 and self.shadow()

    def shadow(self) -> bool:
        """Whether to score the drafter while speculation is off. A probe costs c (`cost_ratio`) of a
        step, catching up on the tokens since the last one included, and buys one fresh sample of
        alpha, so the drafter is probed every ceil(c / shadow_budget) iterations: every one for a
        drafter as cheap as prompt lookup, rarely for a draft model, and the probes never cost more
        than `shadow_budget` of a step on average, so a draft that does not pay costs next to nothing."""
        self._since_shadow += 1
        if self._since_shadow * self.shadow_budget >= self.cost_ratio:
            self._since_shadow = 0
            return True
        return False

    @property
    def token_cost(self) -> float:
        """What one draft token costs, in one-token steps: drafting it and checking it."""
        return self.cost_ratio + self.check_cost

    def observe(self, betas: Sequence[float], verified: int, target_seconds: float, draft_seconds: float,
                drafted: int, check_seconds: float = 0.0, checked: int = 0) -> None:
        for beta in betas:
            self.alpha = self.decay * self.alpha + (1 - self.decay) * beta
        self._iterations += 1
        if self._iterations > 1:  # the first call after the prefill still pays warm-up costs: not a typical step
            if self.learn_curve:  # the forward alone, by its rows
                forward = target_seconds - check_seconds
                seconds, n = self._calls.get(verified, (forward, 0))
                self._calls[verified] = (_running(seconds, forward, n > 0), n + 1)
            step = target_seconds / self.verify_cost(verified)  # this call, in units of one-token steps
            self.step_seconds = _running(self.step_seconds, step)
        if drafted and self.step_seconds is not None:
            c = draft_seconds / drafted / self.step_seconds
            self.cost_ratio = _running(self.cost_ratio, c, self._cost_seen)
            self._cost_seen = True
        if not checked:
            self._plain_check = _running(self._plain_check, check_seconds)
        elif self.step_seconds is not None:  # before a plain call is seen, all its checking is the drafts'
            extra = max(0.0, check_seconds - (self._plain_check or 0.0)) / checked / self.step_seconds
            self.check_cost = _running(self.check_cost, extra, self._check_seen)
            self._check_seen = True


def _running(mean: float | None, value: float, seen: bool = True) -> float:
    """A running mean's next value, 0.2 on the newest; `value` itself where none was seen yet."""
    return 0.8 * mean + 0.2 * value if seen and mean is not None else value


def draft_lengths(policies: Sequence[GammaPolicy], rooms: Sequence[int], verify_cost,
                  other_rows: int = 0) -> list[int | None]:
    """Every request's draft length for one batched target call (continuous batching), under the
    cost model of `AdaptiveGamma` taken over the batch's rows: maximise

        sum_i E[tokens](alpha_i, g_i) / (T(R)/T(1) + sum_i g_i c_i),   R = sum_i (g_i + 1),

    E[tokens](alpha, g) = 1 + alpha + ... + alpha^g (the paper's (1 - alpha^(g+1)) / (1 - alpha)),
    with `verify_cost(R)` = T(R)/T(1) of the target and c_i the request's draft cost ratio (its
    drafting runs serially), and `other_rows` rows (prompt pieces) sharing the forward. Requests
    whose policy is not adaptive keep their own plan (None).

    Each extra draft token of request i adds alpha_i^(g_i+1) expected tokens, less for each further
    one, so the best allocation of any number of extra rows takes the largest such gains first;
    the best total is then found by walking that order. All zeros (plain batched decoding) is among
    the candidates: speculation turns off where the batch is already compute-bound."""
    adaptive = [i for i, p in enumerate(policies) if isinstance(p, AdaptiveGamma)]
    plan: list[int | None] = [None if i not in adaptive else 0 for i in range(len(policies))]
    fixed_rows = sum(1 + min(getattr(p, "gamma", 0), r) for p, r in zip(policies, rooms)
                     if not isinstance(p, AdaptiveGamma))
    gains = []  # (marginal expected tokens, request, draft cost)
    for i in adaptive:
        p = policies[i]
        for g in range(min(p.max_gamma, rooms[i])):
            gains.append((p.alpha ** (g + 1), i, p.token_cost))
    gains.sort(key=lambda item: (-item[0], item[2]))
    rows = other_rows + fixed_rows + len(adaptive)
    tokens, drafting = float(len(policies)), 0.0  # a fixed-gamma request counted at its one sure token
    best, best_k = tokens / (verify_cost(rows) + drafting), 0
    for k, (gain, _, cost) in enumerate(gains, 1):
        tokens, drafting, rows = tokens + gain, drafting + cost, rows + 1
        rate = tokens / (verify_cost(rows) + drafting)
        if rate > best:
            best, best_k = rate, k
    for _, i, _ in gains[:best_k]:
        plan[i] += 1
    return plan
