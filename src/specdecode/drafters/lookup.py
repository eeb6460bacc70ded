"""Prompt lookup: copy from context (Leviathan et al. 2023, section 4: drafters "from n-grams to
copying"; Saxena 2023, prompt lookup decoding). Free to run, deterministic, strong wherever the
output repeats the input: summarisation, retrieval-augmented answers, code edits.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..sampling import SamplingParams
from .base import Draft


class PromptLookupDrafter:
    """Find the most recent earlier occurrence of the context's last n tokens (longest n first,
    from max_ngram down to min_ngram) and propose the tokens that followed it."""

    vocab = None  # it only copies the context's own (target) token ids

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not (1 <= min_ngram <= max_ngram):
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def reset(self, params: SamplingParams, generator: torch.Generator | None) -> None:
        pass  # stateless

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        ids = np.asarray(context, dtype=np.int64)
        for n in range(min(self.max_ngram, len(ids) - 1), self.min_ngram - 1, -1):
            pattern = ids[-n:]
            windows = np.lib.stride_tricks.sliding_window_view(ids[:-1], n)  # [T-n, n]; excludes the suffix itself
            starts = np.flatnonzero((windows == pattern).all(axis=1))
            if starts.size:
                begin = int(starts[-1]) + n  # most recent match: the likeliest to continue the same way
                proposal = ids[begin : begin + gamma]
                return Draft(torch.from_numpy(proposal.copy()).unsqueeze(0))
        return Draft(torch.empty(1, 0, dtype=torch.long))

    def accept(self, num_accepted: int) -> None:
        pass
