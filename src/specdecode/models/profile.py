"""A model's measured step costs: T(1) and the verification curve T(k)/T(1), cached per machine."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass

import torch

from ..formulas import verify_curve
from .base import Model
from ..progress import waiting
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
    # what one new row costs per further cached position (its attention over them), from T(1) after
    # `context` and after 4 `context` positions; 0 where unmeasured
    row_position_seconds: float = 0.0

    def ratio(self, k: int) -> float:
        return verify_curve(self.verify_ratios)(k)


# Before each timed call when engines take turns: another engine's idle threads spin for a while after
# its call (llama.cpp's OpenMP team does), and would take the cores the next engine's call needs.
SETTLE_SECONDS = 0.02


def time_in_turns(models: dict[str, Model], ks=(1, 2, 4, 8), context: int = 256, repeats: int = 7,
                  progress=None, clock=time.perf_counter) -> dict[str, dict[int, float]]:
    """name -> {k: median seconds of a forward over k new tokens after `context` cached positions}.
    Every round times each k of each model in turn, so a machine that slows down for a while (a
    shared host, another process) slows every k and every model alike instead of one of them.
    With several models each call starts SETTLE_SECONDS after the last one ended. `clock`: seconds
    (tests pass a simulated one)."""
    caches = {}
    for name, model in models.items():
        vocab_limit = min(1000, model.vocab.size) if getattr(model, "vocab", None) else 1000  # ordinary ids
        caches[name] = (model.new_cache(), vocab_limit)
        model.forward(torch.randint(0, vocab_limit, (1, context)), caches[name][0], num_logits=1)
    times = {name: {k: [] for k in ks} for name in models}
    for round_ in range(repeats + 1):  # the first round warms up
        for k in ks:
            for name, model in models.items():
                cache, vocab_limit = caches[name]
                tokens = torch.randint(0, vocab_limit, (1, k))
                if len(models) > 1:
                    time.sleep(SETTLE_SECONDS)
                start = clock()
                model.forward(tokens, cache)
                if round_:
                    times[name][k].append(clock() - start)
                cache.trim(k)
        if progress:
            progress(round_, repeats)
    return {name: {k: statistics.median(v) for k, v in per_k.items()} for name, per_k in times.items()}


def monotone(values: list[float]) -> list[float]:
    """The closest non-decreasing sequence in least squares (pool adjacent violators): a forward over
    more tokens never costs less, so a dip is noise, and so is the spike it pairs with."""
    blocks = []  # [mean, size]
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (a, n), (b, m) = blocks[-2], blocks.pop()
            blocks[-1] = [(a * n + b * m) / (n + m), n + m]
    return [mean for mean, size in blocks for _ in range(size)]


def _dtype_and_threads(model: Model) -> tuple[str, int]:
    return (str(getattr(model, "dtype", "unknown")).replace("torch.", ""),
            getattr(model, "n_threads", None) or torch.get_num_threads())


def profile_path(model: Model, max_k: int = 16, context: int = 256):
    """Where `profile_model` keeps a model's profile: per model, backend (and kernel build), dtype and
    threads (the same file runs at very different speeds on each)."""
    dtype, threads = _dtype_and_threads(model)
    backend = type(model).__name__
    tag = getattr(model, "profile_tag", "")  # the native backend's kernel build: new kernels, new profile
    return cache_root() / "profiles" / f"{model.name}-{backend}{tag}-{dtype}-{threads}t-ctx{context}-k{max_k}-v2.json"


def profile_model(model: Model, max_k: int = 16, context: int = 256, repeats: int = 7, use_cache: bool = True,
                  progress=None) -> Profile:
    """T(1) and the verification curve T(k)/T(1) for k = 1..max_k; cached (`profile_path`)."""
    dtype, threads = _dtype_and_threads(model)
    name = model.name
    path = profile_path(model, max_k, context)
    if use_cache and path.exists():
        return Profile(**json.loads(path.read_text()))
    with waiting(f"measuring what verifying k tokens costs {name} here", once=True):
        times = time_in_turns({name: model}, range(1, max_k + 1), context, repeats, progress)[name]
        ratios = monotone([times[k] / times[1] for k in range(1, max_k + 1)])
        longer, limit = 4 * context, getattr(model, "max_positions", None)
        per_position = 0.0
        if not limit or longer + max_k <= limit:
            far = time_in_turns({name: model}, (1,), longer, repeats)[name][1]
            per_position = max(0.0, (far - times[1]) / (longer - context))
    profile = Profile(model=name, dtype=dtype, threads=threads, context=context, step_seconds=times[1],
                      verify_ratios=[0.0] + [r / ratios[0] for r in ratios], row_position_seconds=per_position)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(profile)))
    return profile
