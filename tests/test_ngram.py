"""N-gram drafters: smoothed distributions, storage, online counts, losslessness."""

import numpy as np
import pytest
import torch

from specdecode import SamplingParams, speculative_decode
from specdecode.drafters.ngram import NgramDrafter
from specdecode.models.base import Vocabulary, VocabularyMismatch
from specdecode.lossless import whole_sequence_pvalue
from toy import ToyModel

VOCAB = Vocabulary.from_tokens("toy", {f"<{i}>": i for i in range(5)})


def test_distribution_interpolates_counts_and_sums_to_one():
    drafter = NgramDrafter(VOCAB, order=2, weights=[0.7, 0.3], uniform=0.1).fit([[0, 1, 0, 1, 0, 2]])
    q = drafter.distribution([3, 0])
    assert q.sum().item() == pytest.approx(1.0)
    # bigram after 0: {1: 2, 2: 1}; unigram: {0: 3, 1: 2, 2: 1}; weights 0.63 / 0.27 / uniform 0.1
    expected = torch.full((5,), 0.1 / 5)
    expected[[1, 2]] += 0.63 * torch.tensor([2 / 3, 1 / 3])
    expected[[0, 1, 2]] += 0.27 * torch.tensor([3 / 6, 2 / 6, 1 / 6])
    assert torch.allclose(q, expected)
    # an unseen context hands its weight to the unigram
    unseen = drafter.distribution([4])
    assert unseen[0].item() == pytest.approx(0.02 + 0.9 * 0.5) and unseen.sum().item() == pytest.approx(1.0)


def test_unigram_and_greedy_proposals():
    drafter = NgramDrafter(VOCAB, order=1).fit([[3, 3, 3, 1]])
    drafter.reset(SamplingParams(temperature=0), None)
    draft = drafter.propose([0], 3)
    assert draft.tokens.tolist() == [[3, 3, 3]] and draft.probs[0, 0].tolist() == [0, 0, 0, 1, 0]


def test_online_counts_learn_from_the_context():
    drafter = NgramDrafter(VOCAB, order=2, online=True)
    drafter.reset(SamplingParams(temperature=0), None)
    assert drafter.propose([4, 2, 4, 2, 4], 1).tokens.tolist() == [[2]]  # learned 4 -> 2 from the context


def test_distributions_read_before_online_counts_grow_are_not_reused_after():
    drafter = NgramDrafter(VOCAB, order=2, online=True)
    drafter.reset(SamplingParams(temperature=1), torch.Generator().manual_seed(0))
    context = [4, 2, 4, 2, 4]
    drafter.propose(context, 1)
    context += [3, 4, 3, 4, 3, 4, 3, 4]  # now 4 -> 3 four times, 4 -> 2 twice
    drafter.propose(context, 1)
    fresh = NgramDrafter(VOCAB, order=2).fit([context])
    for tail in ([4], [2], [3], [0]):
        assert torch.allclose(drafter.distribution(tail), fresh.distribution(tail))


def test_save_and_load_round_trip(tmp_path):
    drafter = NgramDrafter(VOCAB, order=3).fit([[0, 1, 2, 3, 4, 0, 1, 2]])
    path = drafter.save(tmp_path / "tri.npz")
    loaded = NgramDrafter.load(path)
    assert loaded.vocab == VOCAB and loaded.order == 3
    for context in ([0, 1], [4], [2, 3], []):
        assert torch.allclose(loaded.distribution(context), drafter.distribution(context))
    (tmp_path / "bad.npz").write_bytes(b"not a numpy file")
    with pytest.raises(ValueError, match="not an n-gram file"):
        NgramDrafter.load(tmp_path / "bad.npz")


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="order"):
        NgramDrafter(VOCAB, order=0)
    with pytest.raises(ValueError, match="weights"):
        NgramDrafter(VOCAB, order=2, weights=[1.0])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        NgramDrafter(VOCAB).fit([[7]])


def test_a_drafter_fitted_for_another_vocabulary_is_refused():
    target = ToyModel(6)  # a vocabulary of 6 ids, not 5
    drafter = NgramDrafter(VOCAB, order=2)
    with pytest.raises(VocabularyMismatch):
        next(speculative_decode(target, drafter, [0]))


def test_tree_proposals_sample_distinct_children_in_drawing_order():
    drafter = NgramDrafter(VOCAB, order=2, trees=True, width=3).fit([[0, 1, 0, 2, 0, 1, 3, 4]])
    drafter.reset(SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    draft = drafter.propose([0], 6)
    tokens, parents = draft.tokens[0].tolist(), draft.parents
    assert draft.gamma == 6 and draft.reach is None  # sized before drafting, never cut by its tokens
    assert all(p < i for i, p in enumerate(parents)) and parents.count(-1) >= 2  # branches
    for node in {-1, *parents}:
        kids = [i for i, p in enumerate(parents) if p == node]
        assert len({tokens[k] for k in kids}) == len(kids)  # siblings differ
        assert all(torch.equal(draft.probs[0, k], draft.probs[0, kids[0]]) for k in kids)  # one q a node
    assert torch.allclose(draft.probs[0, 0], drafter._q([0]))
    assert draft.chain().tokens.shape[1] >= 1 and draft.chain().probs is not None
    with pytest.raises(ValueError, match="width"):
        NgramDrafter(VOCAB, trees=True, width=0)


@pytest.mark.statistical
@pytest.mark.parametrize("online, trees", [(False, False), (True, False), (False, True)])
def test_bigram_drafter_is_lossless_over_whole_sequences(online, trees):
    target = ToyModel(3, seed=1, name="toy")
    vocab = target.vocab
    rng = np.random.default_rng(0)
    drafter = NgramDrafter(vocab, order=2, online=online, trees=trees).fit([rng.integers(0, 3, 50).tolist()])
    # the kit's whole-sequence test: 2,000 sequences of 6 tokens after [0], against the exact distribution
    assert whole_sequence_pvalue(drafter, target, 3, SamplingParams(temperature=1.0)) > 1e-3
