"""A model's measured step costs: T(1) and the verification curve T(k)/T(1), cached per machine."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass

import torch

from ..formulas import verify_curve
from .base import Model
from .files import cache_root


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
    """T(1) and the verification curve T(k)/T(1) for k = 1..max_k; cached per model, backend (and
    kernel build), dtype and threads (the same file runs at very different speeds on each)."""
    dtype = str(getattr(model, "dtype", "unknown")).replace("torch.", "")
    threads = getattr(model, "n_threads", None) or torch.get_num_threads()
    name = model.name
    backend = type(model).__name__
    tag = getattr(model, "profile_tag", "")  # the native backend's kernel build: new kernels, new profile
    path = cache_root() / "profiles" / f"{name}-{backend}{tag}-{dtype}-{threads}t-ctx{context}-k{max_k}.json"
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
