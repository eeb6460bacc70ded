"""Measuring the paper's two inputs on real models: alpha (how well the draft matches the target)
and the costs (draft step / target step = c; the verification curve T(k)/T(1))."""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Sequence

import torch

from ..decode import autoregressive_decode
from ..drafters.base import Drafter
from ..formulas import verify_curve
from ..models.base import Model, check_same_vocab
from ..models.files import cache_root
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


@dataclass
class Profile:
    """Median step times, measured after a context of `context` tokens."""

    model: str
    dtype: str
    threads: int
    context: int
    step_seconds: float  # T(1)
    verify_ratios: list[float]  # verify_ratios[k] = T(k)/T(1), k = 1..K (entry 0 unused, 0.0)

    def ratio(self, k: int) -> float:
        return verify_curve(self.verify_ratios)(k)


def time_forward(model: Model, k: int, context: int = 256, repeats: int = 7) -> float:
    """Median seconds of one forward over k new tokens after `context` cached positions."""
    gen = torch.Generator().manual_seed(0)
    vocab_limit = min(1000, model.vocab.size)  # ordinary token ids; their values barely matter
    prefix = torch.randint(0, vocab_limit, (1, context), generator=gen)
    cache = model.new_cache()
    model.forward(prefix, cache, num_logits=1)
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        tokens = torch.randint(0, vocab_limit, (1, k), generator=gen)
        start = time.perf_counter()
        model.forward(tokens, cache)
        times.append(time.perf_counter() - start)
        cache.trim(k)
    return statistics.median(times[1:])


def profile_model(model: Model, max_k: int = 16, context: int = 256, repeats: int = 7, use_cache: bool = True,
                  progress=None) -> Profile:
    """T(1) and the verification curve T(k)/T(1) for k = 1..max_k; cached per model, backend, dtype
    and threads (the same file runs at very different speeds on different backends)."""
    dtype = str(getattr(model, "dtype", "unknown")).replace("torch.", "")
    threads = getattr(model, "n_threads", None) or torch.get_num_threads()
    name = model.name
    backend = type(model).__name__
    path = cache_root() / "profiles" / f"{name}-{backend}-{dtype}-{threads}t-ctx{context}-k{max_k}.json"
    if use_cache and path.exists():
        return Profile(**json.loads(path.read_text()))
    times = {}
    for k in range(1, max_k + 1):
        times[k] = time_forward(model, k, context, repeats)
        if progress:
            progress(k, max_k)
    profile = Profile(model=name, dtype=dtype, threads=threads, context=context, step_seconds=times[1],
                      verify_ratios=[0.0] + [times[k] / times[1] for k in range(1, max_k + 1)])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(profile)))
    return profile


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
