"""`--backend auto` between engines that can both run a model: the one measured fastest here.

Which engine decodes a Llama GGUF fastest depends on the CPU more than on the model (the kernel
paths differ by instruction set, and so do llama.cpp's; `benchmarks/results/kernel_paths_avx2.md`
and `int8_activations.md` show how far apart they can be). So on first use on a machine the candidates (the native
backend on its kernel plan, llama.cpp where it is installed) are timed over k = 1, 2, 4, 8 new
tokens after 256 cached positions, taking turns call by call (whatever else loads the machine
then loads both alike), and the one with the best predicted decoding rate wins:

    rate = max over gamma of E[tokens](alpha, gamma) / (T(1) T(gamma + 1)/T(1)),   alpha = PRIOR_ALPHA

(gamma = 0 is plain decoding, 1 / T(1)), the cost model of `--gamma auto` with the acceptance a
prompt-lookup draft typically reaches. The choice is cached per model file, kernel build, engine
version and thread count; `choice.reason` says what was measured.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from ..formulas import optimal_gamma
from ..progress import waiting
from .files import cache_root
from .profile import time_in_turns

PRIOR_ALPHA = 0.5
KS, CONTEXT, REPEATS = (1, 2, 4, 8), 256, 5


@dataclass
class BackendChoice:
    backend: str
    reason: str
    rates: dict[str, float] = field(default_factory=dict)  # predicted tokens/s of each candidate
    step_ms: dict[str, float] = field(default_factory=dict)  # measured T(1)
    verify_8: dict[str, float] = field(default_factory=dict)  # measured T(8)/T(1)


def predicted_rate(step_seconds: float, verify_ratios: list[float], alpha: float = PRIOR_ALPHA) -> float:
    """Tokens a second of plain or speculative decoding, whichever the cost model prefers;
    verify_ratios[k] = T(k)/T(1) (entry 0 unused), gamma up to len - 2."""
    _, speedup = optimal_gamma(alpha, 0.0, len(verify_ratios) - 2, verify_ratios)
    return speedup / step_seconds


def curve(times: dict[int, float]) -> tuple[float, list[float]]:
    """T(1) and T(k)/T(1) for k = 0..max, linear between the measured k."""
    ks = sorted(times)
    ratios = [0.0]
    for k in range(1, ks[-1] + 1):
        hi = next(j for j in ks if j >= k)
        lo = max(j for j in ks if j <= k)
        t = times[lo] if hi == lo else times[lo] + (times[hi] - times[lo]) * (k - lo) / (hi - lo)
        ratios.append(t / times[1])
    return times[1], ratios


def pick(profiles: dict[str, tuple[float, list[float]]]) -> BackendChoice:
    """The candidate with the best predicted rate from (T(1) seconds, T(k)/T(1) curve) each."""
    rates = {name: predicted_rate(step, ratios) for name, (step, ratios) in profiles.items()}
    best = max(rates, key=rates.get)
    others = ", ".join(f"{name} {rate:.0f}" for name, rate in rates.items() if name != best)
    reason = (f"measured fastest here: {best} {rates[best]:.0f} predicted tokens/s (T(1) "
              f"{profiles[best][0] * 1e3:.1f} ms){'; ' + others if others else ''}")
    return BackendChoice(best, reason, rates, {n: p[0] * 1e3 for n, p in profiles.items()},
                         {n: p[1][min(8, len(p[1]) - 1)] for n, p in profiles.items()})


def choice_path(model_path: Path, threads: int, signature: str) -> Path:
    stat = model_path.stat()
    key = hashlib.sha256(f"{model_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{threads}|{signature}".encode())
    return cache_root() / "choices" / f"{model_path.name}-{threads}t-{key.hexdigest()[:16]}.json"


def _timer(models):
    return time_in_turns(models, KS, CONTEXT, REPEATS)


def choose(model_path: Path, threads: int, signature: str, loaders: dict[str, Callable[[], object]],
           refresh: bool = False, timer=_timer):
    """(BackendChoice, the chosen model loaded) among `loaders` (name -> load the model that way),
    timed by `timer` (name -> model -> {k: seconds}, default `profile.time_in_turns`) unless a cached choice exists. The losers
    are dropped once timed; the winner is returned loaded."""
    path = choice_path(model_path, threads, signature)
    if path.exists() and not refresh:
        choice = BackendChoice(**json.loads(path.read_text()))
        if choice.backend in loaders:
            return choice, loaders[choice.backend]()
    with waiting(f"measuring which engine runs {model_path.name} fastest here ({', '.join(loaders)})", once=True):
        models = {name: load() for name, load in loaders.items()}
        choice = pick({name: curve(times) for name, times in timer(models).items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(choice)))
    return choice, models[choice.backend]
