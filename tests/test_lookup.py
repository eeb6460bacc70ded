from specdecode.drafters import PromptLookupDrafter


def proposal(context, gamma, **kwargs):
    return PromptLookupDrafter(**kwargs).propose(context, gamma).tokens[0].tolist()


def test_copies_what_followed_the_last_ngram():
    #           the suffix [7, 8] occurred at index 1, followed by 9, 10, 11
    context = [1, 7, 8, 9, 10, 11, 5, 7, 8]
    assert proposal(context, 3) == [9, 10, 11]
    assert proposal(context, 2) == [9, 10]


def test_prefers_the_longest_then_the_most_recent_match():
    context = [4, 2, 5, 6, 3, 2, 7, 7, 4, 2]
    # bigram [4, 2] matches at 0 (followed by 5); unigram [2] also at 5 (followed by 7): longer wins
    assert proposal(context, 1) == [5]
    context = [2, 5, 2, 6, 2]
    assert proposal(context, 1) == [6]  # most recent earlier occurrence of [2]


def test_proposal_may_run_into_the_suffix_and_stops_at_the_end():
    assert proposal([3, 3, 3], 4) == [3]  # [3, 3] at index 0 is followed by the final 3 only


def test_no_match_proposes_nothing():
    assert proposal([1, 2, 3, 4], 5) == []
    assert proposal([1], 5) == []


def test_min_ngram_limits_matches():
    assert proposal([9, 1, 2, 9], 2, min_ngram=2) == []
    assert proposal([9, 1, 2, 9], 2) == [1, 2]


def reference_proposal(context, gamma, max_ngram=3, min_ngram=1):
    """The definition, by brute force: longest suffix n-gram, its most recent earlier occurrence."""
    for n in range(min(max_ngram, len(context) - 1), min_ngram - 1, -1):
        starts = [s for s in range(len(context) - n) if context[s : s + n] == context[-n:]]
        if starts:
            return context[starts[-1] + n : starts[-1] + n + gamma]
    return []


def test_the_incremental_index_agrees_with_the_definition_as_the_context_grows_and_changes():
    import random

    rng = random.Random(0)
    drafter = PromptLookupDrafter()
    for trial in range(30):
        context = [rng.randrange(6) for _ in range(rng.randrange(1, 20))]  # often a new, unrelated context
        for _ in range(25):
            gamma = rng.randrange(0, 6)
            assert drafter.propose(context, gamma).tokens[0].tolist() == reference_proposal(context, gamma)
            context = context + [rng.randrange(6) for _ in range(rng.randrange(1, 4))]
