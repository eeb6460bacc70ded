"""Toy autoregressive models with a tiny vocabulary, small enough that the target's distribution
over whole sequences can be enumerated exactly.

Their logits depend on the *entire* prefix held in the cache (a seeded function of it), so a
cache that holds the wrong positions after a rollback gives the wrong distribution: the
whole-sequence tests then catch trim and bonus-token bugs that per-step tests miss.
"""

from __future__ import annotations

import itertools

from specdecode.lossless import ToyCache, ToyModel, ToyTokenizer, sequence_distribution  # noqa: F401


class SimulatedClock:
    """A clock that only toy models move (each forward advances it by the model's `delay`), so the
    costs a gamma policy measures are exact and the same on any machine, however fast or loaded."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def all_sequences(vocab_size: int, length: int):
    return itertools.product(range(vocab_size), repeat=length)
