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
    parents: None for a chain; for a tree (B = 1), token i's parent among the tokens (< i), or -1
            where it follows the context; siblings differ. Either deterministic guesses (probs
            None), or sampled (`drafters.tree`): probs[0, i] is the q node i was drawn from, and
            siblings were drawn one after another without replacement, in their index order.
    reach:  for a tree, optionally, the drafter's estimate of each node's chance of being reached,
            best first: any prefix of the nodes is then a tree worth verifying (`prefix`).
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    parents: list[int] | None = None
    reach: list[float] | None = None

    @property
    def gamma(self) -> int:
        return self.tokens.shape[1]

    def prefix(self, n: int) -> Draft:
        """A tree's first n nodes (a tree, for drafts that give `reach`)."""
        probs = None if self.probs is None else self.probs[:, :n]
        return Draft(self.tokens[:, :n], probs, self.parents[:n], self.reach[:n] if self.reach else None)

    def prefixes(self) -> list[list[int]]:
        """The draft tokens before each row a call verifies: row 0 follows the context alone, row
        1 + i draft token i after the tokens before it (a chain's) or its ancestors (a tree's)."""
        tokens = self.tokens[0].tolist()
        if self.parents is None:
            return [tokens[:i] for i in range(len(tokens) + 1)]
        nodes: list[list[int]] = []
        for node, parent in enumerate(self.parents):
            nodes.append((nodes[parent] if parent >= 0 else []) + [tokens[node]])
        return [[], *nodes]

    def main_path(self) -> list[int]:
        """The nodes of the main chain: from the context, each node's first child (a chain: all)."""
        if self.parents is None:
            return list(range(self.gamma))
        path, node = [], -1
        while (node := next((i for i, p in enumerate(self.parents) if p == node), None)) is not None:
            path.append(node)
        return path

    def chain(self) -> Draft:
        """A tree's main chain: what a target that cannot verify trees verifies. A chain is its
        own. A sampled tree's first children were each drawn first from their q: the chain is an
        ordinary sampled draft."""
        if self.parents is None:
            return self
        path = self.main_path()
        return Draft(self.tokens[:, path], None if self.probs is None else self.probs[:, path])


class Drafter(Protocol):
    """What the decode loop asks of a drafter (`BaseDrafter` gives every member but `propose` a default)."""

    # The vocabulary the drafter's token ids come from, or None when it only copies ids it was
    # given (then they are the target's ids by construction).
    vocab: Vocabulary | None
    # Its drafts may be trees (a target without tree attention verifies their main chain).
    proposes_trees: bool
    # The trees' children are sampled from q: their size is planned before drafting, never cut after.
    samples_trees: bool

    def reset(self, params: SamplingParams, generator: torch.Generator | None) -> None:
        """Start a new generation: forget any state, sample with these settings."""

    def begin(self, prompt: Sequence[int]) -> None:
        """The new generation's prompt (a drafter may tell the prompt from the output)."""

    def attach(self, cache) -> None:
        """The target's cache the new generation verifies in, before its first position (a feature
        draft reads the target's features from it, `drafters.eagle`; other drafters ignore it)."""

    def source(self, context: Sequence[int]) -> str | None:
        """Which of its sources proposes after `context` (prompt lookup, or a model: `drafters.hybrid`),
        for the loop to keep a gamma policy for each; None for a drafter of one source."""

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        """Up to gamma new tokens continuing `context` (the prompt plus everything emitted)."""

    def accept(self, num_accepted: int) -> None:
        """The target kept the first num_accepted proposed tokens (plus one of its own)."""


class BaseDrafter:
    """A `Drafter`'s defaults: target token ids, chains, no state between calls."""

    vocab: Vocabulary | None = None
    proposes_trees = False
    samples_trees = False

    def reset(self, params: SamplingParams, generator: torch.Generator | None) -> None:
        pass

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def attach(self, cache) -> None:
        pass

    def source(self, context: Sequence[int]) -> str | None:
        return None

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        raise NotImplementedError

    def accept(self, num_accepted: int) -> None:
        pass


DRAFTER_MEMBERS = ("vocab", "proposes_trees", "samples_trees", "reset", "begin", "attach", "source", "propose",
                   "accept")


def check_drafter(drafter) -> None:
    """Refuse, naming what is missing, a drafter that lacks part of the protocol."""
    missing = [name for name in DRAFTER_MEMBERS if not hasattr(drafter, name)]
    if missing:
        raise TypeError(f"{type(drafter).__name__} is not a drafter: it lacks {', '.join(missing)} "
                        f"(subclass specdecode.drafters.BaseDrafter for the defaults)")
