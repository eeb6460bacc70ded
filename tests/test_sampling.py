import math

import pytest
import torch

from specdecode.sampling import SamplingParams, sample


def test_temperature_one_is_softmax():
    logits = torch.tensor([1.0, 2.0, 0.5])
    assert torch.allclose(SamplingParams().probs(logits), torch.softmax(logits, -1))


def test_temperature_scales_logits():
    logits = torch.tensor([1.0, 2.0, 0.5])
    assert torch.allclose(SamplingParams(temperature=0.5).probs(logits), torch.softmax(logits / 0.5, -1))


def test_zero_temperature_is_greedy_with_lowest_id_on_ties():
    params = SamplingParams(temperature=0.0)
    assert params.is_greedy
    probs = params.probs(torch.tensor([[0.1, 3.0, 3.0, -1.0]]))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_top_k_keeps_k_most_likely():
    probs = SamplingParams(top_k=2).probs(torch.tensor([1.0, 3.0, 2.0, 0.0]))
    expected = torch.softmax(torch.tensor([3.0, 2.0]), -1)
    assert probs[[0, 3]].tolist() == [0.0, 0.0]
    assert torch.allclose(probs[[1, 2]], expected)


def test_top_p_keeps_smallest_set_reaching_mass():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    probs = SamplingParams(top_p=0.75).probs(logits)
    assert torch.allclose(probs, torch.tensor([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0]))
    # the most likely token always survives, however small top_p is
    assert SamplingParams(top_p=0.01).probs(logits).tolist() == [1.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("params", [SamplingParams(temperature=1e-40), SamplingParams(temperature=1e-300),
                                    SamplingParams(top_p=1e-300), SamplingParams(temperature=1e-60, top_p=1e-300, top_k=2)])
def test_settings_at_the_edge_of_float_range_are_a_point_mass_on_the_best_token(params):
    """A temperature or top_p far below float32's range is its limit: the argmax, never NaN."""
    logits = torch.tensor([[0.1, 3.0, 2.9, -1.0], [5.0, -2.0, float("-inf"), 4.0]])
    probs = params.probs(logits)
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    gen = torch.Generator().manual_seed(0)
    assert [sample(probs, gen).tolist() for _ in range(5)] == [[1, 0]] * 5


def test_top_p_is_batched_per_row():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.2, 0.7]]))
    probs = SamplingParams(top_p=0.6).probs(logits)
    assert torch.allclose(probs, torch.tensor([[0.5 / 0.8, 0.3 / 0.8, 0.0], [0.0, 0.0, 1.0]]))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=math.nan), "temperature"),
        (dict(temperature=math.inf), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(top_k=2.5), "top_k"),
    ],
)
def test_invalid_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_logits_are_refused(bad):
    with pytest.raises(ValueError, match="logits contain"):
        SamplingParams().probs(torch.tensor([0.0, bad, 1.0]))


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0), SamplingParams(top_p=0.5)])
def test_minus_infinity_is_a_token_that_cannot_be_drawn(params):
    probs = params.probs(torch.tensor([[0.0, -math.inf, 1.0]]))
    assert probs[0, 1] == 0 and torch.isclose(probs.sum(), torch.tensor(1.0))
    assert (sample(probs.expand(500, 3), torch.Generator().manual_seed(0)) != 1).all()
    with pytest.raises(ValueError, match="every token"):
        params.probs(torch.full((1, 3), -math.inf))


def test_sample_is_reproducible_with_a_seed():
    probs = torch.full((4, 10), 0.1)
    a = sample(probs, torch.Generator().manual_seed(3))
    b = sample(probs, torch.Generator().manual_seed(3))
    assert a.shape == (4,) and torch.equal(a, b)


def test_draw_takes_the_greedy_fast_path_to_the_same_token():
    from specdecode.sampling import draw

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 50, generator=gen)
    greedy = SamplingParams(temperature=0)
    assert torch.equal(draw(logits, greedy), sample(greedy.probs(logits), gen))
    logits[0, 3] = 10.0
    logits[0, 7] = 10.0  # a tie: the lowest id, as in probs()
    assert int(draw(logits, greedy)[0]) == 3
    with pytest.raises(ValueError, match="logits contain NaN"):
        draw(torch.tensor([0.0, math.nan]), greedy)
    a = draw(logits, SamplingParams(), torch.Generator().manual_seed(1))
    b = sample(SamplingParams().probs(logits), torch.Generator().manual_seed(1))
    assert torch.equal(a, b)


@pytest.mark.statistical
def test_distinct_samples_follow_drawing_without_replacement():
    """Ordered pairs from sample_distinct match P(a, b) = p(a) p(b) / (1 - p(a)); zero-probability
    tokens never come back, so fewer than k may."""
    from stats import chi2_pvalue
    from specdecode.sampling import sample_distinct

    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    gen = torch.Generator().manual_seed(0)
    pairs = [tuple(sample_distinct(p, 2, gen)) for _ in range(4000)]
    expected = {(a, b): float(p[a] * p[b] / (1 - p[a])) for a in range(3) for b in range(3) if a != b}
    assert chi2_pvalue(pairs, expected) > 1e-3
    assert sorted(sample_distinct(p, 9, gen)) == [0, 1, 2]
