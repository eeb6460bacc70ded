"""The one speculative decode loop (Leviathan et al. 2023, Algorithm 1) and the plain
autoregressive baseline, both generators that yield one `Step` per target call.

Cache invariant, for the target and a model drafter alike: between iterations the cache holds
every context token except the newest one, which is fed together with the next draft (the first
iteration feeds the whole prompt: the prefill). One target forward over
[newest, d_1, ..., d_g] then gives the g+1 distributions the verifier needs, and a rejection is
undone by trimming the g - n rejected positions, never by recomputing the prefix.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch

from .adaptive import AdaptiveGamma
from .drafters.base import Draft, Drafter
from .models.base import Model, check_same_vocab
from .sampling import SamplingParams, draw, sample
from .verify import acceptance, verify


@dataclass
class Step:
    """What one target call produced."""

    tokens: list[int]  # emitted, in order: num_accepted draft tokens, then the target's own token
    num_accepted: int  # how many leading `tokens` came from the draft
    proposed: list[int] = field(default_factory=list)  # the draft's whole proposal
    # beta_i = sum_x min(p_i, q_i) at each draft position whose prefix the target kept (positions
    # 0..num_accepted, at most gamma): the exact acceptance probability there, for estimating alpha.
    # With adaptive gamma switched off, the one shadow proposal's beta.
    betas: list[float] = field(default_factory=list)
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    finish_reason: str | None = None  # "eos" or "length" on the last step, else None

    @property
    def from_draft(self) -> list[bool]:
        return [i < self.num_accepted for i in range(len(self.tokens))]

    @property
    def rejected(self) -> list[int]:
        """Proposed tokens the target did not keep (empty when all were accepted)."""
        return self.proposed[self.num_accepted :] if self.num_accepted < len(self.tokens) else []


_NO_DRAFT = Draft(torch.empty(1, 0, dtype=torch.long))


def make_generator(seed: int | None, generator: torch.Generator | None = None) -> torch.Generator:
    if generator is not None:
        return generator
    gen = torch.Generator()
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


def _check_request(model: Model, prompt: Sequence[int], max_new_tokens: int) -> None:
    if len(prompt) == 0:
        raise ValueError("the prompt has no tokens; at least one is needed to condition on")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    limit = getattr(model, "max_positions", None)
    if limit and len(prompt) >= limit:
        raise ValueError(f"the prompt has {len(prompt)} tokens; the model's context holds at most {limit}")


def _finish(new: list[int], emitted: int, max_new_tokens: int, eos: frozenset[int], room: int | None):
    """Cut `new` at the first EOS or at the length limit; return (tokens, finish_reason)."""
    for i, token in enumerate(new):
        if token in eos:
            return new[: i + 1], "eos"
    if emitted + len(new) >= max_new_tokens:
        return new[: max_new_tokens - emitted], "length"
    if room is not None and room <= len(new):
        return new[:room], "length"  # the model's context window is full
    return new, None


def speculative_decode(
    target: Model,
    drafter: Drafter,
    prompt: Sequence[int],
    *,
    gamma: int | AdaptiveGamma = 4,
    params: SamplingParams = SamplingParams(),
    max_new_tokens: int = 128,
    lenience: float = 1.0,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    eos_token_ids: Sequence[int] | None = None,
) -> Iterator[Step]:
    """Speculative decoding: each iteration drafts up to gamma tokens and verifies them in one
    target call, yielding 1..gamma+1 tokens distributed exactly as the target's own samples
    (for lenience = 1). `gamma` is a fixed draft length or an `AdaptiveGamma` policy that picks
    one per iteration."""
    _check_request(target, prompt, max_new_tokens)
    policy = gamma if isinstance(gamma, AdaptiveGamma) else None
    if policy is None and (isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 0):
        raise ValueError(f"gamma must be an integer >= 0 or an AdaptiveGamma, got {gamma!r}")
    if not (0.0 < lenience <= 1.0):
        raise ValueError(f"lenience must be in (0, 1] (1 = exact), got {lenience!r}")
    if drafter.vocab is not None:
        check_same_vocab(target.vocab, drafter.vocab)
    eos = frozenset(target.eos_token_ids if eos_token_ids is None else eos_token_ids)
    gen = make_generator(seed, generator)
    drafter.reset(params, gen)
    limit = target.max_positions
    context = list(prompt)
    cache = target.new_cache()  # owned by this generator: stopping early leaves nothing to restore

    emitted = 0
    while True:
        # 1. Draft. Never past the length limit or the context window: those tokens would be thrown away.
        room = max_new_tokens - emitted - 1
        if limit:
            room = min(room, limit - len(context) - 1)
        g = policy.choose(room) if policy else min(gamma, room)
        # With speculation switched off, a cheap drafter still proposes one token ("shadow"), scored
        # but not verified, so the policy sees when drafting would pay again.
        shadow = policy is not None and g == 0 and room > 0 and policy.shadow()
        t0 = time.perf_counter()
        draft = drafter.propose(context, g or int(shadow)) if g or shadow else _NO_DRAFT
        t1 = time.perf_counter()
        shadow_draft, draft = (draft, _NO_DRAFT) if shadow else (None, draft)
        g = draft.gamma

        # 2. Score the draft in ONE target call, fed after the context tokens the cache has not seen:
        #    the whole prompt on the first call (the prefill), the newest token after that.
        if len(cache) >= len(context):
            raise RuntimeError(f"the target cache holds {len(cache)} positions for a context of {len(context)}: "
                               "its trim() did not roll back")
        unseen = torch.tensor([context[len(cache):]])  # [1, u]
        tokens = torch.cat([unseen, draft.tokens], dim=1)  # [1, u+g]
        logits = target.forward(tokens, cache, num_logits=g + 1)  # [1, g+1, V]
        if g == 0:  # nothing to verify: the one token is drawn exactly as plain decoding draws it
            new, betas = _plain_step(logits[:, -1], params, gen, shadow_draft)
            n = 0
            t2 = time.perf_counter()
        else:
            target_probs = params.probs(logits)  # [1, g+1, V]
            t2 = time.perf_counter()

            # 3. Speculative sampling: keep n draft tokens, add one corrected or bonus token.
            draft_probs = match_vocab(draft.probs, target_probs.shape[-1])
            verdict = verify(draft.tokens, draft_probs, target_probs, gen, lenience)
            n = int(verdict.num_accepted[0])
            new = verdict.emitted(0)
            betas = _betas(draft, draft_probs, target_probs, n)

        # 4. Roll back: the target cache now holds context + g drafts; keep context + n accepted.
        #    The extra token is the newest context token: it is fed with the next draft. When all g
        #    were accepted nothing is trimmed, and the drafter catches up on its last token itself.
        cache.trim(g - n)
        drafter.accept(n)
        if policy and unseen.shape[1] == 1:  # the prefill call says nothing about step costs
            drafted = g or (shadow_draft.gamma if shadow_draft is not None else 0)
            policy.observe(betas, g + 1, t2 - t1, t1 - t0, drafted)

        # 5. Stop on EOS, the length limit, or a full context window.
        new, finish = _finish(new, emitted, max_new_tokens, eos, (limit - len(context)) if limit else None)
        context.extend(new)
        emitted += len(new)
        yield Step(
            tokens=new,
            num_accepted=min(n, len(new)),
            proposed=draft.tokens[0].tolist(),
            betas=betas,
            draft_seconds=t1 - t0,
            target_seconds=t2 - t1,
            finish_reason=finish,
        )
        if finish:
            return


def autoregressive_decode(
    target: Model,
    prompt: Sequence[int],
    *,
    params: SamplingParams = SamplingParams(),
    max_new_tokens: int = 128,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    eos_token_ids: Sequence[int] | None = None,
) -> Iterator[Step]:
    """The baseline: one target call per token, through the same model interface."""
    _check_request(target, prompt, max_new_tokens)
    eos = frozenset(target.eos_token_ids if eos_token_ids is None else eos_token_ids)
    gen = make_generator(seed, generator)
    limit = target.max_positions
    cache = target.new_cache()
    length = len(prompt)
    tokens = torch.tensor([list(prompt)])  # the first call prefills the prompt, later ones feed one token
    for emitted in range(max_new_tokens):
        t0 = time.perf_counter()
        logits = target.forward(tokens, cache, num_logits=1)  # [1, 1, V]
        token = int(draw(logits[:, -1], params, gen))
        t1 = time.perf_counter()
        new, finish = _finish([token], emitted, max_new_tokens, eos, (limit - length) if limit else None)
        length += 1
        yield Step(tokens=new, num_accepted=0, target_seconds=t1 - t0, finish_reason=finish)
        if finish:
            return
        tokens = torch.tensor([[token]])


def _plain_step(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator,
                shadow: Draft | None) -> tuple[list[int], list[float]]:
    """One token from logits [1, V] with no draft to verify (speculative sampling with gamma = 0
    reduces to this: the same token, the same random draw as `draw`), and the shadow proposal's
    acceptance probability when there is one. Skips the verifier's full-vocabulary bookkeeping,
    which costs a noticeable share of a fast target's step."""
    if params.is_greedy:  # p is a point mass on `token`: beta = sum_x min(p, q) = q(token)
        token = int(draw(logits, params))
        if shadow is None or shadow.gamma == 0:
            return [token], []
        if shadow.probs is None:  # q a point mass too
            return [token], [float(int(shadow.tokens[0, 0]) == token)]
        q = shadow.probs[0, 0]  # [V']
        return [token], [float(q[token]) if token < q.shape[-1] else 0.0]
    probs = params.probs(logits).unsqueeze(1)  # [1, 1, V]
    token = int(sample(probs[:, 0], gen))
    if shadow is None or shadow.gamma == 0:
        return [token], []
    return [token], _betas(shadow, match_vocab(shadow.probs, probs.shape[-1]), probs, 0)


def _betas(draft: Draft, draft_probs: torch.Tensor | None, target_probs: torch.Tensor, n: int) -> list[float]:
    """Acceptance probability at draft positions 0..min(n, g-1) (row 0)."""
    kept = min(n + 1, draft.gamma)
    if kept == 0:
        return []
    if draft_probs is None:  # point mass: beta = p(x)
        tokens = draft.tokens[0, :kept]
        return target_probs[0, torch.arange(kept), tokens].tolist()
    return acceptance(target_probs[0, :kept], draft_probs[0, :kept]).tolist()


def match_vocab(draft_probs: torch.Tensor | None, vocab_size: int) -> torch.Tensor | None:
    """Pad a draft distribution [B, g, V'] to the target's logit width V (tokens the draft's head
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
