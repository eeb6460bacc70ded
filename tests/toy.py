"""Toy autoregressive models with a tiny vocabulary, small enough that the target's distribution
over whole sequences can be enumerated exactly.

Their logits depend on the *entire* prefix held in the cache (a seeded function of it), so a
cache that holds the wrong positions after a rollback gives the wrong distribution: the
whole-sequence tests then catch trim and bonus-token bugs that per-step tests miss.
"""

from __future__ import annotations

import itertools
import time

import torch

from specdecode.models.base import Vocabulary
from specdecode.sampling import SamplingParams


class SimulatedClock:
    """A clock that only toy models move (each forward advances it by the model's `delay`), so the
    costs a gamma policy measures are exact and the same on any machine, however fast or loaded."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ToyCache:
    def __init__(self) -> None:
        self.tokens: list[int] = []

    def __len__(self) -> int:
        return len(self.tokens)

    def trim(self, n: int) -> None:
        assert 0 <= n <= len(self.tokens), (n, len(self.tokens))
        del self.tokens[len(self.tokens) - n :]

    def keep(self, start: int, slots: list[int]) -> None:
        self.tokens[start:] = [self.tokens[s] for s in slots]


class ToyModel:
    """logits(prefix) = scale * N(0, 1) seeded by (seed, prefix), plus `base`'s logits if given
    (a draft that resembles its target)."""

    def __init__(self, vocab_size: int = 3, seed: int = 0, scale: float = 1.5, base: "ToyModel | None" = None,
                 eos_token_ids=(), name: str = "toy", delay: float = 0.0,
                 clock: SimulatedClock | None = None) -> None:
        self.vocab_size, self.seed, self.scale, self.base = vocab_size, seed, scale, base
        self.name, self.device, self.tokenizer = name, "cpu", None
        self.vocab = Vocabulary.from_tokens(name, {f"<{i}>": i for i in range(vocab_size)})
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_positions = None
        self.calls = 0
        # seconds per forward call, to give a target a realistic cost over its draft: on `clock` when
        # given (exact on any host), else slept
        self.delay, self.clock = delay, clock
        self._memo: dict[tuple[int, ...], torch.Tensor] = {}

    def logits_for(self, prefix: tuple[int, ...]) -> torch.Tensor:  # [V]
        if prefix not in self._memo:
            gen = torch.Generator().manual_seed(hash((self.seed,) + prefix) & 0x7FFFFFFF)
            logits = self.scale * torch.randn(self.vocab_size, generator=gen)
            if self.base is not None:
                logits = logits + self.base.logits_for(prefix)
            self._memo[prefix] = logits
        return self._memo[prefix]

    def new_cache(self) -> ToyCache:
        return ToyCache()

    supports_trees = True

    def forward(self, tokens: torch.Tensor, cache: ToyCache, num_logits: int | None = None,
                parents=None) -> torch.Tensor:
        """As the native backend: with `parents`, token t follows token parents[t] (or the cache
        where -1) and its logits are those of the cache's tokens plus its ancestors."""
        self.calls += 1
        if self.clock is not None:
            self.clock.advance(self.delay)
        elif self.delay:
            time.sleep(self.delay)
        out, start, tokens = [], len(cache.tokens), tokens[0].tolist()
        for t, token in enumerate(tokens):
            assert 0 <= token < self.vocab_size, token
            cache.tokens.append(token)
            if parents is None:
                out.append(self.logits_for(tuple(cache.tokens)))
                continue
            path, node = [], t
            while node >= 0:
                path.append(tokens[node])
                node = parents[node]
            out.append(self.logits_for(tuple(cache.tokens[:start]) + tuple(path[::-1])))
        logits = torch.stack(out).unsqueeze(0)  # [1, T, V]
        return logits[:, -num_logits:] if num_logits else logits


def sequence_distribution(model: ToyModel, prompt: list[int], params: SamplingParams, length: int,
                          eos=frozenset()) -> dict[tuple[int, ...], float]:
    """Exact probability of every continuation of `prompt` (up to `length` tokens or an EOS)."""
    dist: dict[tuple[int, ...], float] = {}

    def walk(seq: tuple[int, ...], mass: float) -> None:
        if len(seq) == length or (seq and seq[-1] in eos):
            dist[seq] = dist.get(seq, 0.0) + mass
            return
        probs = params.probs(model.logits_for(tuple(prompt) + seq))
        for token, p in enumerate(probs.tolist()):
            if p > 0:
                walk(seq + (token,), mass * p)

    walk((), 1.0)
    return dist


def all_sequences(vocab_size: int, length: int):
    return itertools.product(range(vocab_size), repeat=length)
