"""Measuring the paper's two inputs on real models: alpha (how well the draft matches the target)
and the costs (draft step / target step = c; the verification curve T(k)/T(1))."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from ..decode import autoregressive_decode
from ..drafters.base import Drafter
from ..models.base import Model, check_same_vocab
from ..models.profile import Profile, profile_model
from ..sampling import SamplingParams
from ..verify import draft_acceptance, match_vocab


@dataclass
class AlphaEstimate:
    alpha: float  # mean of beta = sum_x min(p, q) over positions
    stderr: float  # standard error, with prompts as clusters (positions within a prompt correlate)
    positions: int
    prompts: int


def position_betas(target: Model, drafter: Drafter, prompt: Sequence[int], generated: Sequence[int],
                   params: SamplingParams, generator: torch.Generator | None = None) -> list[float]:
    """beta at every generated position: the target's distribution there (one teacher-forced target
    call over the whole sequence) against the drafter's one-token proposal from the same prefix."""
    if drafter.vocab is not None:
        check_same_vocab(target.vocab, drafter.vocab)
    sequence = list(prompt) + list(generated)
    logits = target.forward(torch.tensor([sequence[:-1]]), target.new_cache(), num_logits=len(generated))
    target_probs = params.probs(logits[0])  # [N, V]
    drafter.reset(params, generator)
    betas = []
    for i in range(len(generated)):
        draft = drafter.propose(sequence[: len(prompt) + i], 1)
        drafter.accept(0)
        if draft.gamma == 0:
            betas.append(0.0)  # no proposal: nothing can be accepted here
            continue
        draft_probs = match_vocab(draft.probs, target_probs.shape[-1])  # [1, 1, V] or None
        betas.append(float(draft_acceptance(draft.tokens[0], None if draft_probs is None else draft_probs[0],
                                            target_probs[i : i + 1])))
    return betas


def measure_alpha(target: Model, drafter: Drafter, prompts: Sequence[Sequence[int]], params: SamplingParams,
                  max_new_tokens: int = 64, seed: int = 0) -> AlphaEstimate:
    """alpha = E[beta] on tokens the target itself generates (no speculative run needed)."""
    generator = torch.Generator().manual_seed(seed)
    per_prompt = []
    for prompt in prompts:
        generated = [t for step in autoregressive_decode(target, prompt, params=params, max_new_tokens=max_new_tokens,
                                                         generator=generator) for t in step.tokens]
        per_prompt.append(position_betas(target, drafter, prompt, generated, params, generator))
    return summarize_betas(per_prompt)


def summarize_betas(per_prompt: Sequence[Sequence[float]]) -> AlphaEstimate:
    values = [b for betas in per_prompt for b in betas]
    if not values:
        raise ValueError("no positions to estimate alpha from")
    n = len(values)
    mean = sum(values) / n
    clusters = [betas for betas in per_prompt if betas]
    if len(clusters) >= 2:  # cluster-robust: sum over prompts of their summed residuals, squared
        var = sum(sum(b - mean for b in betas) ** 2 for betas in clusters) / n**2
        var *= len(clusters) / (len(clusters) - 1)
    else:
        var = statistics.pvariance(values) / n if n > 1 else 0.0
    return AlphaEstimate(alpha=mean, stderr=math.sqrt(var), positions=n, prompts=len(clusters))


def drafter_step_seconds(drafter: Drafter, context: Sequence[int], repeats: int = 15) -> float:
    """Median seconds a drafter needs per proposed token (one-token proposals, context growing)."""
    drafter.reset(SamplingParams(temperature=0), torch.Generator().manual_seed(0))
    context = list(context)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        draft = drafter.propose(context, 1)
        times.append(time.perf_counter() - start)
        drafter.accept(draft.gamma)
        context.append(int(draft.tokens[0, 0]) if draft.gamma else context[-1])
    return statistics.median(times[1:])


__all__ = ["AlphaEstimate", "Profile", "drafter_step_seconds", "measure_alpha", "position_betas", "profile_model",
           "summarize_betas"]
