"""The one speculative decode loop (Leviathan et al. 2023, Algorithm 1) and the plain
autoregressive baseline, both generators that yield one `Step` per target call.

Cache invariant, for the target and a model drafter alike: between iterations the cache holds
every context token except the newest one, which is fed together with the next draft (the first
iteration feeds the whole prompt: the prefill). One target forward over
[newest, d_1, ..., d_g] then gives the g+1 distributions the verifier needs, and a rejection is
undone by trimming the g - n rejected positions, never by recomputing the prefix. A draft tree
(a target with `supports_trees`) is scored the same way in one forward, and the walked path is
kept with `cache.keep` instead of a trim.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterator, NamedTuple, Sequence

import torch

from .drafters.base import Draft, Drafter, check_drafter
from .gamma import AdaptiveGamma, GammaPolicy, as_policy
from .models.base import ForwardCall, Model, capabilities, check_same_vocab, forward_batch
from .checks import check_lenience, check_logprobs, check_max_new_tokens, check_prompt_ids
from .sampling import History, SamplingParams, draw, make_generator
from .verify import verify_draft
from .grammar import Constraint, apply_masks


class TokenLogprob(NamedTuple):
    """An emitted token's log-probability under the target's own distribution at its position (the
    raw logits' log-softmax: no temperature, top-k or top-p), and the `top` most likely tokens there,
    (token, log-probability) best first. The same whether the token came from the draft or not."""

    token: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class Step:
    """What one target call produced."""

    tokens: list[int]  # emitted, in order: num_accepted draft tokens, then the target's own token
    num_accepted: int  # how many leading `tokens` came from the draft
    proposed: list[int] = field(default_factory=list)  # the draft's whole proposal (a tree's nodes, in order)
    # beta_i = sum_x min(p_i, q_i) at each draft position whose prefix the target kept (positions
    # 0..num_accepted, at most gamma): the exact acceptance probability there, for estimating alpha.
    # With speculation switched off, the one shadow proposal's beta.
    betas: list[float] = field(default_factory=list)
    draft_seconds: float = 0.0
    target_seconds: float = 0.0  # the target call and the sampling from its logits
    finish_reason: str | None = None  # "eos" or "length" on the last step, else None
    tree: bool = False  # the proposal was a tree (its nodes verified in this one call)
    # what the cost model expected of this call when it planned it: (tokens, cost in one-token
    # steps); None for the prefill and for calls it did not plan (a fixed gamma, a batch's plan)
    forecast: tuple[float, float] | None = None
    logprobs: list[TokenLogprob] | None = None  # one per token, where the decoding was asked for them
    forced: int = 0  # how many of `tokens` a grammar forced (emitted unsampled, at no target call of their own)

    @property
    def from_draft(self) -> list[bool]:
        return [i < self.num_accepted for i in range(len(self.tokens))]

    @property
    def rejected(self) -> list[int]:
        """Proposed tokens the target did not keep (empty when all were accepted)."""
        return self.proposed[self.num_accepted :] if self.num_accepted < len(self.tokens) else []


NO_DRAFT = Draft(torch.empty(1, 0, dtype=torch.long))


class _Pending(NamedTuple):
    """What `Decoding.prepare` drafted and planned, for `complete`."""

    draft: Draft
    shadow: Draft | None  # a one-token proposal scored but not verified, while speculation is off
    prefill: bool
    drafting_began: float  # clock readings around the drafting
    drafting_ended: float
    unseen: int  # context tokens fed before the draft (the newest one; the prompt on the prefill)
    cache_length: int  # the cache's length before the call
    forecast: tuple[float, float] | None
    masks: list | None  # a grammar's allowed tokens for each verified row (`grammar.Constraint.masks`)
    lead: list[int]  # tokens a grammar forced before the first sampled one (the prefill's), emitted first


def token_logprobs(logits: torch.Tensor, new: list[int], path: list[int] | None, top: int) -> list[TokenLogprob]:
    """Each emitted token's log-probability and the `top` alternatives, from the row of `logits`
    [1, g+1, V] that predicted it: row j for a chain's token j; for a tree row 0, then the rows of the
    kept path's nodes (node i's is 1 + i). Float64 log-softmax of the row as the target gave it."""
    rows = list(range(len(new))) if path is None else [0, *(1 + i for i in path)][: len(new)]
    table = torch.log_softmax(logits[0, rows].double(), dim=-1)  # [len(new), V]
    chosen = table.gather(1, torch.tensor(new, device=table.device)[:, None])[:, 0].tolist()
    values, ids = table.topk(top, dim=-1) if top else (table[:, :0], table[:, :0].long())
    return [TokenLogprob(t, lp, list(zip(i, v))) for t, lp, i, v in zip(new, chosen, ids.tolist(), values.tolist())]


def _forced(lead: int, sampled: int, kept: int) -> int:
    """How many of a step's first `kept` tokens a grammar forced: `lead` before the `sampled` ones,
    the rest after them."""
    return min(lead, kept) + max(0, kept - lead - sampled)


def check_request(model: Model, prompt: Sequence[int], max_new_tokens: int) -> None:
    check_prompt_ids(prompt)
    check_max_new_tokens(max_new_tokens)
    limit = model.max_positions
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
    gamma: int | str | GammaPolicy = "auto",
    params: SamplingParams = SamplingParams(),
    max_new_tokens: int = 128,
    lenience: float = 1.0,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    eos_token_ids: Sequence[int] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    logprobs: int | None = None,
    constraint: Constraint | None = None,
    max_draft: int | None = None,
    min_draft: int = 0,
) -> Iterator[Step]:
    """Speculative decoding (Algorithm 1): each iteration drafts up to gamma tokens and verifies
    them in one target call, yielding 1..gamma+1 tokens distributed exactly as the target's own
    samples (for lenience = 1). `gamma` is a fixed draft length, a policy (`gamma.AdaptiveGamma`)
    that plans one per iteration, or "auto" (the default): an adaptive policy fed by the target's
    measured verification cost, so speculation turns itself down where verifying is costly. `clock`
    times the drafting and the target calls that the policy learns from (tests pass a simulated one).
    `logprobs`: each step carries its tokens' log-probabilities with that many alternatives (None:
    none; see `TokenLogprob`). `constraint`: a grammar the output follows (`grammar.Constraint`).
    `max_draft`, `min_draft`: the longest draft verified and the shortest deterministic one (`Decoding`)."""
    decoding = Decoding(target, drafter, prompt, gamma=gamma, params=params, max_new_tokens=max_new_tokens,
                        lenience=lenience, seed=seed, generator=generator, eos_token_ids=eos_token_ids,
                        clock=clock, logprobs=logprobs, constraint=constraint, max_draft=max_draft,
                        min_draft=min_draft)
    while True:
        call = decoding.prepare()
        logits = forward_batch(target, [call])[0]
        step = decoding.complete(logits)
        yield step
        if step.finish_reason:
            return


class Decoding:
    """One request's speculative decoding, one iteration at a time: `prepare()` plans and drafts
    and returns the target call the iteration needs (`models.base.ForwardCall`); `complete(logits)`
    verifies, rolls back and returns the `Step`. `speculative_decode` drives one; `batch` drives
    several through one ragged target forward, each exactly as it would run alone.

    Cache invariant: see the module docstring. The cache is owned here: a consumer that stops
    early leaves nothing to restore."""

    def __init__(self, target: Model, drafter: Drafter, prompt: Sequence[int], *,
                 gamma: int | str | GammaPolicy = "auto", params: SamplingParams = SamplingParams(),
                 max_new_tokens: int = 128, lenience: float = 1.0, seed: int | None = None,
                 generator: torch.Generator | None = None, eos_token_ids: Sequence[int] | None = None,
                 cache=None, clock: Callable[[], float] = time.perf_counter, logprobs: int | None = None,
                 constraint: Constraint | None = None, max_draft: int | None = None, min_draft: int = 0) -> None:
        """`cache`: the target cache to decode in (a new one by default); it may already hold a prefix
        of the prompt, computed exactly as this prompt's own (`prefix.PrefixCache`). `clock`: seconds,
        for the step timings the gamma policy learns from. `logprobs`: each Step carries its tokens'
        log-probabilities with that many alternatives (0..MAX_TOP_LOGPROBS; None: none). `constraint`: a
        grammar's matcher (`grammar.Constraint`): each verified row is the target's distribution restricted
        to what the grammar allows after that row's prefix, and the tokens it forces are emitted unsampled.
        `max_draft`: the longest draft any call verifies, whatever the policy plans (llama-server's
        speculative.n_max; 0: none); `min_draft`: a deterministic draft shorter than this is not verified
        (its n_min; the choice depends on the context alone, so the output stays exact: a sampled draft
        is verified whatever its length, since dropping it by its drawn length would bias q)."""
        check_request(target, prompt, max_new_tokens)
        if max_draft is not None and (isinstance(max_draft, bool) or not isinstance(max_draft, int) or max_draft < 0):
            raise ValueError(f"max_draft must be an integer >= 0 or None, got {max_draft!r}")
        if isinstance(min_draft, bool) or not isinstance(min_draft, int) or min_draft < 0:
            raise ValueError(f"min_draft must be an integer >= 0, got {min_draft!r}")
        self.max_draft, self.min_draft = max_draft, min_draft
        self.logprobs = check_logprobs(logprobs)
        self.constraint = constraint
        self.force = logprobs is None  # forced tokens emitted unsampled; with logprobs, sampled to be scored
        check_lenience(lenience)
        check_drafter(drafter)
        if drafter.vocab is not None:
            check_same_vocab(target.vocab, drafter.vocab)
        self.policy = as_policy(gamma, target)  # after the cheap checks: "auto" may measure the target first
        self.policies: dict = {}  # a drafter's source -> its own adaptive policy (`plan_policy`)
        self.trees = capabilities(target).supports_trees
        if not self.trees and drafter.proposes_trees:
            warnings.warn(f"{target.name} ({type(target).__name__}) verifies chains only: tree drafts are cut to "
                          "their main chain", RuntimeWarning, stacklevel=3)
        self.target, self.drafter, self.params, self.lenience = target, drafter, params, lenience
        self.clock = clock
        self.max_new_tokens = max_new_tokens
        self.eos = frozenset(target.eos_token_ids if eos_token_ids is None else eos_token_ids)
        self.gen = make_generator(seed, generator, target.device)
        drafter.reset(params, self.gen)
        drafter.begin(prompt)
        self.limit = target.max_positions
        self.context = list(prompt)
        self.prompt_length = len(prompt)
        self.history: History | None = None  # the output's counts, where a control reads them (`adjusted`)
        self.cache = target.new_cache() if cache is None else cache
        drafter.attach(self.cache)  # a feature draft reads the target's features from it
        self.emitted = 0
        self.finished = False
        self._pending: _Pending | None = None

    @property
    def room(self) -> int:
        """Draft tokens the next iteration may verify: never past the length limit or the context window
        (those tokens would be thrown away), nor `max_draft`."""
        room = self.max_new_tokens - self.emitted - 1
        room = min(room, self.limit - len(self.context) - 1) if self.limit else room
        return room if self.max_draft is None else min(room, self.max_draft)

    def plan_policy(self) -> GammaPolicy:
        """The policy that plans the next call. A drafter that switches between sources (prompt
        lookup, else a model: `drafters.hybrid`) names the one it will use, and each source gets its
        own adaptive policy, learning that source's alpha and cost apart (a shared one would plan
        lookup's cheap copies with the model's acceptance, and the model's guesses with lookup's)."""
        key = self.drafter.source(self.context) if isinstance(self.policy, AdaptiveGamma) else None
        if key is not None:
            if not self.policies:
                self.policies[None] = self.policy  # the template the sources' policies start from
            if key not in self.policies:
                self.policies[key] = self.policies[None].fresh()
            self.policy = self.policies[key]
        return self.policy

    def adjusted(self, logits: torch.Tensor, draft: Draft) -> torch.Tensor:
        """logits [1, g+1, V] of a call under `SamplingParams.adjust`: row 0 after the context, row
        i + 1 after draft token i of a chain (the tokens before it too) or of a tree (its ancestors):
        each verified position is scored with the counts its own prefix implies, never the step's."""
        if self.history is None:  # the prompt's counts, and the output's so far (a grammar's forced lead)
            self.history = History(self.params, self.context[: self.prompt_length], logits.shape[-1])
            self.history.extend(self.context[self.prompt_length:])
        return self.history.adjust(logits[0], draft.prefixes())[None]

    def prepare(self, gamma: int | None = None) -> ForwardCall:
        """Steps 1-3: plan, draft, and the target call that scores the draft. `gamma` overrides the
        policy's plan (a batch plans every request's draft length together); None asks the policy."""
        if self.finished:
            raise RuntimeError("this decoding has finished")
        # 1. Plan. With speculation off, a policy may ask for a one-token "shadow" proposal, scored
        #    against the target but not verified, to learn when drafting would pay again. The prefill
        #    goes alone, without a draft: the prompt's cache entries are then computed exactly as plain
        #    decoding computes them (a batch-invariant target gives identical logits).
        prefill = self.emitted == 0  # the first call: the prompt (or what a reused prefix left of it)
        policy, drafter, room = self.policy if prefill else self.plan_policy(), self.drafter, self.room
        policy.context_length = len(self.context)  # verification costs more rows of attention as it grows
        if prefill:
            g, shadow = 0, False
        elif gamma is None:
            g, shadow = policy.draft_length(room)
        else:
            g = max(0, min(gamma, room))
            shadow = g == 0 and room > 0 and policy.shadow()

        # 2. Draft.
        t0 = self.clock()
        # A tree of guesses is drafted to the policy's widest budget, then cut by its cost model. A
        # sampled tree (`drafters.tree`) keeps the size planned before drafting: cutting it by the
        # tokens drawn would bias the output.
        sized = (g and gamma is None and self.trees and self.lenience == 1 and drafter.proposes_trees
                 and not drafter.samples_trees and policy.sizes_trees)
        budget = max(g, min(policy.max_gamma, room)) if sized else g
        draft = drafter.propose(self.context, budget) if g else NO_DRAFT
        shadow_draft = drafter.propose(self.context, 1) if shadow else None
        t1 = self.clock()
        if draft.parents is not None and (not self.trees or self.lenience < 1):  # lenient acceptance is for chains
            draft = draft.chain()
        elif sized and draft.reach is not None:
            draft = draft.prefix(policy.tree_size(draft.reach, room))
            draft = draft if draft.gamma else NO_DRAFT
        if draft.probs is None and 0 < draft.gamma < self.min_draft:  # too short to verify (deterministic only)
            draft = NO_DRAFT
        forecast = policy.forecast if not prefill and gamma is None else None
        if forecast is not None and not draft.gamma:  # the drafter found nothing to propose: a plain step
            forecast = (1.0, 1.0)
        if shadow_draft is not None:
            shadow_draft = shadow_draft.chain()
        lead, masks = [], None
        if self.constraint is not None:
            if prefill:  # tokens the grammar forces before the first choice go with the prompt
                lead = self.constraint.advance([], self.force)
                self.context.extend(lead)
            draft, masks = self._constrain(draft)

        # 3. The target call: the draft fed after the context tokens the cache has not seen (the
        #    newest token; the whole prompt on the first call).
        if len(self.cache) >= len(self.context):
            raise RuntimeError(f"the target cache holds {len(self.cache)} positions for a context of "
                               f"{len(self.context)}: its trim() did not roll back")
        unseen = torch.tensor([self.context[len(self.cache):]])  # [1, u]
        tokens = torch.cat([unseen, draft.tokens], dim=1)
        parents = None
        if draft.parents is not None:
            u = unseen.shape[1]
            parents = list(range(-1, u - 1)) + [u - 1 if p < 0 else u + p for p in draft.parents]
        self._pending = _Pending(draft, shadow_draft, prefill, t0, t1, unseen.shape[1], len(self.cache), forecast,
                                 masks, lead)
        return ForwardCall(tokens, self.cache, num_logits=draft.gamma + 1, parents=parents)

    def complete(self, logits: torch.Tensor, started: float | None = None, rows: int | None = None) -> Step:
        """Steps 4-6 on the call's logits [1, g+1, V]. `started`: when the (shared) forward began, if
        not right after prepare(); `rows`: the rows that forward ran (a batch's), for the cost model."""
        draft, shadow_draft, prefill, t0, t1, u, start, forecast, masks, lead = self._pending
        self._pending = None
        began = t1 if started is None else started  # the forward's start
        g, cache, drafter, policy = draft.gamma, self.cache, self.drafter, self.policy
        checking = self.clock()  # the logits are here: what follows is per row, apart from the forward
        # 4. Verify (`verify.verify_draft`): keep n draft tokens (a chain's prefix, a tree's path), add
        #    one corrected or bonus token.
        raw = logits  # the target's own: what logprobs report
        if self.params.adjusts:  # logit_bias and penalties, each row under the history its own prefix implies
            logits = self.adjusted(logits, draft)
        if masks is not None:  # then the grammar's: each row restricted to what its prefix allows
            logits = apply_masks(logits[0], masks)[None]
        outcome = verify_draft(draft, shadow_draft, logits, self.params, self.gen, self.lenience)
        t2 = self.clock()
        new, n, betas = outcome.tokens, outcome.num_accepted, outcome.betas
        # 5. Roll back: the target cache now holds context + g drafts; keep context + n accepted.
        #    The extra token is the newest context token: it is fed with the next draft. When all g
        #    were accepted nothing is trimmed, and the drafter catches up on its last token itself.
        if outcome.path is None:
            cache.trim(g - n)
        else:  # a tree: every node scored in one call, then one root-to-node path kept
            cache.keep(start + u, [start + u + i for i in outcome.path])
            if draft.reach is not None:
                policy.observe_tree(sum(draft.reach), n)
        drafter.accept(n)
        if not prefill:  # the prefill says nothing about step costs
            policy.observe(betas, rows or g + 1, t2 - began, t1 - t0,
                           g or (shadow_draft.gamma if shadow_draft else 0), t2 - checking, g)

        # 6. Stop on EOS, the length limit, or a full context window. A grammar's forced tokens follow.
        after = self.constraint.advance(new, self.force) if self.constraint is not None else []
        sampled = len(new)
        limit = self.limit
        new, finish = _finish(lead + new + after, self.emitted, self.max_new_tokens, self.eos,
                              (limit - len(self.context) + len(lead)) if limit else None)
        forced = _forced(len(lead), sampled, len(new))
        self.context.extend(new[len(lead):])
        if self.history is not None:
            self.history.extend(new[len(lead):])
        self.emitted += len(new)
        self.finished = finish is not None
        return Step(tokens=new, num_accepted=min(n, len(new)) if not lead else 0, proposed=draft.tokens[0].tolist(),
                    betas=betas, draft_seconds=t1 - t0, target_seconds=t2 - began, finish_reason=finish,
                    tree=draft.parents is not None, forecast=forecast, forced=forced,
                    logprobs=None if self.logprobs is None else token_logprobs(raw, new, outcome.path,
                                                                               self.logprobs))

    def _constrain(self, draft: Draft) -> tuple[Draft, list]:
        """The grammar's allowed tokens for each row the call verifies (row 0 after the context, then
        after each draft token's prefix), and the draft cut before the first token the grammar forbids
        where it is deterministic (q a point mass: the same distribution, one row fewer; see `grammar`).
        A sampled draft keeps its forbidden token, which verification rejects with certainty."""
        masks = self.constraint.masks(draft.prefixes())
        reached = [m is not None for m in masks]
        if draft.probs is None and not all(reached):
            keep = reached.index(False) - 1  # the draft tokens before the first forbidden one
            if draft.parents is None:
                draft = Draft(draft.tokens[:, :keep]) if keep else NO_DRAFT
            else:
                draft = Draft(draft.tokens[:, :keep], None, draft.parents[:keep],
                              draft.reach[:keep] if draft.reach else None) if keep else NO_DRAFT
            masks = masks[: keep + 1]
        return draft, masks


def autoregressive_decode(
    target: Model,
    prompt: Sequence[int],
    *,
    params: SamplingParams = SamplingParams(),
    max_new_tokens: int = 128,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    eos_token_ids: Sequence[int] | None = None,
    logprobs: int | None = None,
    constraint: Constraint | None = None,
) -> Iterator[Step]:
    """The baseline: one target call per sampled token, through the same model interface (`logprobs`
    and `constraint` as for `speculative_decode`: a grammar's forced tokens are fed with the next call)."""
    check_request(target, prompt, max_new_tokens)
    check_logprobs(logprobs)
    eos = frozenset(target.eos_token_ids if eos_token_ids is None else eos_token_ids)
    gen = make_generator(seed, generator, target.device)
    limit = target.max_positions
    cache = target.new_cache()
    length, emitted, history = len(prompt), 0, None
    force = logprobs is None  # forced tokens unsampled; with logprobs, sampled to be scored
    lead = constraint.advance([], force) if constraint is not None else []
    unseen = list(prompt) + lead  # the first call prefills the prompt, later ones feed what followed
    while True:
        t0 = time.perf_counter()
        logits = target.forward(torch.tensor([unseen]), cache, num_logits=1)  # [1, 1, V]
        if params.adjusts and history is None:
            history = History(params, prompt, logits.shape[-1])
            history.extend(lead)
        row = history.adjust(logits[:, -1], [[]]) if params.adjusts else logits[:, -1]
        if constraint is not None:
            row = apply_masks(row, constraint.masks([[]]))
        token = int(draw(row, params, gen))
        new = [token]
        if constraint is not None:
            new += constraint.advance(new, force)
        if history is not None:
            history.extend(new)
        t1 = time.perf_counter()
        new, finish = _finish(lead + new, emitted, max_new_tokens, eos, (limit - length) if limit else None)
        length, emitted = length + len(new), emitted + len(new)
        yield Step(tokens=new, num_accepted=0, target_seconds=t1 - t0, finish_reason=finish,
                   forced=_forced(len(lead), 1, len(new)),
                   logprobs=None if logprobs is None else token_logprobs(logits, new, None, logprobs))
        if finish:
            return
        unseen, lead = new[len(lead):], []
