"""Prompt lookup: copy from context (Leviathan et al. 2023, section 4: drafters "from n-grams to
copying"; Saxena 2023, prompt lookup decoding). Free to run, deterministic, strong wherever the
output repeats the input: summarisation, retrieval-augmented answers, code edits.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..sampling import SamplingParams
from .base import BaseDrafter, Draft


class PromptLookupDrafter(BaseDrafter):
    """Find the most recent earlier occurrence of the context's last n tokens (longest n first,
    from max_ngram down to min_ngram) and propose the tokens that followed it.

    An index from each n-gram to its latest start is kept up to date as the context grows, so a
    proposal costs a few dictionary lookups whatever the context length (a fast target's step is a
    few milliseconds; rescanning a long prompt at every step was a visible share of it). `reset`
    starts a new index; so does a context that is visibly not a continuation of the last one.
    """

    vocab = None  # it only copies the context's own (target) token ids

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not (1 <= min_ngram <= max_ngram):
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._forget()

    def _forget(self) -> None:
        self._ids: list[int] = []  # the context indexed so far
        self._last: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(self.min_ngram, self.max_ngram + 1)}

    def reset(self, params: SamplingParams, generator: torch.Generator | None) -> None:
        self._forget()

    def _update(self, context: Sequence[int]) -> None:
        ids = self._ids
        T = len(ids)
        if len(context) < T or any(context[i] != ids[i] for i in {0, T // 2, T - 1} if T):
            self._forget()  # not a continuation (as far as three spot checks tell): index it from scratch
            ids, T = self._ids, 0
        ids.extend(int(t) for t in context[T:])
        for n, last in self._last.items():
            # n-grams that end before the final token: starts s <= len(ids) - 1 - n
            for s in range(max(0, T - n), len(ids) - n):
                last[tuple(ids[s : s + n])] = s

    def match(self, context: Sequence[int], gamma: int, extend: int = 0) -> tuple[int, list[int]]:
        """(n, tokens): the length of the longest n-gram matched (0: none) and up to gamma tokens that
        followed its most recent earlier occurrence. With `extend`, n counts up to that many more
        tokens before the n-gram on which the occurrence and the context also agree."""
        self._update(context)
        ids = self._ids
        for n in range(min(self.max_ngram, len(ids) - 1), self.min_ngram - 1, -1):
            start = self._last[n].get(tuple(ids[-n:]))
            if start is not None:  # the most recent match: the likeliest to continue the same way
                tokens, end = ids[start + n : start + n + gamma], len(ids) - n
                while extend and start > 0 and ids[start - 1] == ids[end - 1]:
                    start, end, n, extend = start - 1, end - 1, n + 1, extend - 1
                return n, tokens
        return 0, []

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        return Draft(torch.tensor([self.match(context, gamma)[1]], dtype=torch.long).reshape(1, -1))

    def accept(self, num_accepted: int) -> None:
        pass
