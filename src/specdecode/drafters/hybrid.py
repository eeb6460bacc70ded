"""Copy where the text repeats itself, ask a draft model elsewhere.

Prompt lookup is free and nearly always right inside a long repeat (a summary quoting its source,
an answer quoting retrieved text); a draft model guesses everywhere but costs a forward per token.
Each call uses one of them: lookup when the context's last `min_match`+ tokens occurred earlier,
the model otherwise. Verification sees each proposal with its own q (a point mass for lookup), so
the output distribution is still exactly the target's. `source` tells the decode loop which of
the two the next call will use, so an adaptive gamma policy learns each one's acceptance and cost
apart and plans each call for the drafter that makes it.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..sampling import SamplingParams
from .base import BaseDrafter, Draft
from .lookup import PromptLookupDrafter
from .model import ModelDrafter


class LookupThenModelDrafter(BaseDrafter):
    def __init__(self, model: ModelDrafter | BaseDrafter, min_match: int = 2, max_ngram: int = 3) -> None:
        self.lookup = PromptLookupDrafter(max_ngram=max(max_ngram, min_match), min_ngram=min_match)
        self.model = model
        self.vocab = model.vocab
        self._last = None  # the drafter that made the latest proposal

    def reset(self, params: SamplingParams, generator: torch.Generator | None) -> None:
        self.lookup.reset(params, generator)
        self.model.reset(params, generator)
        self._last = None

    def attach(self, cache) -> None:
        self.model.attach(cache)  # a feature draft reads the target's cache (drafters.eagle)

    def source(self, context: Sequence[int]) -> str:
        """Which drafter proposes after `context`: "lookup" where it finds a match, else "model"."""
        return "lookup" if self.lookup.propose(context, 1).gamma else "model"

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        draft = self.lookup.propose(context, gamma)
        self._last = self.lookup if draft.gamma else self.model
        return draft if draft.gamma else self.model.propose(context, gamma)

    def accept(self, num_accepted: int) -> None:
        if self._last is not None:
            self._last.accept(num_accepted)
