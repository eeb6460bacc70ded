"""Choose the model-free drafter per call: prompt lookup, the shared n-gram pool (`drafters.pool`),
suffix drafting, or lookup continued by the pool, whichever's draft promises the most tokens per
unit of verification time right now.

Every source proposes before every call (each costs a few dictionary or table lookups), and each
proposal is scored against the tokens the target then emits, whichever source was picked: a
source's record is never starved by not being chosen. Lookup and suffix keep the share of right
guesses by match length, by whether their last guess was right, and by depth; the pool keeps one
per table entry. Each source's proposal becomes a chain of estimated reach (the product of its
tokens' estimated acceptance), priced under the target's measured verification curve by the gamma
policy's own rule (`AdaptiveGamma.best_prefix`): (1 + sum of reach) / (T(n+1)/T(1)) at the best
length n. The source with the best rate drafts (a source whose chain is a prefix of an earlier
one's adds nothing and is passed over); `source` names it, so the decode loop keeps an adaptive
policy for each source (`decode.Decoding.plan_policy`) that plans how many of its tokens a call
verifies from that source's running acceptance and cost. A prompt that the answer copies is
drafted by lookup, a request that repeats an earlier one by the pool (which remembers every
request's output), and the choice moves as the request goes on.

All sources are deterministic (q a point mass): the output is the target's distribution exactly.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import torch

from ..gamma import AdaptiveGamma
from ..sampling import SamplingParams
from .base import BaseDrafter, Draft
from .lookup import PromptLookupDrafter
from .pool import NgramPool, PoolDrafter

LOOKUP, POOL, SUFFIX, LOOKUP_POOL = "lookup", "pool", "suffix", "lookup+pool"
# the default choice: on Spec-Bench prompts lookup continued by the pool added nothing over the two
# apart, and suffix drafting indexes every token in Python; both are there to opt in
SOURCES = (LOOKUP, POOL)
ALL_SOURCES = (LOOKUP, POOL, SUFFIX, LOOKUP_POOL)
MIN_REACH = 0.1  # a token less likely than this to be reached never pays for its row: proposals stop there
# a flat verification curve for when no target's is measured (T(k)/T(1), k = 1..16)
GENERIC_CURVE = [0.0] + [1.0 + 0.1 * k for k in range(16)]


class GuessRecord:
    """Right guesses by key (match length, whether the source's last guess was right, depth), decayed:
    the chance that a guess with this key is right, drawn towards the chance at its depth while it
    has few scores of its own (and that one towards 1/2)."""

    def __init__(self, decay: float = 0.95, weight: float = 2.0) -> None:
        self.decay, self.weight = decay, weight
        self.hits: dict = {}
        self.tries: dict = {}

    def chance(self, key) -> float:
        depth = ("depth", key[-1])
        prior = (self.hits.get(depth, 0.0) + 1.0) / (self.tries.get(depth, 0.0) + 2.0)
        return (self.hits.get(key, 0.0) + self.weight * prior) / (self.tries.get(key, 0.0) + self.weight)

    def score(self, key, right: bool) -> None:
        for k in (key, ("depth", key[-1])):
            self.hits[k] = self.decay * self.hits.get(k, 0.0) + right
            self.tries[k] = self.decay * self.tries.get(k, 0.0) + 1


def _depth(i: int) -> int:
    """Depth classes of a drafted token: 0, 1, 2-3, 4-7, 8+."""
    return min(i, 8).bit_length()


def _length(n: int) -> int:
    """Classes of a match's length: 1, 2, 3, 4-7, 8-15, 16+."""
    return n if n < 4 else min(n, 16).bit_length() + 1


class AutoDrafter(BaseDrafter):
    """Picks one of `sources` (names from ALL_SOURCES) before every call, from each one's record and
    the verification cost its draft would take (see the module docstring).

    pool: the `NgramPool` shared with other requests (a private one by default); suffix_cache: the
    `SuffixCache` a "suffix" source shares; pricing: an `AdaptiveGamma` carrying the target's
    measured curve (`gamma.as_policy("auto", target)`), whose `best_prefix` prices each proposal
    (a generic flat curve by default); budget: the longest proposal priced (default: the pricing
    policy's max_gamma, the widest draft the loop plans).
    """

    vocab = None  # every source copies token ids it has seen (the target's)

    def __init__(self, pool: NgramPool | None = None, *, sources: Sequence[str] = SOURCES, suffix_cache=None,
                 pricing: AdaptiveGamma | None = None, budget: int | None = None) -> None:
        unknown = [s for s in sources if s not in ALL_SOURCES]
        if unknown or not sources:
            raise ValueError(f"unknown sources {unknown}: choose among {', '.join(ALL_SOURCES)}")
        self.sources = tuple(dict.fromkeys(sources))
        self.pricing = pricing.fresh() if pricing is not None else AdaptiveGamma(GENERIC_CURVE)
        self.budget = self.pricing.max_gamma if budget is None else budget
        if self.budget < 1:
            raise ValueError(f"budget must be >= 1, got {budget}")
        self.lookup = PromptLookupDrafter()
        self.pool = PoolDrafter(pool, min_reach=MIN_REACH)
        self.suffix = None
        if SUFFIX in self.sources:
            from .suffix import SuffixDrafter

            self.suffix = SuffixDrafter(suffix_cache, trees=False)
        self.record = {name: GuessRecord() for name in (LOOKUP, SUFFIX)}
        self.chosen: Counter = Counter()  # calls each source drafted, over this drafter's life
        self._forget()

    def _forget(self) -> None:
        self._choice: tuple[int, str, list[int], list[float]] | None = None  # (context length, source, tokens, reach)
        self._pending: list[tuple[str, int, list[int], list]] = []  # (record, position, tokens, keys) to score
        self._seen: list[int] = []
        self._last_right = {LOOKUP: None, SUFFIX: None}  # whether each source's latest scored guess was right

    def reset(self, params: SamplingParams, generator: torch.Generator | None) -> None:
        self._forget()
        for drafter in (self.lookup, self.pool, self.suffix):
            if drafter is not None:
                drafter.reset(params, generator)

    def begin(self, prompt: Sequence[int]) -> None:
        self.pool.begin(prompt)
        if self.suffix is not None:
            self.suffix.begin(prompt)

    def source(self, context: Sequence[int]) -> str:
        """The source that drafts after `context`: the one whose proposal prices best."""
        return self._choose(context)[1]

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        _, name, tokens, reach = self._choose(context)
        self.chosen[name] += bool(tokens) and gamma > 0
        return Draft(torch.tensor([tokens[:gamma]], dtype=torch.long).reshape(1, -1))

    # -- choosing --

    def _choose(self, context: Sequence[int]):
        if self._choice is not None and self._choice[0] == len(context) and self._same(context):
            return self._choice
        self._catch_up(context)
        pricing = self.pricing
        pricing.context_length = len(context)
        candidates = self.candidates(context)
        best, best_rate = None, 0.0
        for name in self.sources:
            tokens, reach = candidates[name]
            if best is not None and tokens and candidates[best][0][: len(tokens)] == tokens:
                continue  # the same tokens as a source before it, or fewer: nothing more to offer
            n, (expected, cost) = pricing.best_prefix(reach, len(reach))
            rate = expected / cost if n else 0.0
            if best is None or rate > best_rate:
                best, best_rate = name, rate
        self._choice = (len(context), best, *candidates[best])
        return self._choice

    def _same(self, context: Sequence[int]) -> bool:
        return len(context) == len(self._seen) and self._continues(context)

    def _continues(self, context: Sequence[int]) -> bool:
        """Whether `context` extends what was seen (checked at its first, middle and last token)."""
        seen, T = self._seen, len(self._seen)
        return len(context) >= T and all(context[i] == seen[i] for i in {0, T // 2, T - 1} if T)

    def _catch_up(self, context: Sequence[int]) -> None:
        """Score the sources' last proposals against what was emitted since."""
        if not self._continues(context):
            self._pending, self._seen = [], []
        seen, T = self._seen, len(self._seen)
        seen.extend(int(t) for t in context[T:])
        pending, self._pending = self._pending, []
        for name, position, tokens, keys in pending:
            record = self.record[name]
            for i, token in enumerate(tokens):
                if position + i >= len(seen):
                    self._pending.append((name, position + i, tokens[i:], keys[i:]))  # not emitted yet
                    break
                right = seen[position + i] == token
                record.score(keys[i], right)
                self._last_right[name] = right
                if not right:
                    break

    def candidates(self, context: Sequence[int]) -> dict[str, tuple[list[int], list[float]]]:
        """Each source's proposal after `context`: (tokens, each one's estimated reach)."""
        out: dict[str, tuple[list[int], list[float]]] = {}
        budget, position = self.budget, len(context)
        wanted = set(self.sources)
        ran_out = False
        if wanted & {LOOKUP, LOOKUP_POOL}:
            n, tokens = self.lookup.match(context, budget, extend=16)
            keys = [(_length(n), self._last_right[LOOKUP], _depth(i)) for i in range(len(tokens))]
            if tokens:
                self._pending.append((LOOKUP, position, tokens, keys))
            reach = _reach([self.record[LOOKUP].chance(k) for k in keys])
            ran_out = bool(tokens) and len(tokens) < budget and len(reach) == len(tokens)  # into the context's end
            out[LOOKUP] = (tokens[: len(reach)], reach)
        pool_tokens, pool_reach = self.pool.candidate(context, budget)
        out[POOL] = (pool_tokens, pool_reach)
        if self.suffix is not None:
            draft = self.suffix.propose(context, budget)
            tokens = draft.tokens[0].tolist()
            keys = [(0, self._last_right[SUFFIX], _depth(i)) for i in range(len(tokens))]
            if tokens:
                self._pending.append((SUFFIX, position, tokens, keys))
            reach = _reach([self.record[SUFFIX].chance(k) for k in keys])
            out[SUFFIX] = (tokens[: len(reach)], reach)
        if LOOKUP_POOL in wanted:
            tokens, reach = out[LOOKUP]
            if ran_out:  # the copy ran into the context's end, still likely: the pool goes on
                more, more_reach = self.pool.continuation(list(context[-self.pool.pool.orders[0]:]) + tokens,
                                                          budget - len(tokens), MIN_REACH / reach[-1])
                tokens, reach = tokens + more, reach + [reach[-1] * r for r in more_reach]
            out[LOOKUP_POOL] = (tokens, reach)
        return out


def _reach(chances: list[float]) -> list[float]:
    """Each token's chance of being reached, while it stays >= MIN_REACH."""
    reach, r = [], 1.0
    for c in chances:
        r *= c
        if r < MIN_REACH:
            break
        reach.append(r)
    return reach
