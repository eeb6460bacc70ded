"""Continuous batching (`specdecode.batch`) on toy models: each request's output is what it gets
alone, requests join and leave between steps, the planner's draft lengths follow the cost model,
and sampled output under batching keeps the target's distribution."""

import importlib

import pytest

from specdecode import LookupThenModelDrafter, ModelDrafter, PromptLookupDrafter, SamplingParams, speculative_decode
from specdecode.batch import Batch, generate_batch
from specdecode.gamma import AdaptiveGamma, FixedGamma, draft_lengths
from stats import chi2_pvalue
from test_generate import LetterTokenizer
from toy import ToyModel, sequence_distribution

VERIFIER = importlib.import_module("specdecode.verify")  # the module (the package exports its `verify` function)

GREEDY = SamplingParams(temperature=0)
SAMPLED = SamplingParams(temperature=1.0)


class PromptsInPieces(ToyModel):
    """A toy target whose prompts may join decode forwards in pieces (as the native backend's where
    its prompt rows are row-invariant): a toy's logits depend on the prefix alone."""

    row_invariant_prompts = True


def toy_pair(vocab_size=6, pieces=False):
    target = (PromptsInPieces if pieces else ToyModel)(vocab_size, seed=11)
    target.tokenizer = LetterTokenizer()
    return target, ToyModel(vocab_size, seed=12, scale=0.7, base=target)


def alone(target, prompt, drafter, **settings):
    return [t for step in speculative_decode(target, drafter, prompt, **settings) for t in step.tokens]


def adaptive(slope=0.2):
    """An adaptive policy over a measured-looking curve (T(k)/T(1) = 1 + slope (k - 1) for k rows),
    without profiling."""
    return AdaptiveGamma([0.0] + [1.0 + slope * k for k in range(10)], max_gamma=4)


REQUESTS = [  # (prompt, drafter kind, gamma, params, seed, max_new_tokens)
    ([0], "model", 3, GREEDY, None, 12),
    ([1, 2, 3, 1, 2], "lookup", 4, GREEDY, None, 9),
    ([2, 2], None, 0, GREEDY, None, 7),
    ([3], "model", 2, SAMPLED, 7, 10),
    ([4, 0, 4, 0], "model", 5, SamplingParams(temperature=0.7, top_k=3), 3, 11),
    ([5, 1], "lookup", 1, SamplingParams(top_p=0.8), 5, 8),
]


def make_drafter(kind, draft):
    return {"model": lambda: ModelDrafter(draft), "lookup": PromptLookupDrafter, None: lambda: None}[kind]()


@pytest.mark.parametrize("pieces", [False, True], ids=["prefill apart", "prompt pieces in the forward"])
@pytest.mark.parametrize("max_batch", [1, 2, 4, 8])
def test_every_request_gets_the_tokens_it_gets_alone(max_batch, pieces):
    """Greedy and seeded sampled requests with different prompts, drafters and gammas, batched in
    slots of max_batch, each equal to the same request decoded alone (fixed gamma: the same draws);
    prompts prefilled apart, or fed 2 tokens a step beside the decode rows."""
    target, draft = toy_pair(pieces=pieces)
    expected = [alone(target, p, make_drafter(kind, draft) or PromptLookupDrafter(), gamma=g, params=params,
                      seed=seed, max_new_tokens=n) for p, kind, g, params, seed, n in REQUESTS]
    batch = Batch(target, max_batch=max_batch, prompt_rows=2)
    requests = [batch.submit(p, make_drafter(kind, draft), gamma=g, params=params, seed=seed, max_new_tokens=n)
                for p, kind, g, params, seed, n in REQUESTS]
    most = 0
    for _ in iter(lambda: batch.done, True):
        batch.step()
        most = max(most, len(batch.active))
    assert most == min(max_batch, len(REQUESTS))
    for r, tokens in zip(requests, expected):
        assert r.stats.tokens == tokens and r.finish_reason == "length"
        assert r.text == LetterTokenizer().decode(tokens)


def test_requests_join_and_leave_between_steps():
    """A request submitted while others decode joins at the next step; a cancelled one frees its
    slot (and its cache) at once; the others are unaffected."""
    target, draft = toy_pair()
    batch = Batch(target, max_batch=2)
    first = batch.submit([0], ModelDrafter(draft), gamma=3, params=GREEDY, max_new_tokens=40)
    doomed = batch.submit([1], ModelDrafter(draft), gamma=3, params=GREEDY, max_new_tokens=40)
    waiting = batch.submit([2], ModelDrafter(draft), gamma=2, params=GREEDY, max_new_tokens=6)
    for _ in range(3):
        batch.step()
    assert batch.active == [first, doomed] and batch.waiting == [waiting]
    late = batch.submit([3], None, params=GREEDY, max_new_tokens=5)
    batch.cancel(doomed)
    assert doomed.finish_reason == "cancelled" and doomed.decoding is None and doomed not in batch.active
    batch.step()
    assert batch.active == [first, waiting] and batch.waiting == [late]
    for _ in batch.run():
        pass
    assert first.stats.tokens == alone(target, [0], ModelDrafter(draft), gamma=3, params=GREEDY, max_new_tokens=40)
    assert waiting.stats.tokens == alone(target, [2], ModelDrafter(draft), gamma=2, params=GREEDY, max_new_tokens=6)
    assert late.stats.tokens == alone(target, [3], PromptLookupDrafter(), gamma=0, params=GREEDY, max_new_tokens=5)
    assert 0 < len(doomed.stats.tokens) < 40


def test_a_failing_request_fails_alone():
    target, draft = toy_pair()

    class Broken(PromptLookupDrafter):
        def propose(self, context, gamma):
            raise RuntimeError("drafter exploded")

    batch = Batch(target, max_batch=4)
    good = batch.submit([0], ModelDrafter(draft), gamma=3, params=GREEDY, max_new_tokens=10)
    bad = batch.submit([1], Broken(), gamma=3, params=GREEDY, max_new_tokens=10)
    for _ in batch.run():
        pass
    assert bad.finish_reason == "error" and "drafter exploded" in bad.error
    assert good.finish_reason == "length" and len(good.stats.tokens) == 10


def test_bad_settings_are_refused_at_submit():
    target, _ = toy_pair()
    batch = Batch(target)
    with pytest.raises(ValueError, match="max_new_tokens"):
        batch.submit([0], max_new_tokens=0)
    with pytest.raises(ValueError, match="lenience"):
        batch.submit([0], lenience=2.0)
    with pytest.raises(ValueError, match="gamma"):
        batch.submit([0], PromptLookupDrafter(), gamma=-1)
    with pytest.raises(ValueError, match="max_batch"):
        Batch(target, max_batch=0)
    with pytest.raises(ValueError, match="prompt_rows"):
        Batch(target, prompt_rows=0)
    assert batch.done


def test_generate_batch_takes_per_prompt_settings():
    target, draft = toy_pair()
    prompts = [[0], [1, 2], [3]]
    out = generate_batch(target, prompts, lambda: ModelDrafter(draft), gamma=2, params=SAMPLED,
                         seed=[1, 2, 3], max_new_tokens=[5, 6, 7])
    for r, p, seed, n in zip(out, prompts, [1, 2, 3], [5, 6, 7]):
        assert r.stats.tokens == alone(target, p, ModelDrafter(draft), gamma=2, params=SAMPLED, seed=seed,
                                       max_new_tokens=n)
    with pytest.raises(ValueError, match="seed has 2 values for 3 prompts"):
        generate_batch(target, prompts, seed=[1, 2])


def test_batch_draft_lengths_shrink_as_the_batch_fills():
    """Under a curve that turns compute-bound, a lone request drafts long, a full batch drafts little
    or nothing; a poorly accepted request gets fewer tokens than a well accepted one."""
    curve = lambda k: 1.0 + 0.15 * (k - 1) if k <= 8 else 2.05 + 0.9 * (k - 8)  # noqa: E731
    good = adaptive()
    good.alpha = 0.9
    alone_plan = draft_lengths([good], [10], curve)[0]
    assert alone_plan == 4  # max_gamma: every row is nearly free
    many = [adaptive() for _ in range(16)]
    for p in many:
        p.alpha = 0.9
    assert sum(draft_lengths(many, [10] * 16, curve)) == 0  # 16 rows are past the knee already
    poor, rich = adaptive(), adaptive()
    poor.alpha, rich.alpha = 0.2, 0.9
    g_poor, g_rich = draft_lengths([poor, rich, *[adaptive() for _ in range(2)]], [10] * 4, curve)[:2]
    assert g_rich > g_poor
    fixed = draft_lengths([FixedGamma(3), good], [10, 10], curve)
    assert fixed[0] is None and fixed[1] >= 1
    assert draft_lengths([good], [0], curve) == [0]  # no room: no draft


@pytest.mark.statistical
def test_sampled_output_under_batching_with_planned_gamma_is_the_targets():
    """Requests sampled in batches of 8 with planned draft lengths (which differ from what each would
    plan alone) follow the target's distribution over whole sequences."""
    target = ToyModel(3, seed=1)
    draft = ToyModel(3, seed=2, scale=1.0, base=target)
    target.tokenizer = LetterTokenizer()
    batch = Batch(target, max_batch=8)
    requests = [batch.submit([0], ModelDrafter(draft), gamma=adaptive(0.03), params=SAMPLED, seed=i,
                             max_new_tokens=6)
                for i in range(2000)]
    drafted = set()
    for r, piece in batch.run():
        drafted.add(len(piece.step.proposed))
    assert len(drafted) > 2  # the planner varied the draft lengths
    expected = sequence_distribution(target, [0], SAMPLED, 6)
    assert chi2_pvalue([tuple(r.stats.tokens) for r in requests], expected) > 1e-3


@pytest.mark.statistical
def test_the_batched_check_catches_a_broken_verifier(monkeypatch):
    """The same check fails when every draft token is accepted."""
    real = VERIFIER.verify

    def accept_all(tokens, probs, target_probs, gen, lenience=1.0):
        verdict = real(tokens, probs, target_probs, gen, lenience)
        g = tokens.shape[1]
        verdict.tokens[:, :g] = tokens
        verdict.num_accepted[:] = g
        return verdict

    monkeypatch.setattr(VERIFIER, "verify", accept_all)
    target = ToyModel(3, seed=1)
    draft = ToyModel(3, seed=2, scale=1.0, base=target)
    target.tokenizer = LetterTokenizer()
    requests = generate_batch(target, [[0]] * 2000, lambda: ModelDrafter(draft), gamma=adaptive(0.03), params=SAMPLED,
                              seed=list(range(2000)), max_new_tokens=6)
    expected = sequence_distribution(target, [0], SAMPLED, 6)
    assert chi2_pvalue([tuple(r.stats.tokens) for r in requests], expected) < 1e-6


def test_a_short_prompt_behind_a_long_one_gets_its_first_token_first():
    """The prompt rows of a step go to the shortest prompts left first: a 2-token prompt queued behind a
    20-token one has its first token after one step, while the long one is still being fed; both end
    with the tokens they get alone."""
    target, draft = toy_pair(pieces=True)
    batch = Batch(target, max_batch=2, prompt_rows=4)
    long = batch.submit([1, 2, 3, 4, 5] * 4, None, params=GREEDY, max_new_tokens=4)
    short = batch.submit([5, 4], None, params=GREEDY, max_new_tokens=4)
    first = batch.step()
    assert [r for r, _ in first] == [short]
    assert len(long.decoding.cache) == 2  # the 2 rows the short prompt left
    while not batch.done:
        batch.step()
    for r in (long, short):
        assert r.stats.tokens == alone(target, r.prompt_ids, PromptLookupDrafter(), gamma=0, params=GREEDY,
                                       max_new_tokens=4)


def test_finished_and_cancelled_requests_leave_no_cache_behind():
    """Over a long run the batch holds only its active requests' caches: every other one is freed."""
    import gc
    import weakref

    target, draft = toy_pair(pieces=True)
    batch = Batch(target, max_batch=3, prompt_rows=2)
    caches, requests = [], []
    for i in range(60):
        requests.append(batch.submit([i % 6, (i + 1) % 6], ModelDrafter(draft), gamma=2, params=GREEDY,
                                     max_new_tokens=5 + i % 7))
    while not batch.done:
        batch.step()
        caches += [weakref.ref(r.decoding.cache) for r in batch.active]
        assert len(batch.active) <= 3 and len(batch._prefilling) <= 3
        if len(requests) > 40 and not requests[40].finished and requests[40].decoding is not None:
            batch.cancel(requests[40])
    gc.collect()
    assert all(c() is None for c in caches)
    assert requests[40].finish_reason == "cancelled" and all(r.finished for r in requests)


class FailsForOneRequest(ToyModel):
    """A toy target whose forward fails for one request's cache once that request has decoded a few
    tokens (a request whose state breaks the model), after writing to the cache, as a real failure may."""

    def forward(self, tokens, cache, **settings):
        logits = super().forward(tokens, cache, **settings)
        if cache.tokens[:3] == [5, 5, 5] and len(cache.tokens) > 6:
            raise RuntimeError("this request's state breaks the model")
        return logits


@pytest.mark.parametrize("gamma", [0, 2, "planned"])
def test_a_request_that_fails_the_batched_forward_fails_alone(gamma):
    target = FailsForOneRequest(6, seed=11)
    target.tokenizer = LetterTokenizer()
    draft = ToyModel(6, seed=12, scale=0.7, base=target)
    prompts = [[0], [1, 2, 3], [5, 5, 5], [2, 2], [4], [3, 1]]
    batch = Batch(target, max_batch=8)
    requests = [batch.submit(p, ModelDrafter(draft), gamma=adaptive() if gamma == "planned" else gamma,
                             params=GREEDY, max_new_tokens=10) for p in prompts]
    for _ in batch.run():
        pass
    bad = requests[2]
    assert bad.finish_reason == "error" and "breaks the model" in bad.error and bad.decoding is None
    for r, prompt in zip(requests, prompts):
        if r is not bad:
            expected = alone(target, prompt, ModelDrafter(draft), gamma=0 if gamma == "planned" else gamma,
                             params=GREEDY, max_new_tokens=10)
            assert r.finish_reason in ("eos", "length") and r.error is None and r.stats.tokens == expected


def test_lookup_then_model_requests_plan_each_source_with_its_own_policy(monkeypatch):
    """Batched requests whose drafter copies where the context repeats and asks a model elsewhere:
    the batch plans each with the policy of the source it will draft from, and greedy output is
    each request's own."""
    batch_module = importlib.import_module("specdecode.scheduler")
    planned = []  # per planning call: was every request's policy the one of the source it drafts from?

    def draft_lengths(policies, rooms, verify_cost, other_rows=0):
        decodings = [r.decoding for r in batch.active if r.decoding is not None and r.decoding.emitted]
        planned.append(all(any(p is d.policies.get(d.drafter.source(d.context)) for d in decodings)
                           for p in policies))
        return real(policies, rooms, verify_cost, other_rows)

    real = batch_module.draft_lengths
    monkeypatch.setattr(batch_module, "draft_lengths", draft_lengths)
    target, draft = toy_pair()
    prompts = [[1, 2, 3, 1, 2], [0], [2, 1, 2, 1, 3]]
    expected = [alone(target, p, PromptLookupDrafter(), gamma=0, params=GREEDY, max_new_tokens=14) for p in prompts]
    batch = Batch(target, max_batch=3)
    requests = [batch.submit(p, LookupThenModelDrafter(ModelDrafter(draft), min_match=1), gamma=adaptive(0.05),
                             params=GREEDY, max_new_tokens=14) for p in prompts]
    sources = set()
    for _ in iter(lambda: batch.done, True):
        batch.step()
        sources |= {key for r in batch.active if r.decoding is not None for key in r.decoding.policies}
    assert sources == {None, "lookup", "model"} and planned and all(planned)
    assert [r.stats.tokens for r in requests] == expected


def test_the_scheduler_admits_in_order_feeds_the_shortest_prompts_first_and_bounds_the_queue():
    from specdecode.scheduler import Scheduler

    scheduler = Scheduler(max_batch=3, prompt_rows=10, max_queue=2)
    waiting = ["a", "b", "c", "d"]
    assert scheduler.admit(waiting, active=["x"]) == ["a", "b"] and waiting == ["c", "d"]
    assert scheduler.admit(waiting, active=["x", "y", "z"]) == [] and waiting == ["c", "d"]
    # 10 prompt tokens a step: the shortest prompts left first, the last one cut to what remains
    assert scheduler.prompt_pieces([("long", 40), ("short", 3), ("mid", 6)]) == [("short", 3), ("mid", 6), ("long", 1)]
    assert scheduler.prompt_pieces([("long", 40)]) == [("long", 10)]
    # 3 decoding and 2 waiting fill it: the next one is refused, with the wait the queue needs to drain
    assert scheduler.refusal(4, 2.0) is None
    assert scheduler.refusal(5, 2.0) == (2, 2)  # 2 waiting: 3 rounds of 2 s over 3 slots
    with pytest.raises(ValueError, match="max_batch"):
        Scheduler(max_batch=0)
