"""Sampling settings turned into the adjusted distribution both models are compared under.

Leviathan et al. (2023), section 2.3: greedy, temperature, top-k and top-p sampling are all
"standard sampling from an adjusted distribution". Speculative sampling stays exact for any of
them as long as the target's and the draft's logits go through the *same* transform before
they are compared, which is what `SamplingParams.probs` is for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How a token is drawn from logits.

    temperature: 0 means greedy; otherwise logits are divided by it.
    top_k: keep the k most likely tokens (0 = no limit).
    top_p: keep the smallest set of most likely tokens whose mass reaches top_p (1 = no limit).
    greedy: a point mass on the argmax (ties go to the lowest token id).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    greedy: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or math.isnan(self.temperature):
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if self.temperature < 0 or math.isinf(self.temperature):
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = no limit), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.temperature == 0 and not self.greedy:
            object.__setattr__(self, "greedy", True)

    @property
    def is_greedy(self) -> bool:
        return self.greedy

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Adjusted distribution: logits [..., V] -> float32 probabilities [..., V]."""
        if logits.dim() == 0 or logits.shape[-1] == 0:
            raise ValueError(f"logits must have a non-empty last (vocabulary) dimension, got shape {tuple(logits.shape)}")
        logits = logits.float()
        check_logits(logits)
        if self.greedy:
            # argmax returns the first maximal index: ties are broken towards the lowest id.
            return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
        # shifted so the best token sits at 0 before dividing, and a temperature below float32's
        # smallest normal taken as that: a tiny temperature sends the others to -inf (a point mass on
        # the best, uniform over exact ties), never inf - inf or 0 / 0 = NaN
        temperature = max(self.temperature, torch.finfo(torch.float32).tiny)
        logits = (logits - logits.amax(-1, keepdim=True)) / temperature
        if self.top_k and self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k, dim=-1).values[..., -1:]  # [..., 1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if self.top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            mass_before = sorted_probs.cumsum(-1) - sorted_probs  # mass of strictly better tokens
            drop_sorted = mass_before >= self.top_p
            drop_sorted[..., 0] = False  # the most likely token never (a top_p below float32's range rounds to 0)
            drop = drop_sorted.scatter(-1, order, drop_sorted)
            probs = probs.masked_fill(drop, 0.0)
            probs = probs / probs.sum(-1, keepdim=True)
        return probs


def check_logits(logits: torch.Tensor) -> None:
    """-inf marks a token a model cannot emit (probability 0, e.g. outside a draft's reduced
    vocabulary); NaN, +inf, or a row with every token at -inf make the output unusable."""
    top = logits.amax(-1)  # one pass: NaN propagates through max, +inf and all -inf show in it
    if torch.isfinite(top).all():
        return
    if torch.isnan(top).any():
        raise ValueError("logits contain NaN values; the model's output is not usable")
    if torch.isposinf(top).any():
        raise ValueError("logits contain infinite values; the model's output is not usable")
    raise ValueError("logits are -inf for every token; the model's output is not usable")


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row: probs [..., V] -> token ids [...] (int64).

    Inverse-CDF sampling: one uniform per row against the cumulative distribution (in float64, so
    rounding cannot shift mass between tokens). Over a 49k vocabulary this takes tens of
    microseconds where torch.multinomial takes most of a millisecond. A token with zero
    probability is never drawn: its CDF step is flat, and the search returns the first index
    whose CDF exceeds the uniform.
    """
    flat = probs.reshape(-1, probs.shape[-1]).double()  # [N, V]
    cdf = flat.cumsum(-1)  # [N, V]
    u = torch.rand(flat.shape[0], 1, generator=generator, dtype=torch.float64, device=flat.device) * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, u, right=True)  # [N, 1]
    # u rounding up to the total (odds ~1e-16) would run off the end: take the last token with mass.
    last = torch.searchsorted(cdf, cdf[:, -1:].contiguous(), right=False)  # [N, 1]
    return torch.minimum(tokens, last).reshape(probs.shape[:-1])


def sample_distinct(probs: torch.Tensor, k: int, generator: torch.Generator | None = None) -> list[int]:
    """Up to k distinct tokens from probs [V], in the order of drawing one after another without
    replacement (each draw from probs renormalised over the tokens not yet drawn). Exponential
    races: token x finishes at E_x / p(x) with E_x ~ Exp(1); the finishing order is that sequence
    of draws. Tokens with zero probability never finish, so fewer than k may come back."""
    u = torch.rand(probs.shape, generator=generator, dtype=torch.float64, device=probs.device)  # [V]
    times = torch.where(probs > 0, -torch.log1p(-u) / probs.double(), torch.full_like(u, math.inf))  # [V]
    k = min(k, int((probs > 0).sum()))
    return torch.topk(times, k, largest=False).indices.tolist() if k else []


def draw(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row straight from logits [..., V] -> [...]: `sample(params.probs(logits))`,
    except that greedy takes the argmax directly (the same token, ~5x less work per step)."""
    if not params.is_greedy:
        return sample(params.probs(logits), generator)
    check_logits(logits)
    return logits.argmax(-1)


def make_generator(seed: int | None, generator: torch.Generator | None = None,
                   device: torch.device | str = "cpu") -> torch.Generator:
    """The random source of one generation: `generator` if given, else one on `device` (where the
    target's logits live) seeded with `seed` (or from the OS when seed is None)."""
    if generator is not None:
        return generator
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen
