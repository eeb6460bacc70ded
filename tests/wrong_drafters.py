"""Deliberately wrong drafters, each a different way to break losslessness, for `specdecode check`
to catch (`--draft wrong_drafters:Name --target toy`). Each is built from the target alone (the
check calls the factory with it) and proposes exactly what greedy decoding would, so only the
statistical checks can see what is wrong."""

from __future__ import annotations

import torch

from specdecode.drafters import BaseDrafter, Draft, ModelDrafter
from specdecode.drafters.tree import sample_tree
from specdecode.sampling import SamplingParams


def _target_probs(target, tokens, params: SamplingParams) -> torch.Tensor:
    """The target's adjusted distribution [V] after `tokens`, from a cache of its own."""
    return params.probs(target.forward(torch.tensor([list(tokens)]), target.new_cache(), num_logits=1)[0, -1])


class MisstatedQ(BaseDrafter):
    """Draws from a real q (the target's own, from a second cache) but reports a different one."""

    def __init__(self, target):
        self.inner = ModelDrafter(target)

    def reset(self, params, generator):
        self.inner.reset(params, generator)

    def propose(self, context, gamma):
        draft = self.inner.propose(context, gamma)
        if draft.probs is not None:
            draft.probs = 0.5 * draft.probs + 0.5 / draft.probs.shape[-1]  # not what the tokens were drawn from
        return draft

    def accept(self, n):
        self.inner.accept(n)


class ReadsTheFuture(BaseDrafter):
    """Peeks at the random numbers the verifier is about to use and proposes a token it knows will
    be accepted: the least likely one whose p is above the coming uniform."""

    def __init__(self, target):
        self.target = target

    def reset(self, params, generator):
        self.params, self.generator = params, generator

    def propose(self, context, gamma):
        peek = torch.Generator().manual_seed(0)
        peek.set_state(self.generator.get_state())
        r = float(torch.rand(1, 1, generator=peek))
        p = _target_probs(self.target, context, self.params)
        passing = [t for t in range(p.shape[-1]) if p[t] > r]
        token = min(passing, key=lambda t: float(p[t])) if passing else int(p.argmax())
        return Draft(torch.tensor([[token]]))


class TreeCutByDrawnTokens(BaseDrafter):
    """Samples a draft tree from a flattened copy of the target's q, then ends it before the first
    node whose token was unlikely: the tree's shape then depends on its own drawn tokens."""

    proposes_trees = samples_trees = True

    def __init__(self, target):
        self.target = target

    def reset(self, params, generator):
        self.params, self.generator = params, generator

    def propose(self, context, gamma):
        q = lambda tokens: 0.5 * _target_probs(self.target, tokens, self.params) + 0.5 / 3  # noqa: E731
        draft = sample_tree(q, context, gamma, 2, self.generator)
        if not draft.gamma:
            return draft
        q_of_token = draft.probs[0].gather(-1, draft.tokens[0].unsqueeze(-1)).squeeze(-1).tolist()
        return draft.prefix(next((i for i, q in enumerate(q_of_token) if q < 0.3), draft.gamma))


class CopyLastToken(BaseDrafter):
    """A right drafter, as a user would write one: it guesses that the last token repeats."""

    def propose(self, context, gamma):
        return Draft(torch.tensor([[context[-1]] * gamma]))
