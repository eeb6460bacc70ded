"""The decode loop on toy models: greedy identity, stopping, errors, the step stream."""

import pytest
import torch

from specdecode import (ModelDrafter, PromptLookupDrafter, SamplingParams, autoregressive_decode,
                        speculative_decode)
from specdecode.models.base import VocabularyMismatch
from toy import ToyModel

GREEDY = SamplingParams(temperature=0)


def tokens_of(steps):
    return [t for step in steps for t in step.tokens]


def toy_pair(vocab_size=6, eos=()):
    target = ToyModel(vocab_size, seed=11, eos_token_ids=eos)
    draft = ToyModel(vocab_size, seed=12, scale=0.7, base=target, eos_token_ids=eos)
    return target, draft


@pytest.mark.parametrize("gamma", [1, 2, 4, 7])
@pytest.mark.parametrize("drafter_kind", ["model", "lookup"])
def test_greedy_speculative_equals_greedy_autoregressive(gamma, drafter_kind):
    target, draft = toy_pair()
    drafter = ModelDrafter(draft) if drafter_kind == "model" else PromptLookupDrafter()
    prompt = [1, 2, 3, 1, 2]
    expected = tokens_of(autoregressive_decode(target, prompt, params=GREEDY, max_new_tokens=40))
    steps = list(speculative_decode(target, drafter, prompt, gamma=gamma, params=GREEDY, max_new_tokens=40))
    assert tokens_of(steps) == expected
    assert len(expected) == 40
    assert any(step.num_accepted > 0 for step in steps)  # the draft really contributed
    for step in steps[:-1]:  # every call but the last (cut at the limit) adds exactly one target token
        assert len(step.tokens) == step.num_accepted + 1


def test_each_step_is_one_target_call_with_one_to_gamma_plus_one_tokens():
    target, draft = toy_pair()
    target.calls = 0
    steps = list(speculative_decode(target, ModelDrafter(draft), [0, 4], gamma=3, params=GREEDY, max_new_tokens=30))
    assert target.calls == len(steps)  # the first call is the prefill, with a draft already
    for step in steps:
        assert 1 <= len(step.tokens) <= 4
        assert step.from_draft == [True] * step.num_accepted + [False] * (len(step.tokens) - step.num_accepted)
        assert step.proposed[: step.num_accepted] == step.tokens[: step.num_accepted]
        if step.rejected:
            assert step.rejected[0] != step.tokens[step.num_accepted]  # greedy: the correction differs


def test_max_new_tokens_is_exact_and_no_draft_is_wasted_past_it():
    target, draft = toy_pair()
    for limit in (1, 2, 5, 13):
        steps = list(speculative_decode(target, ModelDrafter(draft), [0], gamma=4, params=GREEDY,
                                        max_new_tokens=limit))
        assert len(tokens_of(steps)) == limit
        assert steps[-1].finish_reason == "length"
        emitted = 0
        for step in steps:
            assert len(step.proposed) <= limit - emitted - 1
            emitted += len(step.tokens)


def test_eos_stops_generation_and_is_the_last_token():
    target, draft = toy_pair(eos=(3,))
    for steps in (
        list(speculative_decode(target, ModelDrafter(draft), [0], gamma=4, params=SamplingParams(), seed=5,
                                max_new_tokens=200)),
        list(autoregressive_decode(target, [0], params=SamplingParams(), seed=5, max_new_tokens=200)),
    ):
        out = tokens_of(steps)
        assert out[-1] == 3 and 3 not in out[:-1]
        assert steps[-1].finish_reason == "eos"


def test_context_window_is_respected():
    target, draft = toy_pair()
    target.max_positions = 12
    out = tokens_of(speculative_decode(target, ModelDrafter(draft), [0, 1], gamma=4, params=GREEDY,
                                       max_new_tokens=100))
    assert len(out) == 10
    with pytest.raises(ValueError, match="context holds at most 12"):
        list(speculative_decode(target, ModelDrafter(draft), list(range(5)) * 3, params=GREEDY))


def test_seed_makes_sampling_reproducible():
    target, draft = toy_pair()

    def run(seed):
        return tokens_of(speculative_decode(target, ModelDrafter(draft), [0], gamma=3, params=SamplingParams(),
                                            seed=seed, max_new_tokens=30))

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_different_vocabularies_are_refused_naming_both():
    target = ToyModel(6, name="target-vocab")
    draft = ToyModel(7, name="draft-vocab")
    with pytest.raises(VocabularyMismatch, match="target vocabulary target-vocab.*draft vocabulary draft-vocab"):
        next(speculative_decode(target, ModelDrafter(draft), [0]))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(gamma=-1), "gamma"),
        (dict(gamma=1.5), "gamma"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(lenience=0.0), "lenience"),
        (dict(lenience=2.0), "lenience"),
    ],
)
def test_invalid_arguments_are_refused(kwargs, message):
    target, draft = toy_pair()
    with pytest.raises(ValueError, match=message):
        next(speculative_decode(target, ModelDrafter(draft), [0], **kwargs))


def test_empty_prompt_is_refused():
    target, draft = toy_pair()
    with pytest.raises(ValueError, match="prompt has no tokens"):
        next(speculative_decode(target, ModelDrafter(draft), []))
    with pytest.raises(ValueError, match="prompt has no tokens"):
        next(autoregressive_decode(target, []))


def test_stopping_early_then_starting_again_is_clean():
    target, draft = toy_pair()
    drafter = ModelDrafter(draft)
    stream = speculative_decode(target, drafter, [0], gamma=3, params=GREEDY, max_new_tokens=50)
    next(stream)
    stream.close()  # the consumer walks away mid-generation
    full = tokens_of(speculative_decode(target, drafter, [0], gamma=3, params=GREEDY, max_new_tokens=50))
    assert full == tokens_of(autoregressive_decode(target, [0], params=GREEDY, max_new_tokens=50))


def test_lenient_greedy_is_still_greedy():
    target, draft = toy_pair()
    spec = tokens_of(speculative_decode(target, ModelDrafter(draft), [0], gamma=3, params=GREEDY, lenience=0.3,
                                        max_new_tokens=30))
    assert spec == tokens_of(autoregressive_decode(target, [0], params=GREEDY, max_new_tokens=30))


def test_betas_are_the_acceptance_probabilities_of_the_kept_positions():
    target, draft = toy_pair()
    for step in speculative_decode(target, ModelDrafter(draft), [0], gamma=3, params=GREEDY, max_new_tokens=40):
        # greedy: beta is 1 where the draft matched the argmax, 0 at the first mismatch
        assert step.betas == [1.0] * step.num_accepted + [0.0] * (len(step.betas) - step.num_accepted)
        assert len(step.betas) == min(step.num_accepted + 1, len(step.proposed))
    betas = [b for step in speculative_decode(target, ModelDrafter(draft), [0], gamma=3, params=SamplingParams(),
                                               seed=1, max_new_tokens=200) for b in step.betas]
    assert all(0.0 < b < 1.0 for b in betas) and len(betas) > 50


def test_draft_confidence_stops_proposals_early_and_keeps_greedy_output():
    target, draft = toy_pair()
    expected = tokens_of(autoregressive_decode(target, [0], params=GREEDY, max_new_tokens=40))
    steps = list(speculative_decode(target, ModelDrafter(draft, min_confidence=0.6), [0], gamma=6, params=GREEDY,
                                    max_new_tokens=40))
    assert tokens_of(steps) == expected
    lengths = {len(s.proposed) for s in steps[1:-2]}  # the prefill (steps[0]) goes without a draft
    assert min(lengths) >= 1 and min(lengths) < 6  # some proposals were cut short by the draft itself
    with pytest.raises(ValueError, match="min_confidence"):
        ModelDrafter(draft, min_confidence=1.0)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0), SamplingParams(temperature=0.8, top_k=5)])
def test_a_step_with_nothing_to_verify_scores_the_shadow_proposal_like_the_verifier(params):
    """With gamma = 0 the loop skips the verifier; the shadow proposal's beta must still be
    sum_x min(p, q), for a point-mass proposal and for a proposal with its own q."""
    from specdecode.verify import _plain
    from specdecode.drafters.base import Draft
    from specdecode.verify import acceptance

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 12, generator=gen) * 2  # [1, V]
    p = params.probs(logits)[0]  # [V]
    q = torch.softmax(torch.randn(12, generator=gen), -1)  # [V]
    for token in range(12):
        point = Draft(torch.tensor([[token]]))
        spread = Draft(torch.tensor([[token]]), q.view(1, 1, 12))
        for shadow, expected in ((point, p[token]), (spread, acceptance(p, q))):
            new, _, betas = _plain(logits, params, torch.Generator().manual_seed(1), shadow)
            assert len(new) == 1 and betas == pytest.approx([float(expected)], abs=1e-6)
    new, _, betas = _plain(logits, params, torch.Generator().manual_seed(1), None)
    assert betas == [] and (not params.is_greedy or new == [int(logits.argmax())])


@pytest.mark.parametrize("with_probs", [False, True])
def test_the_greedy_shortcut_gives_what_the_verifier_gives(with_probs):
    """Greedy targets skip the verifier's full-vocabulary work; the outcome (tokens, accepted count,
    betas) must be the verifier's, at any lenience, for point-mass drafts and drafts with a q."""
    from specdecode.verify import _greedy
    from specdecode.drafters.base import Draft
    from specdecode.verify import draft_acceptance, verify

    gen = torch.Generator().manual_seed(3)
    greedy = SamplingParams(temperature=0)
    outcomes = set()
    for trial in range(200):
        g = 1 + trial % 4
        logits = torch.randn(1, g + 1, 7, generator=gen)
        best = logits[0].argmax(-1)
        tokens = torch.where(torch.rand(g, generator=gen) < 0.6, best[:g], torch.randint(0, 7, (g,), generator=gen))
        probs = torch.softmax(torch.randn(1, g, 7, generator=gen), -1) if with_probs else None
        fast, n, betas = _greedy(Draft(tokens.unsqueeze(0), probs), logits, greedy)
        target = greedy.probs(logits)
        verdict = verify(tokens.unsqueeze(0), probs, target, gen, lenience=0.5 if trial % 2 else 1.0)
        kept = min(n + 1, g)
        assert fast == verdict.emitted(0) and n == int(verdict.num_accepted[0])
        assert betas == pytest.approx(draft_acceptance(tokens[:kept], None if probs is None else probs[0, :kept],
                                                       target[0, :kept]).tolist())
        outcomes.add(n)
    assert outcomes == {0, 1, 2, 3, 4}  # every accepted count was exercised
