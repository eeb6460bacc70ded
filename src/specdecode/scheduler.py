"""Who runs in the next forward, and how much of it: the one owner of the batch's scheduling.

- admission: requests take the batch's slots in arrival order, at most `max_batch` holding a KV
  cache at once (`admit`);
- prompt budgeting: where the target computes prompt rows row-invariantly, up to `prompt_rows`
  prompt tokens ride beside the decode rows of a step, the shortest prompts left first, so a short
  prompt behind a long one has its first token a step later, not after the whole long prompt
  (`prompt_pieces`);
- speculation planning: the draft length of every decoding request of a step, planned together
  under the cost model of `--gamma auto` over the batch's rows (`gamma.draft_lengths`), so
  speculation shrinks and stops as the batch fills (`draft_lengths`);
- the queue bound: requests beyond the batch wait, at most `max_queue` of them; a server refuses
  more with a 429 and a Retry-After (`refusal`).

`batch.Batch` asks it at every step and the server's engine at every submission; its settings'
defaults are `defaults`' (one place)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from . import defaults
from .gamma import AdaptiveGamma, draft_lengths


@dataclass(frozen=True)
class Scheduler:
    max_batch: int = defaults.MAX_BATCH  # requests holding a KV cache at once
    max_gamma: int = defaults.MAX_GAMMA  # the longest draft a planned ("auto") request gets
    prompt_rows: int = defaults.PROMPT_ROWS  # prompt tokens a step feeds beside the decode rows
    max_queue: int = defaults.MAX_QUEUE  # requests that may wait behind a full batch

    def __post_init__(self) -> None:
        for name in ("max_batch", "prompt_rows"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

    def admit(self, waiting: list, active: Sequence) -> list:
        """The waiting requests that take the free slots now, in arrival order (removed from `waiting`)."""
        free = max(0, self.max_batch - len(active))
        admitted, waiting[:free] = waiting[:free], []
        return admitted

    def prompt_pieces(self, prompts: Sequence[tuple[object, int]]) -> list[tuple[object, int]]:
        """(request, prompt tokens it has left) -> (request, tokens it feeds this step): the shortest
        prompts left first, `prompt_rows` tokens in all."""
        budget, pieces = self.prompt_rows, []
        for request, left in sorted(prompts, key=lambda item: item[1]):
            if budget <= 0:
                break
            size = min(budget, left)
            budget -= size
            pieces.append((request, size))
        return pieces

    def draft_lengths(self, decodings: Sequence, prompt_rows: int) -> list[int | None]:
        """Each decoding request's draft length this step (None: its own policy plans it): planned
        together where several requests, or prompt rows, share the forward and one plans adaptively;
        a request alone plans as outside a batch."""
        plan: list[int | None] = [None] * len(decodings)
        if len(decodings) > 1 or (decodings and prompt_rows):
            policies = [d.plan_policy() for d in decodings]
            auto = next((p for p in policies if isinstance(p, AdaptiveGamma)), None)
            if auto is not None:
                auto.context_length = sum(len(d.context) for d in decodings) // len(decodings)
                plan = draft_lengths(policies, [d.room for d in decodings], auto.verify_cost, prompt_rows)
        return plan

    def refusal(self, admitted: int, service_seconds: float) -> tuple[int, int] | None:
        """Where `admitted` requests (decoding and waiting) already fill the batch and the queue: (the
        requests waiting, the seconds until the queue has drained enough: `max_batch` requests at a
        time, each about `service_seconds`); None where one more may wait."""
        if admitted < self.max_queue + self.max_batch:
            return None
        waiting = admitted - self.max_batch
        return waiting, max(1, math.ceil(service_seconds * (waiting + 1) / self.max_batch))
