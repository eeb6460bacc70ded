"""Whole-sequence losslessness: speculative samples through the real decode loop, with caches,
match the target's exactly enumerated distribution over full sequences."""

import importlib

import pytest
import torch
from toy import ToyCache, ToyModel

from specdecode import (LookupThenModelDrafter, ModelDrafter, PromptLookupDrafter, SamplingParams,
                        autoregressive_decode, lossless, speculative_decode)
from specdecode.drafters import BaseDrafter, SuffixCache, SuffixDrafter
from specdecode.drafters.tree import sample_tree
from specdecode.lossless import toy_world
from specdecode.sampling import sample
from specdecode.verify import verify

VERIFIER = importlib.import_module("specdecode.verify")  # the module (the package exports its `verify` function)

LENGTH = 6  # new tokens; longer than gamma + 1 so every gamma runs full iterations and rollbacks
SAMPLES = 2_000  # sized by power: the broken loops below score p < 1e-20 at this size (threshold 1e-6)
SETTINGS = {
    "temperature 1": SamplingParams(temperature=1.0),
    "temperature 0.7": SamplingParams(temperature=0.7),
    "top-k 2": SamplingParams(top_k=2),
    "top-p 0.8": SamplingParams(top_p=0.8),
}


def models(eos=()):
    world = toy_world(eos)
    return world.target, world.draft  # a draft that resembles the target


def whole_sequence_pvalue(drafter_for, gamma, params, eos=(), samples=SAMPLES, seed=0):
    target, draft = models(eos)
    return lossless.whole_sequence_pvalue(drafter_for(draft), target, gamma, params, samples, seed, eos, LENGTH)


@pytest.mark.statistical
@pytest.mark.parametrize("gamma, setting", [(1, "temperature 1"), (1, "top-p 0.8"), (3, "temperature 0.7"),
                                            (3, "top-k 2"), (5, "temperature 1"), (5, "top-p 0.8")])
def test_model_drafter_matches_target_over_whole_sequences(gamma, setting):
    """Each setting, and each gamma from one draft token to nearly the sequence's six (in pairs:
    the settings reshape p and q alike, whatever gamma)."""
    assert whole_sequence_pvalue(ModelDrafter, gamma, SETTINGS[setting]) > 1e-3


@pytest.mark.statistical
def test_confidence_limited_drafts_match_target_over_whole_sequences():
    drafter_for = lambda draft: ModelDrafter(draft, min_confidence=0.6)  # noqa: E731
    assert whole_sequence_pvalue(drafter_for, 5, SETTINGS["temperature 1"]) > 1e-3


@pytest.mark.statistical
def test_prompt_lookup_matches_target_over_whole_sequences():
    assert whole_sequence_pvalue(lambda draft: PromptLookupDrafter(), 3, SETTINGS["temperature 1"]) > 1e-3


@pytest.mark.statistical
def test_suffix_drafts_remembering_earlier_samples_match_target_over_whole_sequences():
    """One drafter after another shares a small memory of every earlier sample (evicting as it
    goes): drafts that depend on the past, never on the sample being drawn."""
    cache = SuffixCache(depth=4, max_nodes=30)
    assert whole_sequence_pvalue(lambda draft: SuffixDrafter(cache), 3, SETTINGS["temperature 1"]) > 1e-3
    assert 1 < len(cache.outputs) < SAMPLES and cache.trie.nodes <= 30


@pytest.mark.statistical
def test_lookup_then_model_drafts_match_target_over_whole_sequences():
    drafter_for = lambda draft: LookupThenModelDrafter(ModelDrafter(draft), min_match=1)  # noqa: E731
    assert whole_sequence_pvalue(drafter_for, 3, SETTINGS["temperature 1"]) > 1e-3


@pytest.mark.statistical
def test_eos_inside_an_accepted_run_ends_the_sequence_exactly():
    assert whole_sequence_pvalue(ModelDrafter, 4, SETTINGS["temperature 1"], eos=(2,)) > 1e-3


class RandomTreeDrafter(BaseDrafter):
    """Guesses a random tree of up to gamma tokens (distinct siblings), from its own generator."""

    proposes_trees = True

    def __init__(self, seed=7):
        self.gen = torch.Generator().manual_seed(seed)

    def reset(self, params, generator):
        pass

    def propose(self, context, gamma):
        from specdecode.drafters import Draft

        tokens, parents = [], []
        for _ in range(gamma):
            parent = int(torch.randint(-1, len(tokens), (1,), generator=self.gen))
            taken = {t for t, p in zip(tokens, parents) if p == parent}
            free = [t for t in range(3) if t not in taken]
            if free:
                tokens.append(free[int(torch.randint(len(free), (1,), generator=self.gen))])
                parents.append(parent)
        return Draft(torch.tensor([tokens]), parents=parents)

    def accept(self, n):
        pass


@pytest.mark.statistical
@pytest.mark.parametrize("setting", ["temperature 1", "top-k 2"])
def test_draft_trees_match_target_over_whole_sequences(setting):
    """A tree is verified by drawing the target's token where the walk stands and stepping into the
    child that guessed it: whole sequences follow the target exactly, rollback to the kept path
    included (the toy target computes each node from its own ancestors, as the native backend does)."""
    assert whole_sequence_pvalue(lambda draft: RandomTreeDrafter(), 4, SETTINGS[setting]) > 1e-3


class SampledTreeDrafter(BaseDrafter):
    """Samples a tree from the toy draft model's q (`drafters.tree.sample_tree`): `width` children a
    node drawn without replacement, verified by recursive rejection. `draft_params` (default: the
    target's settings) is the transform q is taken under; any q keeps the output exact."""

    proposes_trees = samples_trees = True

    def __init__(self, draft, width=2, draft_params=None):
        self.draft, self.width, self.draft_params = draft, width, draft_params

    def reset(self, params, generator):
        self.params, self.gen = self.draft_params or params, generator

    def propose(self, context, gamma):
        q = lambda tokens: self.params.probs(self.draft.logits_for(tuple(tokens)))  # noqa: E731
        return sample_tree(q, context, gamma, self.width, self.gen)

    def accept(self, n):
        pass


@pytest.mark.statistical
@pytest.mark.parametrize("setting", SETTINGS)
def test_sampled_draft_trees_match_target_over_whole_sequences(setting):
    """Children drawn from the draft's q without replacement, tried in order against the target's
    residual (SpecInfer's multi-candidate speculative sampling): exact whole sequences."""
    assert whole_sequence_pvalue(SampledTreeDrafter, 4, SETTINGS[setting]) > 1e-3


@pytest.mark.statistical
def test_sampled_trees_from_a_differently_tempered_draft_match_target():
    drafter_for = lambda draft: SampledTreeDrafter(draft, 3, SamplingParams(temperature=2.0))  # noqa: E731
    assert whole_sequence_pvalue(drafter_for, 5, SETTINGS["temperature 0.7"]) > 1e-3


def test_greedy_output_through_sampled_trees_is_plain_greedy():
    """Greedy target, trees sampled at temperature 1 (so nodes have several children): every
    sequence is exactly the target's greedy one, and the trees were used (more than one token a
    call on average)."""
    target, draft = models()
    greedy = SamplingParams(temperature=0)
    plain = [t for step in autoregressive_decode(target, [0, 1], params=greedy, max_new_tokens=12) for t in step.tokens]
    for seed in range(20):
        drafter = SampledTreeDrafter(draft, 3, SamplingParams(temperature=1.0))
        steps = list(speculative_decode(target, drafter, [0, 1], gamma=5, params=greedy, max_new_tokens=12, seed=seed))
        assert [t for step in steps for t in step.tokens] == plain
    assert sum(len(s.proposed) for s in steps) > len(steps) and any(s.num_accepted for s in steps)


# The same check, run on deliberately broken loops, must fail: it has the power to catch them.

@pytest.mark.statistical
def test_check_fails_when_a_tree_walk_takes_the_first_child_on_a_miss(monkeypatch):
    walk = VERIFIER.walk_tree

    def first_child_on_a_miss(draft, logits, params, gen):
        new, path, betas = walk(draft, logits, params, gen)
        kids = [i for i, p in enumerate(draft.parents) if p == (path[-1] if path else -1)]
        if kids:  # the walk missed there: keep the first child's guess instead of the target's draw
            new[-1] = int(draft.tokens[0, kids[0]])
        return new, path, betas

    monkeypatch.setattr(VERIFIER, "walk_tree", first_child_on_a_miss)
    assert whole_sequence_pvalue(lambda draft: RandomTreeDrafter(), 4, SETTINGS["temperature 1"]) < 1e-6


@pytest.mark.statistical
def test_check_fails_when_a_tree_keeps_the_wrong_path(monkeypatch):
    keep = ToyCache.keep

    def first_nodes(self, start, slots):  # keeps the first nodes in the cache, not the accepted ones
        keep(self, start, list(range(start, start + len(slots))))

    monkeypatch.setattr(ToyCache, "keep", first_nodes)
    assert whole_sequence_pvalue(lambda draft: RandomTreeDrafter(), 4, SETTINGS["temperature 1"]) < 1e-6

@pytest.mark.statistical
def test_check_fails_when_a_sampled_tree_skips_the_residual(monkeypatch):
    def no_residual(kids, guesses, draft_probs, p, gen):  # after rejections, draws from p itself
        q = draft_probs[kids[0]]
        for k in kids:
            if float(torch.rand(1, generator=gen, dtype=torch.float64)) < float(p[guesses[k]] / q[guesses[k]]):
                return k, None, 0.0
        return None, int(sample(p, gen)), 0.0

    monkeypatch.setattr(VERIFIER, "try_children", no_residual)
    assert whole_sequence_pvalue(SampledTreeDrafter, 4, SETTINGS["temperature 1"]) < 1e-6


@pytest.mark.statistical
def test_check_fails_when_a_sampled_tree_is_cut_by_its_drawn_tokens():
    """Dropping unlikely drawn tokens (here: the tree ends before the first node whose token has
    q < 0.25) makes a child's presence depend on its own token: biased, and caught."""
    class CutByToken(SampledTreeDrafter):
        def propose(self, context, gamma):
            draft = super().propose(context, gamma)
            if not draft.gamma:
                return draft
            q_of_token = draft.probs[0].gather(-1, draft.tokens[0].unsqueeze(-1)).squeeze(-1).tolist()
            return draft.prefix(next((i for i, q in enumerate(q_of_token) if q < 0.25), draft.gamma))

    assert whole_sequence_pvalue(CutByToken, 4, SETTINGS["temperature 1"]) < 1e-6


@pytest.mark.statistical
def test_check_fails_when_a_sampled_tree_keeps_q_after_a_rejection(monkeypatch):
    """The second child was drawn from q without the first: comparing it with the full q is wrong."""
    try_children = VERIFIER.try_children

    def same_q(kids, guesses, draft_probs, p, gen):
        probs = draft_probs.clone()
        probs[kids[0]] = draft_probs[kids[0]] * 0.5 + 0.5 / draft_probs.shape[-1]  # q misstated
        return try_children(kids, guesses, probs, p, gen)

    monkeypatch.setattr(VERIFIER, "try_children", same_q)
    assert whole_sequence_pvalue(SampledTreeDrafter, 4, SETTINGS["temperature 1"]) < 1e-6


@pytest.mark.statistical
def test_check_fails_when_the_loop_skips_the_residual(monkeypatch):
    def no_residual(tokens, probs, target_probs, gen, lenience=1.0):
        verdict = verify(tokens, probs, target_probs, gen, lenience)
        rows = torch.arange(tokens.shape[0])
        n = verdict.num_accepted
        rejected = n < tokens.shape[1]
        redraw = sample(target_probs[rows, n], gen)
        verdict.tokens[rows, n] = torch.where(rejected, redraw, verdict.tokens[rows, n])
        return verdict

    monkeypatch.setattr(VERIFIER, "verify", no_residual)
    assert whole_sequence_pvalue(ModelDrafter, 3, SETTINGS["temperature 1"]) < 1e-6


@pytest.mark.statistical
def test_check_fails_when_the_target_cache_rolls_back_the_wrong_positions(monkeypatch):
    class WrongEndCache(ToyCache):
        def trim(self, n):  # drops the oldest positions instead of the rejected newest ones
            del self.tokens[:n]

    monkeypatch.setattr(ToyModel, "new_cache", lambda self: WrongEndCache() if self.base is None else ToyCache())
    assert whole_sequence_pvalue(ModelDrafter, 3, SETTINGS["temperature 1"]) < 1e-6


def test_a_cache_that_does_not_trim_is_caught(monkeypatch):
    monkeypatch.setattr(ToyCache, "trim", lambda self, n: None)
    with pytest.raises(RuntimeError, match="cache holds"):
        whole_sequence_pvalue(ModelDrafter, 3, SETTINGS["temperature 1"], samples=50)


@pytest.mark.statistical
def test_check_fails_when_every_draft_is_accepted(monkeypatch):
    def always_accept(tokens, probs, target_probs, gen, lenience=1.0):
        verdict = verify(tokens, probs, target_probs, gen, lenience)
        g = tokens.shape[1]
        bonus = sample(target_probs[:, g], gen)
        verdict.tokens = torch.cat([tokens, bonus.unsqueeze(1)], 1)
        verdict.num_accepted = torch.full_like(verdict.num_accepted, g)
        return verdict

    monkeypatch.setattr(VERIFIER, "verify", always_accept)
    assert whole_sequence_pvalue(ModelDrafter, 3, SETTINGS["temperature 1"]) < 1e-6
