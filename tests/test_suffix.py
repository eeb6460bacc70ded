"""The suffix drafter: what it proposes, its memory of earlier outputs, and that memory's bound."""

import random

import pytest

from specdecode import SamplingParams, autoregressive_decode, speculative_decode
from specdecode.drafters import SuffixCache, SuffixDrafter
from specdecode.drafters.suffix import SuffixTrie
from specdecode.stats import Stats
from toy import ToyModel

GREEDY = SamplingParams(temperature=0)


def proposal(drafter, context, gamma=8):
    return drafter.propose(context, gamma).tokens[0].tolist()


def chain_drafter(**options):
    return SuffixDrafter(trees=False, **options)


def test_it_proposes_the_most_frequent_continuation_of_the_longest_match():
    context = [1, 2, 3, 4, 9, 1, 2, 3, 4, 8, 1, 2, 3, 5, 7, 1, 2, 3]
    # [7, 1, 2, 3] never came before; [1, 2, 3] did, followed by 4 twice and 5 once; after [1, 2, 3, 4]
    # 9 and 8 once each (the first seen wins the tie), then 1. At most one token per matched token: 3.
    assert proposal(chain_drafter(), context) == [4, 9, 1]
    assert proposal(chain_drafter(), context, gamma=2) == [4, 9]
    assert proposal(chain_drafter(spec_factor=0.5), context) == [4]
    assert proposal(chain_drafter(min_count=2), context) == [4]  # 9 was seen once only
    assert proposal(chain_drafter(), [1, 2, 3]) == []  # nothing occurred twice


def test_a_tree_holds_the_likeliest_continuations_best_first():
    context = [1, 2, 3, 4, 9, 1, 2, 3, 4, 8, 1, 2, 3, 5, 7, 1, 2, 3]
    draft = SuffixDrafter().propose(context, 4)
    # after [1, 2, 3]: 4 (2/3), 5 (1/3); after [1, 2, 3, 4]: 9 and 8 (1/3 each); after [1, 2, 3, 5]: 7
    assert draft.tokens[0].tolist() == [4, 5, 9, 8] and draft.parents == [-1, -1, 0, 0]
    assert draft.chain().tokens[0].tolist() == [4, 9]
    deep = SuffixDrafter().propose(context, 8)  # no deeper than 3 (one token per matched token)
    assert deep.tokens[0].tolist() == [4, 5, 9, 8, 7, 1, 1, 1] and deep.parents == [-1, -1, 0, 0, 1, 2, 3, 4]


def test_a_match_at_the_depth_limit_keeps_drafting_from_a_shorter_suffix():
    text = [5, 6, 7, 8, 9, 10, 11, 12] * 3
    drafter = chain_drafter(depth=4, spec_factor=4.0)
    assert proposal(drafter, text[:-3], gamma=12) == (text * 2)[len(text) - 3 : len(text) + 9]


def test_earlier_outputs_are_proposed_to_later_requests_through_the_shared_cache():
    cache = SuffixCache(depth=8)
    first = SuffixDrafter(cache, trees=False)
    first.reset(GREEDY, None)
    first.begin([100, 101])
    prompt, output = [100, 101], [40, 41, 42, 43, 44, 45, 46]
    for n in range(1, len(output) + 1):
        first.propose(prompt + output[:n], 4)  # the loop calls it as the output grows
    second = SuffixDrafter(cache, trees=False)
    second.reset(GREEDY, None)
    assert proposal(second, [200, 41, 42]) == [43, 44]  # a match of 2 tokens drafts 2
    assert proposal(chain_drafter(), [200, 41, 42]) == []  # without the cache nothing is known
    assert [o.tokens for o in cache.outputs] == [output]  # the prompt stays out


def rebuilt(outputs, depth):
    trie = SuffixTrie(depth)
    for tokens in outputs:
        ends = []
        for token in tokens:
            ends = trie.extend(ends, token)
    return trie


def paths(node, prefix=()):
    out = {prefix: node.count} if prefix else {}
    for token, child in node.children.items():
        out.update(paths(child, prefix + (token,)))
    return out


def test_the_shared_cache_stays_within_its_node_bound_and_forgets_exactly_what_it_evicts():
    rng = random.Random(0)
    cache = SuffixCache(depth=6, max_nodes=400)
    for _ in range(30):
        drafter = SuffixDrafter(cache)
        drafter.reset(GREEDY, None)
        context = [rng.randrange(5)]
        for _ in range(40):
            context.append(rng.randrange(8))
            drafter.propose(context, 3)
        assert cache.trie.nodes <= 400
    kept = [o.tokens for o in cache.outputs]
    assert 1 < len(kept) < 30  # old outputs were evicted, recent ones kept
    fresh = rebuilt(kept, 6)
    assert paths(cache.trie.root) == paths(fresh.root) and cache.trie.nodes == fresh.nodes


@pytest.mark.parametrize("trees", [False, True])
def test_greedy_suffix_drafting_equals_plain_greedy_and_remembers_across_requests(trees):
    target = ToyModel(6, seed=21)
    accepted = {}
    for cache in (None, SuffixCache(depth=8)):
        for number, prompt in enumerate(([1, 2, 3], [1, 2, 3], [4, 2, 3])):  # the second repeats the first
            expected = [t for s in autoregressive_decode(target, prompt, params=GREEDY, max_new_tokens=30)
                        for t in s.tokens]
            steps = list(speculative_decode(target, SuffixDrafter(cache, trees=trees), prompt, gamma=4,
                                            params=GREEDY, max_new_tokens=30))
            assert [t for s in steps for t in s.tokens] == expected
            accepted[cache is not None, number] = sum(s.num_accepted for s in steps)
    # the repeated request drafts its remembered output; the toy's output does not repeat within one
    assert accepted[True, 1] >= 15 and accepted[False, 1] <= 10


def test_tree_statistics_count_nodes_verified_and_the_depth_kept():
    """Stats over tree steps: nodes verified per call, the kept path's depth, acceptance per depth."""
    target, cache = ToyModel(6, seed=21), SuffixCache(depth=8)
    for _ in range(2):  # the second request finds the first's output in the shared cache
        stats = Stats()
        for step in speculative_decode(target, SuffixDrafter(cache, trees=True), [1, 2, 3], gamma=4,
                                       params=GREEDY, max_new_tokens=30):
            stats.add(step)
    drafted = [(nodes, depth) for nodes, depth in stats.calls if nodes]
    assert stats.tree_drafts == stats.drafts == len(drafted) > 0 and len(stats.calls) == stats.target_calls
    assert stats.proposed == sum(n for n, _ in drafted) and stats.accepted == sum(d for _, d in drafted) > 0
    depths = [d for _, d in drafted]
    assert stats.acceptance_per_depth == [sum(d > i for d in depths) / len(depths) for i in range(max(depths))]
    assert stats.summary()["calls"] == stats.calls


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="spec_factor must be > 0"):
        SuffixDrafter(spec_factor=0)
    with pytest.raises(ValueError, match="min_count must be >= 1"):
        SuffixDrafter(min_count=0)
    with pytest.raises(ValueError, match="max_nodes must be >= 1"):
        SuffixCache(max_nodes=0)
    with pytest.raises(ValueError, match="suffix depth must be >= 2"):
        SuffixDrafter(depth=1)


@pytest.mark.parametrize("enabled", [True, False])
def test_indexing_pauses_the_garbage_collector_and_restores_it_as_it_was(enabled, monkeypatch):
    import gc

    from specdecode.drafters import suffix

    states = []
    real_extend = SuffixTrie.extend
    monkeypatch.setattr(SuffixTrie, "extend", lambda self, ends, token: (states.append(gc.isenabled()),
                                                                         real_extend(self, ends, token))[1])
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        cache = SuffixCache()
        drafter = SuffixDrafter(cache)
        assert proposal(drafter, [1, 2, 3, 1, 2]) == [3, 1]
        assert gc.isenabled() == enabled
        with pytest.raises(RuntimeError):  # restored on the way out of an error too
            with suffix.gc_paused():
                raise RuntimeError
        assert gc.isenabled() == enabled
    finally:
        (gc.enable if was else gc.disable)()
    assert states and not any(states)  # every node added (local and shared tries) with the collector off
