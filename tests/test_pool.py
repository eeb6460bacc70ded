"""The shared n-gram pool (`drafters.pool`) and the drafter that chooses among model-free sources per
call (`drafters.auto`): the table's bounds, its acceptance statistics, exactness, and the choice."""

import random

import numpy as np
import pytest
from toy import ToyModel

from specdecode import SamplingParams, autoregressive_decode, lossless, speculative_decode
from specdecode.drafters.auto import GENERIC_CURVE, AutoDrafter
from specdecode.drafters.pool import NgramPool, PoolDrafter, ngram_hash, window_hashes
from specdecode.gamma import AdaptiveGamma

GREEDY = SamplingParams(temperature=0)


def chain(pool, tail, budget=8):
    tokens, _, reach = pool.chain(tail, budget, min_reach=0.0)
    return tokens, reach


def drive(drafter, prompt, output, gamma=8):
    """Decode `output` after `prompt` as a greedy target whose answer it is would: each call the
    drafter names its source and proposes; the tokens that agree with the output are kept, plus
    one. Returns (source, accepted) per call."""
    drafter.reset(GREEDY, None)
    drafter.begin(prompt)
    context, calls = list(prompt), []
    end = len(prompt) + len(output)
    truth = list(prompt) + list(output)
    while len(context) < end:
        source = drafter.source(context)
        proposal = drafter.propose(context, min(gamma, end - len(context) - 1)).tokens[0].tolist()
        n = 0
        while n < len(proposal) and proposal[n] == truth[len(context) + n]:
            n += 1
        calls.append((source, n))
        context = truth[: len(context) + n + 1]
    drafter.propose(context, 1)  # the last tokens reach the pool
    return calls


# -- the table --


def test_window_hashes_agree_with_the_scalar_hash_and_the_order_salts_keep_orders_apart():
    ids = np.array([5, 1, 49151, 7, 0, 3, 3, 9], dtype=np.uint64)
    for n in (1, 2, 4):
        assert window_hashes(ids, n).tolist() == [ngram_hash(ids[i : i + n].tolist()) for i in range(len(ids) - n + 1)]
    pool = NgramPool(1 << 10, orders=(4, 2))
    pool.feed([1, 2, 3, 4, 5])
    assert chain(pool, [1, 2, 3, 4], 1)[0] == [5]  # order 4
    assert chain(pool, [9, 9, 3, 4], 1)[0] == [5]  # order 2, where order 4 has never seen the context
    assert chain(pool, [9, 9, 9, 4], 1)[0] == []


def test_it_drafts_a_chain_as_far_as_the_table_carries_and_follows_cycles():
    pool = NgramPool(1 << 12, orders=(3,))
    text = [10, 11, 12, 13, 14, 15]
    pool.feed(text * 2)  # a repeated phrase: the table knows what follows every window, wrapping round
    tokens, reach = chain(pool, [13, 14, 15], 20)
    assert tokens == (text * 5)[:20]
    assert all(a > b for a, b in zip(reach, reach[1:]))  # each further token is less likely to be reached


def test_memory_is_fixed_and_collisions_stay_bounded():
    pool = NgramPool(1 << 10, orders=(4, 2))
    shapes, nbytes = [a.shape for a in (pool.keys, pool.tokens, pool.counts, pool.hits, pool.tries)], pool.nbytes
    rng = random.Random(0)
    fed = set()
    for _ in range(200):  # far more n-grams than slots
        seq = [rng.randrange(5000) for _ in range(60)]
        pool.feed(seq)
        fed.update(tuple(seq[i : i + 2]) for i in range(len(seq) - 2))
    assert [a.shape for a in (pool.keys, pool.tokens, pool.counts, pool.hits, pool.tries)] == shapes
    assert pool.nbytes == nbytes == (1 << 10) * 18
    assert pool.used <= pool.slots and pool.used == np.count_nonzero(pool.keys)
    assert pool.used > 0.9 * pool.slots  # the table is full: every query lands on a used slot
    # a context never fed finds a used slot nearly always, but its fingerprint only by a 2^-31 chance
    false = 0
    for _ in range(5000):
        tail = [rng.randrange(5000, 9000) for _ in range(4)]
        false += bool(chain(pool, tail, 1)[0])
    assert false == 0


def test_a_continuation_takes_an_entry_over_only_when_it_wins_the_vote():
    pool = NgramPool(1 << 10, orders=(2,))
    for _ in range(3):
        pool.feed([1, 2, 3])
    pool.feed([1, 2, 4])
    assert chain(pool, [1, 2], 1)[0] == [3]  # seen 3 times against once
    for _ in range(3):
        pool.feed([1, 2, 4])
    assert chain(pool, [1, 2], 1)[0] == [4]


def test_acceptance_statistics_move_the_drafts():
    pool = NgramPool(1 << 10, orders=(2,))
    pool.feed([1, 2, 3, 4, 5, 6, 7])
    _, fresh = chain(pool, [1, 2], 5)
    guesses = pool.chain([1, 2], 5, 0.0)[1]
    for _ in range(5):  # its guesses keep proving right
        pool.score(guesses, [True] * 5)
    _, rewarded = chain(pool, [1, 2], 5)
    assert all(r > f for r, f in zip(rewarded, fresh)) and rewarded[-1] > 0.7
    for _ in range(8):  # the first guess keeps proving wrong
        pool.score(guesses[:1], [False])
    _, decayed = chain(pool, [1, 2], 5)
    assert decayed[0] < 0.6 * fresh[0] and fresh[0] > 0.4
    assert pool.chain([1, 2], 5, min_reach=0.4)[0] == []  # now too unlikely to draft at all


def test_a_request_scores_what_the_pool_guessed_for_it_against_what_was_emitted():
    pool = NgramPool(1 << 10, orders=(2,))
    pool.feed([7, 8, 1, 2, 3])  # an earlier request: after 1 2 came 3
    drafter = PoolDrafter(pool)
    drive(drafter, [1, 2], [9, 1, 2, 9])  # this one continues 1 2 with 9: the guess 3 proves wrong
    assert pool.prior_hits[0][0] / pool.prior_tries[0][0] < 0.5  # counted against entries of its kind
    assert chain(pool, [1, 2], 1)[0] == [9]  # and what was emitted took the entry over
    ok = PoolDrafter(pool)
    drive(ok, [5, 6], [5, 6, 5, 6, 5, 6, 5, 6])  # right guesses raise the record of their order
    assert pool.prior_hits[0][0] / pool.prior_tries[0][0] > 0.5


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="power of two"):
        NgramPool(1000)
    with pytest.raises(ValueError, match="orders"):
        NgramPool(1 << 4, orders=(0,))
    with pytest.raises(ValueError, match="decay"):
        NgramPool(1 << 4, decay=1.0)
    with pytest.raises(ValueError, match="unknown sources"):
        AutoDrafter(sources=("lookup", "model"))


# -- exactness --


def toy_pool():
    return NgramPool(1 << 8, orders=(2, 1))


@pytest.mark.parametrize("make", [lambda pool: PoolDrafter(pool),
                                  lambda pool: AutoDrafter(pool, budget=3)], ids=["pool", "auto"])
def test_greedy_output_equals_plain_greedy_and_a_repeated_request_drafts_from_the_pool(make):
    target = ToyModel(6, seed=21)
    pool = NgramPool(1 << 12)
    accepted = []
    for prompt in ([1, 2, 3], [1, 2, 3], [4, 2, 3]):  # the second repeats the first
        plain = autoregressive_decode(target, prompt, params=GREEDY, max_new_tokens=30)
        expected = [t for s in plain for t in s.tokens]
        steps = list(speculative_decode(target, make(pool), prompt, gamma=4, params=GREEDY, max_new_tokens=30))
        assert [t for s in steps for t in s.tokens] == expected
        accepted.append(sum(s.num_accepted for s in steps))
    assert accepted[1] >= 20 and accepted[0] <= 10  # the toy's output does not repeat within one request


def sampled_pvalue(drafter, gamma, params):
    """The kit's whole-sequence chi-square test on its toy target, through a gamma policy (an int or
    an AdaptiveGamma)."""
    return lossless.whole_sequence_pvalue(drafter, lossless.toy_world().target, gamma, params)


@pytest.mark.statistical
@pytest.mark.parametrize("make", [lambda: PoolDrafter(toy_pool()),
                                  lambda: AutoDrafter(toy_pool(), budget=4)], ids=["pool", "auto"])
def test_drafts_from_a_pool_that_learns_from_every_sample_match_the_target_over_whole_sequences(make):
    """One drafter (and one pool) for every sample: drafts that depend on every earlier sample, never
    on the one being drawn. Planned by an adaptive policy for each source, and at a fixed gamma."""
    policy = AdaptiveGamma(GENERIC_CURVE, max_gamma=4)
    assert sampled_pvalue(make(), policy, SamplingParams(temperature=1.0)) > 1e-3
    assert sampled_pvalue(make(), 3, SamplingParams(temperature=0.7)) > 1e-3
    with lossless.accept_everything():  # the check has power over these drafts
        assert sampled_pvalue(make(), 3, SamplingParams(temperature=1.0)) < 1e-6


@pytest.mark.slow
def test_greedy_output_on_the_default_model_equals_plain_greedy_with_and_without_the_pool():
    from realmodel import COPY_PROMPT

    from specdecode.models.load import load_model
    from specdecode.prompts import encode_prompt

    target = load_model(None)
    pool = NgramPool()
    prompts = [encode_prompt(target.tokenizer, COPY_PROMPT), encode_prompt(target.tokenizer, "Name three rivers.")]
    policy = AdaptiveGamma(GENERIC_CURVE, max_gamma=8)
    for make in (lambda: PoolDrafter(pool), lambda: AutoDrafter(pool, pricing=policy)):
        result = lossless.greedy_identity(target, make, prompts + prompts, gamma=policy.fresh(), max_new_tokens=40)
        assert result.passed, result
        assert float(result.note.split()[0]) > 1.5  # tokens a target call: the repeated requests drafted


# -- the choice --


def test_the_chooser_copies_with_lookup_on_a_prompt_the_answer_copies():
    """An answer that copies its prompt, on a pool that has served other requests: lookup finds the
    copy (the pool, fed this prompt too, offers nothing more) and drafts it, several tokens a call."""
    rng = random.Random(1)
    pool = NgramPool(1 << 14)
    for _ in range(3):
        drive(AutoDrafter(pool), [rng.randrange(2000) for _ in range(20)], [rng.randrange(2000) for _ in range(30)])
    passage = [rng.randrange(100, 1000) for _ in range(60)]
    drafter = AutoDrafter(pool)
    calls = drive(drafter, passage, passage[10:50])
    assert drafter.chosen["lookup"] >= 4 and drafter.chosen["pool"] == 0
    assert sum(n for _, n in calls) >= 30


def test_the_chooser_drafts_a_repeated_request_from_the_pool():
    """The same prompt again: its answer is not in the prompt, lookup finds little, the pool holds
    the whole earlier answer, and drafts it."""
    rng = random.Random(2)
    pool = NgramPool(1 << 14)
    prompt, answer = [rng.randrange(1000) for _ in range(30)], [rng.randrange(1000, 2000) for _ in range(60)]
    first = AutoDrafter(pool)
    drive(first, prompt, answer)
    again = AutoDrafter(pool)
    calls = drive(again, prompt, answer)
    assert again.chosen["pool"] > 3 * again.chosen["lookup"]
    assert len(calls) < len(answer) / 4  # most of the answer drafted, several tokens a call
