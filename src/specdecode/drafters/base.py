"""The drafter protocol: anything that guesses the next tokens of a context."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from ..models.base import Vocabulary
from ..sampling import SamplingParams


@dataclass
class Draft:
    """Proposed continuation.

    tokens: [B, g] int64, g <= gamma (a drafter may propose fewer, even none).
    probs:  [B, g, V] float32, the adjusted distributions the tokens were drawn from, or None
            for a deterministic drafter (q is then a point mass on each token).
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None

    @property
    def gamma(self) -> int:
        return self.tokens.shape[1]


class Drafter(Protocol):
    # The vocabulary the drafter's token ids come from, or None when it only copies ids it was
    # given (then they are the target's ids by construction).
    vocab: Vocabulary | None

    def reset(self, params: SamplingParams, generator: torch.Generator | None) -> None:
        """Start a new generation: forget any state, sample with these settings."""

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        """Up to gamma new tokens continuing `context` (the prompt plus everything emitted)."""

    def accept(self, num_accepted: int) -> None:
        """The target kept the first num_accepted proposed tokens (plus one of its own)."""
