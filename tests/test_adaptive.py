"""Adaptive gamma: the cost model's choices, and that adapting keeps decoding lossless."""

import math

import pytest
import torch

from specdecode import ModelDrafter, PromptLookupDrafter, SamplingParams, autoregressive_decode, speculative_decode
from specdecode.decode import Decoding
from specdecode.drafters import BaseDrafter, Draft
from specdecode.formulas import optimal_gamma
from specdecode.gamma import AdaptiveGamma
from specdecode.models.base import forward_batch
from stats import chi2_pvalue
from toy import SimulatedClock, ToyModel, sequence_distribution

FREE = [0.0] + [1.0] * 17  # verification as free as the paper assumes
LINEAR = [0.0] + [float(k) for k in range(1, 18)]  # verifying k tokens costs k steps: never worth it


def test_choice_matches_the_hardware_aware_optimum():
    curve = [0.0, 1.0, 1.7, 2.4, 3.0, 3.5, 4.0, 4.4, 4.9]
    for alpha in (0.2, 0.5, 0.8, 0.95):
        policy = AdaptiveGamma(curve, max_gamma=7, prior_alpha=alpha, prior_cost=0.02)
        assert policy.choose(100) == optimal_gamma(alpha, 0.02, 7, verify_cost=curve)[0]
    assert AdaptiveGamma(FREE, max_gamma=8, prior_alpha=0.9).choose(3) == 3  # capped by the room left


def test_each_plan_records_what_it_expects_of_its_call():
    """Step.forecast: the expected tokens and cost (one-token steps) of the plan the model chose;
    their ratio is the speedup it predicted, which the bench compares with the measured one."""
    curve = [0.0, 1.0, 1.7, 2.4, 3.0, 3.5, 4.0, 4.4, 4.9]
    policy = AdaptiveGamma(curve, max_gamma=7, prior_alpha=0.8, prior_cost=0.02)
    gamma = policy.choose(100)
    tokens, cost = policy.forecast
    assert tokens == pytest.approx((1 - 0.8 ** (gamma + 1)) / 0.2)
    assert cost == pytest.approx(curve[gamma + 1] + 0.02 * gamma)
    assert tokens / cost == pytest.approx(optimal_gamma(0.8, 0.02, 7, verify_cost=curve)[1])
    assert AdaptiveGamma(LINEAR, prior_alpha=0.3).choose(8) == 0
    policy = AdaptiveGamma(LINEAR, prior_alpha=0.3)
    policy.choose(8)
    assert policy.forecast == (1.0, 1.0)  # plain decoding: one token a step
    tree = AdaptiveGamma([0.0, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5], prior_cost=0.01)
    n = tree.tree_size([0.9, 0.8, 0.5, 0.3], 8)
    assert n == 3 and tree.forecast == pytest.approx((1 + 0.5 * (0.9 + 0.8 + 0.5), 1.3 + 3 * 0.01))


def test_the_stream_sums_the_forecasts_of_the_calls_the_model_planned():
    clock = SimulatedClock()
    target = ToyModel(6, seed=11, delay=0.002, clock=clock)
    draft = ToyModel(6, seed=12, scale=0.7, base=target, delay=0.0001, clock=clock)
    curve = [0.0, 1.0, 1.02, 1.04, 1.06, 1.08, 1.1, 1.12, 1.14]
    steps = list(speculative_decode(target, ModelDrafter(draft), [1, 2, 3], gamma=AdaptiveGamma(curve),
                                    params=SamplingParams(temperature=0), max_new_tokens=40, clock=clock))
    assert steps[0].forecast is None  # the prefill is not planned
    assert all(s.forecast is not None and s.forecast[0] >= 1 and s.forecast[1] >= 1 for s in steps[1:])
    assert any(s.forecast[0] > 1 for s in steps[1:])
    lookup = list(speculative_decode(target, PromptLookupDrafter(), [1, 2, 3], gamma=AdaptiveGamma(curve, prior_alpha=0.9),
                                     params=SamplingParams(temperature=0), max_new_tokens=40, clock=clock))
    empty = [s for s in lookup[1:] if not s.proposed]  # planned, but the lookup found nothing to copy
    assert empty and all(s.forecast == (1.0, 1.0) for s in empty)
    fixed = list(speculative_decode(target, ModelDrafter(draft), [1, 2, 3], gamma=2,
                                    params=SamplingParams(temperature=0), max_new_tokens=10))
    assert all(s.forecast is None for s in fixed)  # a fixed gamma predicts nothing


def test_estimates_follow_what_is_observed():
    policy = AdaptiveGamma(FREE, prior_alpha=0.5)
    for _ in range(50):
        policy.observe([0.0, 0.0], verified=3, target_seconds=0.02, draft_seconds=0.002, drafted=2)
    assert policy.alpha < 0.01 and policy.step_seconds == pytest.approx(0.02)
    assert policy.cost_ratio == pytest.approx(0.05, rel=0.01)
    assert policy.choose(10) == 0
    # probes cost at most shadow_budget (0.01) of a step on average: every ceil(c / 0.01) iterations
    policy.cost_ratio = 0.045
    assert [policy.shadow() for _ in range(30)].count(True) == 6  # c = 0.045: every fifth
    policy.cost_ratio = 0.005  # as cheap as prompt lookup: every iteration
    assert all(policy.shadow() for _ in range(10))
    policy.cost_ratio = 0.5  # a costly drafter (a draft model) is scored every 50th iteration: 1% of a step
    assert [policy.shadow() for _ in range(150)].count(True) == 3


def test_speculation_switches_off_when_it_cannot_win_and_back_on_when_it_can():
    # simulated time: a target call costs 4 ms, a draft forward 0.2 ms (c about 0.05), on any machine
    clock = SimulatedClock()
    target = ToyModel(6, seed=31, delay=0.004, clock=clock)
    draft = ToyModel(6, seed=32, scale=0.3, base=target, delay=0.0002, clock=clock)  # a good draft
    greedy = SamplingParams(temperature=0)
    policy = AdaptiveGamma(LINEAR, prior_alpha=0.9)
    off = list(speculative_decode(target, ModelDrafter(draft), [0], gamma=policy, params=greedy, max_new_tokens=40,
                                  clock=clock))
    assert all(step.proposed == [] for step in off)
    # shadow proposals were still scored, as often as the probe rule promises for the c it measured:
    # every ceil(c / shadow_budget) calls (c rises from the prior 0 to the measured value, so the
    # spacing only widens towards that bound)
    assert 0.03 < policy.cost_ratio <= 0.1
    probes = [i for i, step in enumerate(off) if step.betas]
    spacing = math.ceil(policy.cost_ratio / policy.shadow_budget)
    assert probes and probes[0] <= spacing and len(off) - 1 - probes[-1] < spacing
    assert max(b - a for a, b in zip(probes, probes[1:])) <= spacing
    assert len(probes) >= (len(off) - 1) // spacing
    on = list(speculative_decode(target, ModelDrafter(draft), [0], gamma=AdaptiveGamma(FREE, prior_alpha=0.0),
                                 params=greedy, max_new_tokens=40, clock=clock))
    assert on[0].proposed == [] and any(len(step.proposed) > 2 for step in on)  # starts off, learns, drafts


@pytest.mark.parametrize("drafter", ["model", "lookup"])
def test_adaptive_greedy_equals_plain_greedy(drafter):
    clock = SimulatedClock()
    target = ToyModel(6, seed=11, delay=0.002, clock=clock)  # a target step far dearer than a draft
    draft = ToyModel(6, seed=12, scale=0.7, base=target, delay=0.0001, clock=clock)
    greedy = SamplingParams(temperature=0)
    prompt = [1, 2, 3, 1, 2]
    expected = [t for s in autoregressive_decode(target, prompt, params=greedy, max_new_tokens=50) for t in s.tokens]
    d = ModelDrafter(draft) if drafter == "model" else PromptLookupDrafter()
    # verifying costs little here: the policy keeps drafting (and varying gamma) even for prompt lookup,
    # whose copies the toy target follows only by chance
    curve = [0.0, 1.0, 1.02, 1.04, 1.06, 1.08, 1.1, 1.12, 1.14]
    steps = list(speculative_decode(target, d, prompt, gamma=AdaptiveGamma(curve), params=greedy, max_new_tokens=50,
                                    clock=clock))
    assert [t for s in steps for t in s.tokens] == expected
    assert sum(s.num_accepted for s in steps) > 0 and len({len(s.proposed) for s in steps}) > 1  # it speculated, gamma varied


@pytest.mark.statistical
def test_adaptive_gamma_is_lossless_over_whole_sequences():
    """gamma changes from iteration to iteration (0 included): the output distribution must not."""
    target = ToyModel(3, seed=1)
    draft = ToyModel(3, seed=2, scale=1.0, base=target)
    params = SamplingParams(temperature=1.0)
    curve = [0.0, 1.0, 1.6, 1.65, 1.7, 1.75]  # makes the choice swing between 0 and several tokens
    gen = torch.Generator().manual_seed(0)
    outcomes, gammas = [], set()
    drafter = ModelDrafter(draft)
    class FreeDraft(AdaptiveGamma):  # toy draft steps cost as much as toy target steps: pretend they don't
        def observe(self, *args, **kwargs):
            super().observe(*args, **kwargs)
            self.cost_ratio = 0.0

    for _ in range(2000):
        policy = FreeDraft(curve, max_gamma=5, prior_alpha=0.5, decay=0.5)
        seq = []
        for step in speculative_decode(target, drafter, [0], gamma=policy, params=params, max_new_tokens=6,
                                       generator=gen):
            seq += step.tokens
            gammas.add(len(step.proposed))
        outcomes.append(tuple(seq))
    assert {0, 1} <= gammas and max(gammas) >= 2
    assert chi2_pvalue(outcomes, sequence_distribution(target, [0], params, 6)) > 1e-3


def test_invalid_policy_settings_are_refused():
    with pytest.raises(ValueError, match="max_gamma"):
        AdaptiveGamma(FREE, max_gamma=0)
    with pytest.raises(ValueError, match="decay"):
        AdaptiveGamma(FREE, decay=1.0)


def test_a_tree_is_cut_where_another_node_no_longer_pays_for_its_verification():
    policy = AdaptiveGamma([0.0, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9])  # each row costs 0.1 step
    reach = [0.9, 0.8, 0.5, 0.3, 0.2, 0.1]
    # the prior trusts half the drafter's estimate: (1 + 0.5 sum reach) / (1 + 0.1 n) peaks at n = 3 (1.62)
    assert policy.tree_size(reach, 8) == 3
    assert policy.tree_size(reach, 2) == 2  # never past the room left
    assert policy.tree_size([0.1, 0.05], 8) == 0  # plain decoding is better
    for _ in range(30):  # the estimates turn out right: trusted fully, (1 + sum) / (1 + 0.1 n) peaks at 4
        policy.observe_tree(2.0, 2)
    assert policy.tree_size(reach, 8) == 4


def test_verification_costs_follow_the_context_length():
    """Each verified row attends to every cached position: past the profiled context the curve
    rises, and the policy drafts less."""
    curve = [0.0, 1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.35, 1.4]
    policy = AdaptiveGamma(curve, prior_alpha=0.6, position_cost=0.001, profile_context=256)
    assert policy.verify_cost(4) == pytest.approx(1.15)  # at the profiled context: the curve itself
    short = policy.choose(8)
    policy.context_length = 2256  # 2000 more positions: a row's attention costs 2 of the old steps
    assert policy.verify_cost(4) == pytest.approx((1.15 + 4 * 2.0) / 3.0)
    assert policy.choose(8) < short
    assert AdaptiveGamma(curve, position_cost=-1.0).verify_cost(4) == pytest.approx(1.15)  # noise: no gain


def test_fresh_keeps_the_cost_model_and_resets_the_estimates():
    template = AdaptiveGamma([0.0, 1.0, 1.3, 1.7], max_gamma=3, prior_alpha=0.6, prior_cost=0.05, decay=0.8,
                             position_cost=0.001, profile_context=128)
    template.observe([1.0, 1.0], 3, 0.01, 0.001, 2)
    template.observe([0.0], 2, 0.01, 0.001, 1)
    fresh = template.fresh()
    assert (fresh.alpha, fresh.cost_ratio, fresh.step_seconds) == (0.6, 0.05, None)
    assert template.alpha != 0.6
    for name in ("verify_ratios", "max_gamma", "decay", "position_cost", "profile_context", "shadow_budget",
                 "_measured_step"):
        assert getattr(fresh, name) == getattr(template, name)
    assert [fresh.verify_cost(k) for k in range(1, 6)] == [template.verify_cost(k) for k in range(1, 6)]


class TwoSources(BaseDrafter):
    """Names its source by the context's parity: after an even length it proposes the target's own
    greedy continuation (`expected`), after an odd one a wrong token; each drafted token costs a
    fifth of a target step on the simulated clock."""

    def __init__(self, prompt, expected, vocab_size, clock):
        self.prompt, self.expected, self.vocab_size, self.clock = len(prompt), expected, vocab_size, clock

    def source(self, context):
        return "right" if len(context) % 2 == 0 else "wrong"

    def propose(self, context, gamma):
        done = len(context) - self.prompt
        tokens = self.expected[done : done + gamma]
        if self.source(context) == "wrong":
            tokens = [(t + 1) % self.vocab_size for t in tokens]
        self.clock.advance(0.0004 * len(tokens))
        return Draft(torch.tensor([tokens], dtype=torch.long))


def test_a_drafter_with_two_sources_gets_a_policy_for_each():
    """Each source's acceptance is learnt apart: the one that is always right drafts long, the one
    that is always wrong is switched off, and the output is plain greedy decoding."""
    clock = SimulatedClock()
    target = ToyModel(6, seed=11, delay=0.002, clock=clock)
    greedy = SamplingParams(temperature=0)
    prompt = [1, 2, 3]
    expected = [t for s in autoregressive_decode(target, prompt, params=greedy, max_new_tokens=60) for t in s.tokens]
    curve = [0.0, 1.0, 1.1, 1.2, 1.3, 1.4]  # each row a tenth of a step
    decoding = Decoding(target, TwoSources(prompt, expected, 6, clock), prompt, gamma=AdaptiveGamma(curve, max_gamma=4),
                        params=greedy, max_new_tokens=60, clock=clock)
    out, proposed = [], {"right": [], "wrong": []}
    while not decoding.finished:
        call = decoding.prepare()
        source = decoding.drafter.source(decoding.context)
        step = decoding.complete(forward_batch(target, [call])[0])
        out += step.tokens
        if len(out) > len(step.tokens):  # not the prefill
            proposed[source].append(len(step.proposed))
    assert out == expected
    right, wrong = decoding.policies["right"], decoding.policies["wrong"]
    # the wrong source is priced from its first drafting call on, so it stops after few samples: below the prior
    assert right.alpha > 0.8 and wrong.alpha < 0.4
    assert max(proposed["right"]) == 4 and 4 * sum(proposed["wrong"]) < sum(proposed["right"])


def test_a_draft_that_costs_more_than_it_brings_stops_after_one_call_and_is_probed_within_the_budget():
    """With T(1) known beforehand (the profile's), the first drafting call prices the draft: one
    that costs 0.8 of a target step at a prior acceptance of 0.5 is off from the next call on, and
    its probes then cost at most 2% of a step on average."""
    clock = SimulatedClock()
    target = ToyModel(6, seed=31, delay=0.010, clock=clock)
    draft = ToyModel(6, seed=33, delay=0.008, clock=clock)  # as slow as 0.8 of the target, and unrelated
    policy = AdaptiveGamma([0.0, 1.0, 1.02, 1.17, 1.42, 1.85, 2.3, 2.8, 3.3, 3.8], step_seconds=0.010)
    steps = list(speculative_decode(target, ModelDrafter(draft), [0], gamma=policy,
                                    params=SamplingParams(temperature=0), max_new_tokens=120, clock=clock))
    drafting = [i for i, s in enumerate(steps) if s.proposed]
    assert drafting == [1]  # the call after the prefill, at the prior; then never again
    assert policy.cost_ratio > 0.5
    spent = sum(s.draft_seconds for s in steps) / sum(s.target_seconds for s in steps)
    assert spent < 0.1  # the one drafting call and the probes (without the rule: every 16th call, ~6% alone)


def test_checking_each_draft_token_is_priced_beside_drafting_it():
    """Turning a further logits row into tokens (a sampled setting's controls, residual and draws)
    costs time the forward's profile does not hold. A policy measures it against a plain call's
    checking and plans with it: a draft that pays when checking is free stops when it is not."""
    curve = [0.0] + [1.0 + 0.05 * k for k in range(10)]
    free, costly = (AdaptiveGamma(curve, prior_alpha=0.6, step_seconds=0.01) for _ in range(2))
    for policy, per_token in ((free, 0.0), (costly, 0.01)):
        for _ in range(3):
            policy.observe([], 1, 0.0105, 0.0, 0, check_seconds=0.0005, checked=0)  # plain calls
            policy.observe([0.6, 0.6], 3, 0.0115 + 2 * per_token, 0.00005, 2,
                           check_seconds=0.0005 + 2 * per_token, checked=2)
    assert free.check_cost == pytest.approx(0.0, abs=1e-9) and costly.check_cost > 0.4
    assert costly.token_cost == pytest.approx(costly.cost_ratio + costly.check_cost)
    assert free.choose(8) >= 2 and costly.choose(8) == 0


def test_a_curve_the_calls_contradict_gives_way_to_what_they_measure():
    """A profile that prices four rows at 1.2 steps, where the calls take 1.8: with learn_curve the
    policy times its calls by their rows and prices them by that; drafting that paid on paper stops.
    Without it, the profile is used as it is."""
    curve = [0.0, 1.0, 1.1, 1.15, 1.2, 1.25, 1.3, 1.35, 1.4]
    learning, fixed = (AdaptiveGamma(curve, max_gamma=3, prior_alpha=0.3, step_seconds=0.01, learn_curve=learn)
                       for learn in (True, False))
    for policy in (learning, fixed):
        policy.observe([], 1, 0.01, 0.0, 0)  # the first call: warm-up, not timed
        for _ in range(10):
            policy.observe([], 1, 0.01, 0.0, 0)
            for rows, seconds in ((2, 0.014), (3, 0.016), (4, 0.018)):
                policy.observe([0.3] * (rows - 1), rows, seconds, 0.0, rows - 1)
    assert fixed.verify_cost(4) == pytest.approx(1.2) and fixed.choose(3) >= 1
    # ten calls of each size: 10/12 of the measured 1.8, 2/12 of the profile's 1.2
    assert learning.verify_cost(4) == pytest.approx(1.7) and learning.choose(3) == 0
    assert learning.fresh().learn_curve and learning.fresh().verify_cost(4) == pytest.approx(1.2)  # a new request
