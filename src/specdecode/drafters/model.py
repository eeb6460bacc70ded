"""A draft model: any causal LM with the target's vocabulary (the paper's main setting, Mq)."""

from __future__ import annotations

from typing import Sequence

import torch

from ..models.base import Model
from ..sampling import SamplingParams, draw, sample
from .base import BaseDrafter, Draft


class ModelDrafter(BaseDrafter):
    """Samples gamma tokens autoregressively from the draft model's adjusted distribution q
    (greedy: its argmax, returned as a deterministic draft, q a point mass).

    Its cache follows the same invariant as the target's: it holds a prefix of the context, and
    `propose` first feeds whatever the cache has not seen yet (the tokens emitted since the last
    call: after an all-accepted iteration that includes the last draft token, which was sampled
    but never fed).
    """

    def __init__(self, model: Model, min_confidence: float = 0.0) -> None:
        if not (0.0 <= min_confidence < 1.0):
            raise ValueError(f"min_confidence must be in [0, 1), got {min_confidence}")
        self.model = model
        # Stop drafting early when the draft's own top probability falls below this: a token the
        # draft itself is unsure of is likely rejected, and verifying it costs target time. The
        # rule looks only at the draft's side, so verification stays exact.
        self.min_confidence = min_confidence
        self.vocab = model.vocab
        self.cache = None
        self._proposed_from = 0  # context length at the last proposal

    def reset(self, params: SamplingParams, generator: torch.Generator | None) -> None:
        self.params, self.generator = params, generator
        self.cache = self.model.new_cache()

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        if self.cache is None:
            raise RuntimeError("ModelDrafter.reset() must be called before propose()")
        unseen = list(context[len(self.cache) :])  # >= 1 token by the cache invariant
        if not unseen:
            raise RuntimeError(f"the draft cache holds {len(self.cache)} positions for a context of {len(context)}: "
                               "its trim() did not roll back")
        logits = self.model.forward(torch.tensor([unseen]), self.cache, num_logits=1)[:, -1]  # [1, V]
        greedy = self.params.is_greedy
        tokens, probs = [], []
        for i in range(gamma):
            # greedy: q is a point mass on the argmax, the draft is deterministic, no [V] row needed
            q = None if greedy else self.params.probs(logits)  # [1, V]
            if i and self.min_confidence and self._confidence(logits, q) < self.min_confidence:
                break
            x = draw(logits, self.params) if q is None else sample(q, self.generator)  # [1]
            tokens.append(x)
            if q is not None:
                probs.append(q)
            if i + 1 < gamma:  # the last draft token is fed only if it is accepted
                logits = self.model.forward(x.view(1, 1), self.cache)[:, -1]
        self._proposed_from = len(context)
        if not tokens:
            return Draft(torch.empty(1, 0, dtype=torch.long), None if greedy else torch.empty(1, 0, logits.shape[-1]))
        return Draft(torch.stack(tokens, dim=1), torch.stack(probs, dim=1) if probs else None)  # [1, g], [1, g, V]

    def _confidence(self, logits: torch.Tensor, q: torch.Tensor | None) -> float:
        """The draft's probability of its own next token; for greedy (q None: a point mass, which
        says nothing), of the argmax under the unscaled logits."""
        return float(torch.softmax(logits.float(), -1).max() if q is None else q.max())

    def accept(self, num_accepted: int) -> None:
        # The cache holds the context plus the first gamma-1 drafts; keep the accepted ones only.
        excess = len(self.cache) - (self._proposed_from + num_accepted)
        if excess > 0:
            self.cache.trim(excess)
