"""Speculative sampling: the verifier. Pure functions over tensors, no models.

Glossary (Leviathan, Kalman, Matias 2023, Algorithm 1; Chen et al. 2023):
    target_probs  p(x): the target model Mp's adjusted distribution at each position
    draft_probs   q(x): the draft model Mq's adjusted distribution the draft tokens were drawn from
    gamma         number of draft tokens proposed in this iteration
    num_accepted  n: how many leading draft tokens are kept, 0..gamma
    corrected     on the first rejection, one token drawn from p'(x) = norm(max(0, p(x) - q(x)))
    bonus         when all gamma are accepted, one extra token drawn from p at position gamma
    lenience      l in (0, 1]: accept when l*q(x) <= p(x), else with probability p(x)/(l*q(x))

Each draft token x_i is accepted with probability min(1, p_i(x_i) / (l * q_i(x_i))). The emitted
tokens are the n accepted drafts followed by exactly one target token, so an iteration yields
1..gamma+1 tokens. With l = 1 every emitted token is distributed exactly as p (the paper's
Theorem 3.5 / Appendix A.1). A deterministic drafter (prompt lookup) has no q: q is a point mass
on its token, so acceptance is p(x) and the residual is p with x removed.

Lenience (paper, Appendix A.5) trades exactness for acceptance. Here the residual becomes
norm(max(0, p - l*q)), and the emitted token's probability is at most p(x)/l: where
p >= l*q it is at most q + (p - l*q) <= p/l, elsewhere it is p/l from acceptance alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .options import check_lenience
from .sampling import sample


def acceptance(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """beta = sum_x min(p(x), q(x)) = 1 - D_LK(p, q): the probability that a token drawn from q is
    accepted (paper, Theorem 3.5); [..., V] -> [...]."""
    return torch.minimum(target_probs, draft_probs).sum(-1)


def draft_acceptance(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
                     target_probs: torch.Tensor) -> torch.Tensor:
    """beta_i = sum_x min(p_i(x), q_i(x)) at each draft position: tokens [g], draft_probs [g, V] or
    None, target_probs [g, V] -> [g]. A deterministic drafter's q is a point mass on its token,
    so there beta_i = p_i(x_i)."""
    if draft_probs is None:
        return target_probs.gather(-1, draft_tokens.to(target_probs.device).unsqueeze(-1)).squeeze(-1)
    return acceptance(target_probs, draft_probs)


def residual(target_probs: torch.Tensor, draft_probs: torch.Tensor, lenience: float = 1.0) -> torch.Tensor:
    """The distribution after a rejection, p' = norm(max(0, p - l*q)) (paper, Algorithm 1):
    [..., V] -> [..., V]. Rounding can leave no mass where p == q exactly; p itself is then right."""
    rest = (target_probs - lenience * draft_probs).clamp_min(0.0)
    mass = rest.sum(-1, keepdim=True)
    return torch.where(mass > 0, rest / mass.clamp_min(1e-30), target_probs)


def match_vocab(draft_probs: torch.Tensor | None, vocab_size: int) -> torch.Tensor | None:
    """Pad a draft distribution [..., V'] to the target's logit width V (tokens the draft's head
    lacks have q = 0, which keeps speculative sampling exact)."""
    if draft_probs is None or draft_probs.shape[-1] == vocab_size:
        return draft_probs
    extra = vocab_size - draft_probs.shape[-1]
    if extra < 0:
        raise ValueError(
            f"the draft scores {draft_probs.shape[-1]} token ids but the target only {vocab_size}; "
            "the draft could propose ids the target does not have"
        )
    return torch.nn.functional.pad(draft_probs, (0, extra))


@dataclass
class Verdict:
    """Outcome of one verification.

    tokens: [B, gamma+1] int64; row b holds num_accepted[b] draft tokens, then the corrected or
            bonus token; positions after that are -1.
    num_accepted: [B] int64, in 0..gamma.
    """

    tokens: torch.Tensor
    num_accepted: torch.Tensor

    def emitted(self, row: int = 0) -> list[int]:
        """The tokens this iteration emits for one batch row."""
        n = int(self.num_accepted[row])
        return self.tokens[row, : n + 1].tolist()


def verify(
    draft_tokens: torch.Tensor,  # [B, g] int64
    draft_probs: torch.Tensor | None,  # [B, g, V], or None for a deterministic drafter
    target_probs: torch.Tensor,  # [B, g+1, V]
    generator: torch.Generator | None = None,
    lenience: float = 1.0,
) -> Verdict:
    """Speculative sampling over a batch: accept a prefix of each row's draft, then add one token."""
    check_lenience(lenience)
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be [batch, gamma], got shape {tuple(draft_tokens.shape)}")
    B, g = draft_tokens.shape
    if target_probs.dim() != 3 or target_probs.shape[:2] != (B, g + 1):
        raise ValueError(
            f"target_probs must be [batch, gamma+1, vocab] = [{B}, {g + 1}, V], got {tuple(target_probs.shape)}"
        )
    V, device = target_probs.shape[-1], target_probs.device
    draft_tokens = draft_tokens.to(device)  # everything follows the target's logits (CPU or GPU)
    if draft_probs is not None and draft_probs.shape != (B, g, V):
        raise ValueError(f"draft_probs must be [{B}, {g}, {V}], got {tuple(draft_probs.shape)}")

    # 1. Probability of each draft token under the target and the draft.
    p_x = target_probs[:, :g].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # [B, g]
    if draft_probs is None:
        q_x = torch.ones_like(p_x)  # point mass: q(x) = 1
    else:
        q_x = draft_probs.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # [B, g]

    # 2. Accept x_i when r_i < p(x_i) / (l q(x_i)), r_i ~ U[0, 1); keep the leading run of accepts.
    #    A token the draft could not have drawn (q = 0) is never accepted.
    ratio = torch.where(q_x > 0, p_x / (lenience * q_x).clamp_min(1e-30), torch.zeros_like(p_x))
    r = torch.rand(B, g, generator=generator, device=device)  # [B, g]
    accepted = r < ratio  # [B, g]
    num_accepted = accepted.long().cumprod(-1).sum(-1)  # [B]

    # 3. The distribution of the one extra token: the residual at the first rejection, or the
    #    target's own distribution at position gamma when every draft token was accepted.
    rows = torch.arange(B, device=device)
    p_n = target_probs[rows, num_accepted]  # [B, V]
    if draft_probs is None:
        q_n = torch.nn.functional.one_hot(draft_tokens, V).to(p_n.dtype)  # [B, g, V]
    else:
        q_n = draft_probs
    q_n = torch.cat([q_n, torch.zeros(B, 1, V, dtype=p_n.dtype, device=device)], dim=1)[rows, num_accepted]  # [B, V]
    extra = sample(residual(p_n, q_n, lenience), generator)  # [B]; p_n itself where all were accepted

    # 4. Assemble [accepted drafts..., extra, -1 padding].
    positions = torch.arange(g + 1, device=device).unsqueeze(0)  # [1, g+1]
    padded = torch.cat([draft_tokens, torch.full((B, 1), -1, dtype=torch.long, device=device)], dim=1)  # [B, g+1]
    tokens = torch.where(positions < num_accepted.unsqueeze(1), padded, torch.full_like(padded, -1))
    tokens[rows, num_accepted] = extra
    return Verdict(tokens=tokens, num_accepted=num_accepted)
