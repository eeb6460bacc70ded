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

The decode loop verifies every iteration through `verify_draft`: a chain by speculative sampling
(`verify`, or its greedy shortcut), a draft tree by walking it (`walk_tree`, with recursive
rejection `try_children` for sampled children), nothing drafted as one plain draw. Each is here,
and only here.

Lenience (paper, Appendix A.5) trades exactness for acceptance. Here the residual becomes
norm(max(0, p - l*q)), and the emitted token's probability is at most p(x)/l: where
p >= l*q it is at most q + (p - l*q) <= p/l, elsewhere it is p/l from acceptance alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .checks import check_lenience
from .sampling import SamplingParams, draw, sample


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
    if B == 1:
        return _verify_one(draft_tokens, draft_probs, target_probs, generator, lenience)
    return _verify_rows(draft_tokens, draft_probs, target_probs, generator, lenience)


def _verify_one(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                generator: torch.Generator | None, lenience: float) -> Verdict:
    """`_verify_rows` for one row (the decode loop's every chain), with the same draws and the same
    arithmetic on the values that matter, in a third of the tensor operations: the accepted run is
    counted in Python, the residual built on the one row it needs. Tested equal to `_verify_rows`."""
    g = draft_tokens.shape[1]
    tokens = draft_tokens[0]  # [g]
    p_x = target_probs[0, :g].gather(-1, tokens[:, None])[:, 0]  # [g]
    if draft_probs is None:
        ratio = p_x / torch.full_like(p_x, lenience)  # q(x) = 1: the general path's p / (l * q), element by element
    else:
        q_x = draft_probs[0].gather(-1, tokens[:, None])[:, 0]  # [g]
        ratio = torch.where(q_x > 0, p_x / (lenience * q_x).clamp_min(1e-30), torch.zeros_like(p_x))
    r = torch.rand(1, g, generator=generator, device=target_probs.device)  # [1, g]
    accepted = (r[0] < ratio).tolist()
    n = accepted.index(False) if False in accepted else g
    p_n = target_probs[0, n : n + 1]  # [1, V]
    if draft_probs is None:
        q_n = torch.zeros_like(p_n)  # a point mass on the rejected draft token (none after all were kept)
        if n < g:
            q_n[0, tokens[n]] = 1.0
    else:
        q_n = draft_probs[0, n : n + 1] if n < g else torch.zeros_like(p_n)  # [1, V]
    extra = int(sample(residual(p_n, q_n, lenience), generator)[0])
    out = torch.full((1, g + 1), -1, dtype=torch.long, device=target_probs.device)  # [1, g+1]
    out[0, :n] = tokens[:n]
    out[0, n] = extra
    return Verdict(tokens=out, num_accepted=torch.tensor([n], device=target_probs.device))


def _verify_rows(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                 generator: torch.Generator | None, lenience: float) -> Verdict:
    """`verify` over B rows at once."""
    B, g = draft_tokens.shape
    V, device = target_probs.shape[-1], target_probs.device

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
    if draft_probs is None:  # q at the first rejection: a point mass on the draft token there (none after all)
        q_n = torch.zeros_like(p_n)  # [B, V]
        rejected = rows[num_accepted < g]
        q_n[rejected, draft_tokens[rejected, num_accepted[rejected]]] = 1.0
    else:
        q_n = torch.cat([draft_probs, torch.zeros(B, 1, V, dtype=p_n.dtype, device=device)],
                        dim=1)[rows, num_accepted]  # [B, V]
    extra = sample(residual(p_n, q_n, lenience), generator)  # [B]; p_n itself where all were accepted

    # 4. Assemble [accepted drafts..., extra, -1 padding].
    positions = torch.arange(g + 1, device=device).unsqueeze(0)  # [1, g+1]
    padded = torch.cat([draft_tokens, torch.full((B, 1), -1, dtype=torch.long, device=device)], dim=1)  # [B, g+1]
    tokens = torch.where(positions < num_accepted.unsqueeze(1), padded, torch.full_like(padded, -1))
    tokens[rows, num_accepted] = extra
    return Verdict(tokens=tokens, num_accepted=num_accepted)

# ---- one decode iteration's verification, whatever was drafted ---------------------------------

@dataclass
class Outcome:
    """What one iteration emits. tokens: num_accepted draft tokens, then the target's own; betas:
    acceptance probabilities seen (for estimating alpha); path: for a tree, the kept nodes."""

    tokens: list[int]
    num_accepted: int
    betas: list[float]
    path: list[int] | None = None


def verify_draft(draft, shadow, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator,
                 lenience: float = 1.0) -> Outcome:
    """Step 4 of the decode loop. `draft`: a `drafters.base.Draft` (a chain, a tree, or empty);
    `shadow`: a one-token chain scored but not verified (while speculation is off), or None;
    logits [1, g+1, V]: the target's, row 0 after the context and row 1 + i after draft token i."""
    if draft.parents is None:
        tokens, n, betas = _chain(draft, shadow, logits, params, generator, lenience)
        return Outcome(tokens, n, betas)
    tokens, path, betas = walk_tree(draft, logits, params, generator)
    return Outcome(tokens, len(path), betas, path)


def _chain(draft, shadow, logits: torch.Tensor, params: SamplingParams,
           gen: torch.Generator, lenience: float) -> tuple[list[int], int, list[float]]:
    """Step 4 of the loop on logits [1, g+1, V]: (emitted tokens, num_accepted, betas).

    betas: sum_x min(p, q) at draft positions 0..min(n, g-1), whose prefixes the target kept; with
    nothing to verify, at the shadow proposal (if any)."""
    g = draft.gamma
    if g == 0:  # nothing to verify: the one token is drawn exactly as plain decoding draws it
        return _plain(logits[:, -1], params, gen, shadow)
    if params.is_greedy:
        return _greedy(draft, logits, params)
    target_probs = params.probs(logits)  # [1, g+1, V]
    draft_probs = match_vocab(draft.probs, target_probs.shape[-1])  # [1, g, V] or None
    verdict = verify(draft.tokens, draft_probs, target_probs, gen, lenience)
    n = int(verdict.num_accepted[0])
    kept = min(n + 1, g)
    betas = draft_acceptance(draft.tokens[0, :kept], None if draft_probs is None else draft_probs[0, :kept],
                             target_probs[0, :kept])
    return verdict.emitted(0), n, betas.tolist()


def walk_tree(draft, logits: torch.Tensor, params: SamplingParams,
              gen: torch.Generator) -> tuple[list[int], list[int], list[float]]:
    """Verify a draft tree in one pass over the target's logits [1, g+1, V] (row 0 after the
    context, row 1 + i after node i), walking down from the root:

    - deterministic guesses (draft.probs None): draw the target's token where the walk stands; if
      a child guessed it, step into that child and draw again, else emit it and stop. Every token
      is the target's own draw; the draft only decides how many draws one call serves.
    - sampled children (`drafters.tree`): recursive rejection (SpecInfer's multi-candidate
      speculative sampling, children drawn without replacement). With p the target's distribution
      and q the one the children were drawn from, try them in drawing order: accept child x with
      probability min(1, p(x)/q(x)) and step into it; on a rejection p <- norm(max(0, p - q)) and
      q <- q without x, renormalised (the next child was drawn from exactly that); if none is
      accepted, emit a draw from the last p. Each try is one speculative-sampling step (Leviathan
      et al., Algorithm 1) whose rejected branch continues with the residual, so the emitted token
      is distributed as p.

    Returns (emitted tokens, the kept nodes, betas: at each node with children that the walk
    reached, the chance of going on: the target's mass on the children, or 1 - prod_j (1 - beta_j)
    over the tries with beta_j = sum_x min(p_j, q_j))."""
    guesses = draft.tokens[0].tolist()
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(draft.parents):
        children.setdefault(parent, []).append(node)
    path, betas, node = [], [], -1
    while True:
        row = logits[0, node + 1]  # [V]
        kids = children.get(node, [])
        if draft.probs is not None and kids:
            follow, token, beta = try_children(kids, guesses, draft.probs[0], params.probs(row), gen)
            betas.append(beta)
        else:
            if params.is_greedy:
                token = int(draw(row, params))
                if kids:
                    betas.append(float(any(guesses[k] == token for k in kids)))
            else:
                probs = params.probs(row)
                token = int(sample(probs, gen))
                if kids:
                    betas.append(float(probs[[guesses[k] for k in kids]].sum()))
            follow = next((k for k in kids if guesses[k] == token), None)
        if follow is None:
            return [guesses[k] for k in path] + [token], path, betas
        path.append(follow)
        node = follow


def try_children(kids: list[int], guesses: list[int], draft_probs: torch.Tensor, p: torch.Tensor,
                  gen: torch.Generator) -> tuple[int | None, int | None, float]:
    """Recursive rejection at one node (see `walk_tree`): kids in drawing order, draft_probs
    [g, V], p [V]. Returns (the accepted child or None, the emitted token when none was, beta)."""
    q = draft_probs[kids[0]]  # [V]: every child of a node was drawn from the node's q
    missed = 1.0
    for k in kids:
        x = guesses[k]
        missed *= 1.0 - float(torch.minimum(p, q).sum())
        ratio = float(p[x]) / float(q[x]) if q[x] > 0 else 0.0
        if float(torch.rand(1, generator=gen, dtype=torch.float64)) < ratio:
            return k, None, 1.0 - missed
        p = residual(p, q)
        q = q.clone()
        q[x] = 0.0
        rest = float(q.sum())
        if rest <= 0:
            break
        q = q / rest
    return None, int(sample(p, gen)), 1.0 - missed


def _greedy(draft, logits: torch.Tensor, params: SamplingParams) -> tuple[list[int], int, list[float]]:
    """`verify`'s outcome for a greedy target, without its full-vocabulary work (a softmax and
    residual over every token, a visible share of a small model's step): p_i is a point mass on the argmax a_i, so draft token
    x_i is accepted iff x_i = a_i (p/q >= 1 there for any q and lenience, p = 0 elsewhere), and the
    token after the accepted run, residual or bonus, is a_n. betas: sum_x min(p_i, q_i) = q_i(a_i),
    1 or 0 for a point-mass draft."""
    best = draw(logits[0], params).tolist()  # [g+1]: a_0..a_g
    proposed = draft.tokens[0].tolist()
    n = 0
    while n < len(proposed) and proposed[n] == best[n]:
        n += 1
    kept = min(n + 1, len(proposed))
    if draft.probs is None:
        betas = [float(proposed[i] == best[i]) for i in range(kept)]
    else:
        q = match_vocab(draft.probs, logits.shape[-1])[0]  # [g, V]
        betas = [float(q[i, best[i]]) for i in range(kept)]
    return proposed[:n] + [best[n]], n, betas


def _plain(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator, shadow) -> tuple[list[int], int, list[float]]:
    """One token from logits [1, V] with no draft to verify (speculative sampling with gamma = 0
    reduces to this: the same token, the same random draw as `draw`), and the shadow proposal's
    acceptance probability when there is one. Skips the verifier's full-vocabulary bookkeeping,
    which costs a noticeable share of a fast target's step."""
    target_probs = None if params.is_greedy else params.probs(logits)  # [1, V]
    token = int(draw(logits, params) if target_probs is None else sample(target_probs, gen))
    if shadow is None or shadow.gamma == 0:
        return [token], 0, []
    if target_probs is None and shadow.probs is None:  # greedy, a guess: beta is whether it is the argmax
        return [token], 0, [float(int(shadow.tokens[0, 0]) == token)]
    if target_probs is None:
        target_probs = params.probs(logits)  # greedy: a point mass on `token`
    draft_probs = match_vocab(shadow.probs, target_probs.shape[-1])  # [1, 1, V] or None
    beta = draft_acceptance(shadow.tokens[0], None if draft_probs is None else draft_probs[0], target_probs)
    return [token], 0, beta.tolist()
