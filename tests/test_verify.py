"""Per-step losslessness of the verifier, and that the same checks reject broken verifiers."""

import pytest
import torch

from specdecode.sampling import sample
from specdecode.verify import Verdict, verify
from stats import chi2_pvalue

N = 60_000  # draws per check: enough that the broken verifiers below fail by a wide margin

# Hand-built distributions over 5 tokens for 3 draft positions and the bonus position.
TARGET = torch.tensor([
    [0.40, 0.30, 0.15, 0.10, 0.05],
    [0.05, 0.10, 0.50, 0.25, 0.10],
    [0.20, 0.20, 0.20, 0.20, 0.20],
    [0.70, 0.10, 0.10, 0.05, 0.05],
])  # [g+1, V]
DRAFT = torch.tensor([
    [0.10, 0.50, 0.10, 0.10, 0.20],
    [0.30, 0.10, 0.30, 0.20, 0.10],
    [0.60, 0.10, 0.10, 0.10, 0.10],
])  # [g, V]


def draw(verifier, draft_probs=DRAFT, seed=0, lenience=1.0, deterministic_token=None):
    gen = torch.Generator().manual_seed(seed)
    g = TARGET.shape[0] - 1
    if deterministic_token is None:
        probs = draft_probs.unsqueeze(0).expand(N, g, -1)  # [N, g, V]
        tokens = sample(probs, gen)  # [N, g]
    else:
        probs = None
        tokens = torch.full((N, g), deterministic_token)
    target_probs = TARGET.unsqueeze(0).expand(N, -1, -1)  # [N, g+1, V]
    return verifier(tokens, probs, target_probs, gen, lenience)


def position_pvalue(verdict: Verdict, position: int) -> float:
    """Token at `position` (among rows that emitted one) against the target's distribution there."""
    rows = verdict.num_accepted >= position
    samples = verdict.tokens[rows, position].tolist()
    return chi2_pvalue(samples, dict(enumerate(TARGET[position].tolist())))


def always_accept(tokens, probs, target_probs, gen, lenience=1.0):
    """Broken on purpose: keeps every draft token."""
    B, g = tokens.shape
    bonus = sample(target_probs[:, g], gen)
    return Verdict(torch.cat([tokens, bonus.unsqueeze(1)], 1), torch.full((B,), g))


def no_residual(tokens, probs, target_probs, gen, lenience=1.0):
    """Broken on purpose: on rejection samples from p instead of norm(max(0, p - q))."""
    verdict = verify(tokens, probs, target_probs, gen, lenience)
    rows = torch.arange(tokens.shape[0])
    verdict.tokens[rows, verdict.num_accepted] = sample(target_probs[rows, verdict.num_accepted], gen)
    return verdict


@pytest.mark.parametrize("position", [0, 1, 2, 3])
def test_each_emitted_token_follows_the_target(position):
    assert position_pvalue(draw(verify), position) > 1e-3


@pytest.mark.parametrize("position", [0, 1, 2])
def test_deterministic_drafter_is_exact_too(position):
    assert position_pvalue(draw(verify, deterministic_token=1), position) > 1e-3


@pytest.mark.parametrize("broken", [always_accept, no_residual])
def test_the_check_rejects_a_broken_verifier(broken):
    assert position_pvalue(draw(broken), 0) < 1e-6


def test_acceptance_rate_is_sum_of_min():
    """Paper, section 3.3: P(accept) at a position = sum_x min(p(x), q(x)) = 1 - D_LK(p, q)."""
    verdict = draw(verify)
    expected = torch.minimum(TARGET[0], DRAFT[0]).sum().item()
    assert abs((verdict.num_accepted >= 1).float().mean().item() - expected) < 0.01


def test_emitted_tokens_layout():
    verdict = draw(verify)
    for row in range(50):
        n = int(verdict.num_accepted[row])
        assert (verdict.tokens[row, : n + 1] >= 0).all() and (verdict.tokens[row, n + 1 :] == -1).all()
        assert verdict.emitted(row) == verdict.tokens[row, : n + 1].tolist()


def test_greedy_accepts_exactly_the_drafts_that_match_the_argmax():
    gen = torch.Generator().manual_seed(0)
    V, g = 7, 4
    target_argmax = torch.randint(0, V, (200, g + 1), generator=gen)  # [B, g+1]
    draft_tokens = torch.where(torch.rand(200, g, generator=gen) < 0.7, target_argmax[:, :g],
                               torch.randint(0, V, (200, g), generator=gen))
    target_probs = torch.nn.functional.one_hot(target_argmax, V).float()
    draft_probs = torch.nn.functional.one_hot(draft_tokens, V).float()
    for probs in (draft_probs, None):
        verdict = verify(draft_tokens, probs, target_probs, gen)
        for b in range(200):
            matches = (draft_tokens[b] == target_argmax[b, :g]).tolist() + [False]
            n = matches.index(False)
            assert int(verdict.num_accepted[b]) == n
            assert verdict.emitted(b) == target_argmax[b, : n + 1].tolist()


def test_all_accepted_adds_the_bonus_token_from_the_last_position():
    tokens = torch.tensor([[2, 3]])
    target_probs = torch.tensor([[[0, 0, 1.0, 0, 0], [0, 0, 0, 1.0, 0], [0, 0, 0, 0, 1.0]]])
    verdict = verify(tokens, None, target_probs)
    assert verdict.num_accepted.tolist() == [2] and verdict.emitted() == [2, 3, 4]


def test_zero_gamma_samples_from_the_target():
    gen = torch.Generator().manual_seed(1)
    target_probs = TARGET[:1].unsqueeze(0).expand(N, 1, -1)
    verdict = verify(torch.empty(N, 0, dtype=torch.long), None, target_probs, gen)
    assert chi2_pvalue(verdict.tokens[:, 0].tolist(), dict(enumerate(TARGET[0].tolist()))) > 1e-3


@pytest.mark.parametrize("lenience", [0.5, 0.8])
def test_lenience_bounds_each_token_by_p_over_l_and_raises_acceptance(lenience):
    exact, lenient = draw(verify), draw(verify, lenience=lenience)
    freq = torch.bincount(lenient.tokens[:, 0], minlength=5).float() / N  # [V]
    bound = TARGET[0] / lenience
    slack = 4 * (bound * (1 - bound).clamp_min(0) / N).sqrt() + 1e-9
    assert (freq <= bound + slack).all(), (freq, bound)
    assert (lenient.num_accepted >= 1).float().mean() > (exact.num_accepted >= 1).float().mean() + 0.02
    # and it really is lossy: not the target distribution any more
    assert chi2_pvalue(lenient.tokens[:, 0].tolist(), dict(enumerate(TARGET[0].tolist()))) < 1e-6


@pytest.mark.parametrize("lenience", [0.0, -0.5, 1.5])
def test_lenience_outside_range_is_refused(lenience):
    with pytest.raises(ValueError, match="lenience"):
        verify(torch.zeros(1, 1, dtype=torch.long), None, torch.full((1, 2, 3), 1 / 3), lenience=lenience)


def test_shape_mismatch_is_refused():
    with pytest.raises(ValueError, match="target_probs"):
        verify(torch.zeros(1, 2, dtype=torch.long), None, torch.full((1, 2, 3), 1 / 3))
    with pytest.raises(ValueError, match="draft_probs"):
        verify(torch.zeros(1, 1, dtype=torch.long), torch.full((1, 1, 4), 0.25), torch.full((1, 2, 3), 1 / 3))


@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("lenience", [1.0, 0.7])
def test_one_rows_shortcut_draws_what_the_batched_verifier_draws(sampled, lenience):
    """The decode loop verifies one row at a time through `_verify_one`; it must emit what the
    batched `_verify_rows` emits from the same generator state, token for token, whatever the
    draft length, distributions (zeros in q included) and lenience."""
    from specdecode.verify import _verify_one, _verify_rows

    cases = torch.Generator().manual_seed(7)
    for seed in range(300):
        g, V = 1 + seed % 4, 3 + seed % 5
        target = torch.softmax(3 * torch.randn(1, g + 1, V, generator=cases), -1)  # [1, g+1, V]
        draft = torch.softmax(3 * torch.randn(1, g, V, generator=cases), -1) if sampled else None  # [1, g, V]
        if sampled:
            draft[0, 0, 0] = 0.0  # a token the draft cannot draw
            draft = draft / draft.sum(-1, keepdim=True)
        tokens = torch.randint(0, V, (1, g), generator=cases)
        one = _verify_one(tokens, draft, target, torch.Generator().manual_seed(seed), lenience)
        rows = _verify_rows(tokens, draft, target, torch.Generator().manual_seed(seed), lenience)
        assert torch.equal(one.tokens, rows.tokens) and torch.equal(one.num_accepted, rows.num_accepted), seed
