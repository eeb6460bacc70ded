"""The losslessness kit: the checks that show a drafter keeps the target's distribution exactly,
used by the test suite and by `specdecode check` on anyone's drafter.

- A toy target (`ToyModel`) whose vocabulary is small enough that its distribution over whole
  sequences can be enumerated exactly (`sequence_distribution`). Its logits depend on the entire
  prefix held in the cache (a seeded function of it), so a cache holding the wrong positions after a
  rollback gives the wrong distribution: whole-sequence checks catch trim and bonus-token bugs that
  per-step checks miss. Toy tokenizers (`ToyTokenizer`) give it text, for drafts with another vocabulary.
- `whole_sequence_pvalue`: speculative samples drawn through the real decode loop, against that
  exact distribution, by Pearson's chi-square (`chi2_pvalue`).
- `accept_everything`: a deliberately broken verifier. A check that cannot tell a drafter's output
  under it from the target's has no power over that drafter, and says so.
- `check_drafter`: all of it for one drafter (every sampling setting, the control, greedy identity).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .models.base import Vocabulary, check_trim
from .sampling import SamplingParams, draw


class ToyCache:
    def __init__(self) -> None:
        self.tokens: list[int] = []

    def __len__(self) -> int:
        return len(self.tokens)

    def trim(self, n: int) -> None:
        check_trim(n, len(self.tokens))
        del self.tokens[len(self.tokens) - n :]

    def keep(self, start: int, slots: list[int]) -> None:
        self.tokens[start:] = [self.tokens[s] for s in slots]


class ToyModel:
    """logits(prefix) = scale * N(0, 1) seeded by (seed, prefix), plus `base`'s logits if given
    (a draft that resembles its target)."""

    def __init__(self, vocab_size: int = 3, seed: int = 0, scale: float = 1.5, base: "ToyModel | None" = None,
                 eos_token_ids=(), name: str = "toy", delay: float = 0.0, clock=None,
                 tokenizer: "ToyTokenizer | None" = None) -> None:
        self.vocab_size, self.seed, self.scale, self.base = vocab_size, seed, scale, base
        self.name, self.device, self.tokenizer = name, "cpu", tokenizer
        tokens = tokenizer.pieces if tokenizer is not None else [f"<{i}>" for i in range(vocab_size)]
        self.vocab = Vocabulary.from_tokens(name, {t: i for i, t in enumerate(tokens)})
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_positions = None
        self.calls = 0
        # seconds per forward call, to give a target a realistic cost over its draft: on `clock` (an
        # object with advance(seconds), e.g. a simulated clock: exact on any host) when given, else slept
        self.delay, self.clock = delay, clock
        self._memo: dict[tuple[int, ...], torch.Tensor] = {}

    def logits_for(self, prefix: tuple[int, ...]) -> torch.Tensor:  # [V]
        if prefix not in self._memo:
            gen = torch.Generator().manual_seed(hash((self.seed,) + prefix) & 0x7FFFFFFF)
            logits = self.scale * torch.randn(self.vocab_size, generator=gen)
            if self.base is not None:
                logits = logits + self.base.logits_for(prefix)
            self._memo[prefix] = logits
        return self._memo[prefix]

    def new_cache(self) -> ToyCache:
        return ToyCache()

    supports_trees = True

    def forward(self, tokens: torch.Tensor, cache: ToyCache, num_logits: int | None = None,
                parents=None) -> torch.Tensor:
        """As the native backend: with `parents`, token t follows token parents[t] (or the cache
        where -1) and its logits are those of the cache's tokens plus its ancestors."""
        self.calls += 1
        if self.clock is not None:
            self.clock.advance(self.delay)
        elif self.delay:
            time.sleep(self.delay)
        out, start, tokens = [], len(cache.tokens), tokens[0].tolist()
        for t, token in enumerate(tokens):
            assert 0 <= token < self.vocab_size, token
            cache.tokens.append(token)
            if parents is None:
                out.append(self.logits_for(tuple(cache.tokens)))
                continue
            path, node = [], t
            while node >= 0:
                path.append(tokens[node])
                node = parents[node]
            out.append(self.logits_for(tuple(cache.tokens[:start]) + tuple(path[::-1])))
        logits = torch.stack(out).unsqueeze(0)  # [1, T, V]
        return logits[:, -num_logits:] if num_logits else logits


def sequence_distribution(model: ToyModel, prompt: list[int], params: SamplingParams, length: int,
                          eos=frozenset(), grammar=None) -> dict[tuple[int, ...], float]:
    """Exact probability of every continuation of `prompt` (up to `length` tokens or an EOS), under
    `grammar` (a `grammar.Grammar`) where given: each position restricted to what it allows there."""
    from .grammar import apply_masks, constraint_for

    dist: dict[tuple[int, ...], float] = {}
    constraint = constraint_for(grammar, model)

    def walk(seq: tuple[int, ...], mass: float) -> None:
        if len(seq) == length or (seq and seq[-1] in eos):
            dist[seq] = dist.get(seq, 0.0) + mass
            return
        logits = model.logits_for(tuple(prompt) + seq)
        if params.adjusts:  # logit_bias and penalties: under the history before this position
            logits = params.adjust(logits[None], prompt, [list(seq)])[0]
        if constraint is not None:  # then the grammar's mask after this prefix
            logits = apply_masks(logits[None], constraint.masks([list(seq)]))[0]
        probs = params.probs(logits)
        for token, p in enumerate(probs.tolist()):
            if p > 0:
                walk(seq + (token,), mass * p)

    walk((), 1.0)
    return dist



class ToyTokenizer:
    """Text for toy models: each token id stands for a short string; text is split greedily into the
    longest pieces first. Two toy tokenizers with different pieces are two vocabularies over the
    same text, as a real draft from another family has (what `drafters.cross` needs of a tokenizer)."""

    all_special_ids: tuple[int, ...] = ()
    added_tokens_decoder: dict = {}  # noqa: RUF012 (no added tokens, ever)
    backend_tokenizer = None
    eos_token_id = None

    def __init__(self, pieces: Sequence[str]) -> None:
        if len(set(pieces)) != len(pieces) or not all(pieces):
            raise ValueError(f"toy tokenizer pieces must be distinct non-empty strings, got {pieces}")
        self.pieces = list(pieces)
        self._ids = {p: i for i, p in enumerate(self.pieces)}
        self._longest = max(map(len, self.pieces))

    def __len__(self) -> int:
        return len(self.pieces)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return [self.pieces[i] for i in ids]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return "".join(self.pieces[int(i)] for i in ids)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids, at = [], 0
        while at < len(text):
            for n in range(min(self._longest, len(text) - at), 0, -1):
                if text[at : at + n] in self._ids:
                    ids.append(self._ids[text[at : at + n]])
                    at += n
                    break
            else:
                raise ValueError(f"the toy tokenizer {self.pieces} cannot write {text[at]!r}")
        return ids

    def __call__(self, text: str, add_special_tokens: bool = True, return_offsets_mapping: bool = False) -> dict:
        ids = self.encode(text)
        if not return_offsets_mapping:
            return {"input_ids": ids}
        offsets, at = [], 0
        for i in ids:
            offsets.append((at, at + len(self.pieces[i])))
            at += len(self.pieces[i])
        return {"input_ids": ids, "offset_mapping": offsets}


def chi2_pvalue(samples, probs: dict, min_expected: float = 5.0) -> float:
    """p-value of Pearson's chi-square test that `samples` were drawn from `probs` (outcome -> probability).

    Outcomes with an expected count below `min_expected` are pooled into one bin. An outcome with
    probability zero that was observed makes the p-value 0: that can never happen when the sampler
    is right. The tail of the chi-square distribution with k degrees of freedom at x is the
    regularised upper incomplete gamma function Q(k/2, x/2).
    """
    counts = Counter(samples)
    n = sum(counts.values())
    if any(probs.get(outcome, 0.0) <= 0.0 for outcome in counts):
        return 0.0
    observed, expected = [], []
    pooled_obs = pooled_exp = 0.0
    for outcome, p in probs.items():
        if n * p >= min_expected:
            observed.append(counts.get(outcome, 0))
            expected.append(n * p)
        else:
            pooled_obs += counts.get(outcome, 0)
            pooled_exp += n * p
    if pooled_exp > 0:
        observed.append(pooled_obs)
        expected.append(pooled_exp)
    if len(observed) < 2:
        return 1.0  # one bin: every sample in it, nothing to test
    obs = torch.tensor(observed, dtype=torch.float64)
    exp = torch.tensor(expected, dtype=torch.float64)
    exp = exp * n / exp.sum()  # an exact sum: probs may miss float rounding
    statistic = ((obs - exp) ** 2 / exp).sum()
    dof = torch.tensor((len(observed) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, statistic / 2))


# Sampling settings a drafter must be exact under: plain sampling and both truncations.
SETTINGS = {
    "temperature 1": SamplingParams(temperature=1.0),
    "top-k 2": SamplingParams(top_k=2),
    "top-p 0.8": SamplingParams(top_p=0.8),
}
PASS_PVALUE = 1e-3  # a check passes above this (a right drafter fails one setting with chance 1e-3)
CONTROL_PVALUE = 1e-6  # the broken verifier must score below this, or the check has no power here
LENGTH = 6  # new tokens a sample: longer than gamma + 1, so full iterations and rollbacks happen
PROMPT = [0]
# Text for the toy vocabularies: the target's pieces, and a draft vocabulary over the same text that
# shares three of them and merges "ab" into one token of its own.
TARGET_PIECES = ("a", "b", "c")
DRAFT_PIECES = ("a", "b", "ab", "c")


@dataclass
class ToyWorld:
    """The toy target, a draft model that resembles it (same vocabulary), and a draft with another
    vocabulary over the same text."""

    target: ToyModel
    draft: ToyModel
    other_vocab_draft: ToyModel


def toy_world(eos: Sequence[int] = ()) -> ToyWorld:
    target = ToyModel(3, seed=1, eos_token_ids=eos, tokenizer=ToyTokenizer(TARGET_PIECES))
    draft = ToyModel(3, seed=2, scale=1.0, base=target, eos_token_ids=eos, tokenizer=ToyTokenizer(TARGET_PIECES))
    other = ToyModel(4, seed=3, name="toy-other", tokenizer=ToyTokenizer(DRAFT_PIECES))
    return ToyWorld(target, draft, other)


def whole_sequence_pvalue(drafter, target: ToyModel, gamma, params: SamplingParams, samples: int = 2_000,
                          seed: int = 0, eos: Sequence[int] = (), length: int = LENGTH, grammar=None,
                          **options) -> float:
    """Draw `samples` whole sequences of `length` new tokens after PROMPT through
    `decode.speculative_decode` with `drafter` (one drafter for all: state it keeps between
    generations is part of what is checked) and return the chi-square p-value against the target's
    exactly enumerated distribution (under `grammar`, a `grammar.Grammar`, where given). `gamma`: a
    draft length or a policy (`gamma.GammaPolicy`). `options` go to `speculative_decode` (max_draft,
    min_draft)."""
    from .decode import speculative_decode
    from .grammar import constraint_for

    longest = gamma if isinstance(gamma, int) else gamma.max_gamma  # the most draft tokens a call keeps
    gen = torch.Generator().manual_seed(seed)
    outcomes = []
    # thousands of decodes of a toy model: most of their time is tensor operations' dispatch, which
    # inference mode shortens by a quarter (no autograd bookkeeping; the arithmetic is the same)
    with torch.inference_mode():
        for _ in range(samples):
            seq: list[int] = []
            for step in speculative_decode(target, drafter, PROMPT, gamma=gamma, params=params,
                                           max_new_tokens=length, generator=gen,
                                           constraint=constraint_for(grammar, target), **options):
                if not 1 <= len(step.tokens) - step.forced <= longest + 1:
                    raise RuntimeError(f"an iteration emitted {len(step.tokens)} tokens with gamma {gamma}")
                seq += step.tokens
            outcomes.append(tuple(seq))
    return chi2_pvalue(outcomes, sequence_distribution(target, PROMPT, params, length, frozenset(eos), grammar))


def _accept_all(draft, shadow, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator,
                lenience: float = 1.0):
    """The broken verifier: keeps every proposed token (a tree's main chain), then one target draw."""
    from .verify import Outcome, verify_draft

    if draft.gamma == 0:
        return verify_draft(draft, shadow, logits, params, generator, lenience)
    path = draft.main_path()
    token = int(draw(logits[:, len(path) if draft.parents is None else path[-1] + 1], params, generator))
    kept = draft.tokens[0, path].tolist()
    return Outcome(kept + [token], len(kept), [1.0] * len(kept), None if draft.parents is None else path)


@contextlib.contextmanager
def accept_everything():
    """Within it, the decode loop verifies with a broken verifier that accepts every draft token."""
    from . import decode

    original = decode.verify_draft
    decode.verify_draft = _accept_all
    try:
        yield
    finally:
        decode.verify_draft = original


@dataclass
class CheckResult:
    """One check's outcome: what ran, its statistic (a p-value, or identical/total), and whether it passed."""

    name: str
    statistic: str
    passed: bool
    note: str = ""


def statistical_checks(make: Callable[[ToyWorld], object], gamma: int = 3, samples: int = 2_000,
                       seed: int = 0) -> list[CheckResult]:
    """The drafter `make(world)` builds on the toy world, through whole-sequence chi-square tests
    under every setting in SETTINGS, then the control: the same drafter under the broken verifier,
    which must fail (else the check cannot see this drafter's errors, and says so)."""
    results = []
    for name, params in SETTINGS.items():
        world = toy_world()
        p = whole_sequence_pvalue(make(world), world.target, gamma, params, samples, seed)
        results.append(CheckResult(f"whole sequences, {name}", f"p = {p:.3g}", p > PASS_PVALUE,
                                   "" if p > PASS_PVALUE else "the output is not the target's distribution"))
    world = toy_world()
    with accept_everything():
        p = whole_sequence_pvalue(make(world), world.target, gamma, SETTINGS["temperature 1"], samples, seed)
    results.append(CheckResult("control: a verifier that accepts every draft must fail", f"p = {p:.3g}",
                               p < CONTROL_PVALUE, "" if p < CONTROL_PVALUE else
                               "the check cannot tell this drafter's output from a broken verifier's "
                               "(it proposes too little, or only what the target would draw)"))
    return results


def greedy_identity(target, make_drafter: Callable[[], object], prompts: Sequence[Sequence[int]], gamma: int = 4,
                    max_new_tokens: int = 48) -> CheckResult:
    """Greedy speculative output equal to plain greedy decoding on every prompt (a fresh drafter each)."""
    from .decode import autoregressive_decode, speculative_decode

    greedy, same, calls, tokens = SamplingParams(temperature=0), 0, 0, 0
    for prompt in prompts:
        plain = [t for s in autoregressive_decode(target, prompt, params=greedy, max_new_tokens=max_new_tokens)
                 for t in s.tokens]
        steps = list(speculative_decode(target, make_drafter(), prompt, gamma=gamma, params=greedy,
                                        max_new_tokens=max_new_tokens))
        spec = [t for s in steps for t in s.tokens]
        same += spec == plain
        calls, tokens = calls + len(steps), tokens + len(spec)
    return CheckResult(f"greedy identity, {len(prompts)} prompts", f"{same}/{len(prompts)} identical",
                       same == len(prompts), f"{tokens / max(calls, 1):.2f} tokens a target call")


def stand_in(drafter, world: ToyWorld, user_spec: str | None = None):
    """The same kind of drafter as `drafter`, built on the toy world: the same code with a toy model
    in place of its draft model (a draft with another vocabulary becomes the toy draft with another
    vocabulary), so the statistical checks run the drafter's own logic. A user's drafter (its
    `module:Name` spec given) is built again by its own factory around the toy target."""
    from .drafters import (LookupThenModelDrafter, ModelDrafter, NgramDrafter, PromptLookupDrafter, SuffixCache,
                           SuffixDrafter)
    from .drafters.cross import CrossVocabDrafter, SharedVocabDrafter, TextDrafter, VocabMap
    from .drafters.spec import build_user_drafter

    if user_spec is not None:
        return build_user_drafter(user_spec, world.target)
    if isinstance(drafter, LookupThenModelDrafter):
        return LookupThenModelDrafter(stand_in(drafter.model, world), min_match=1)
    if isinstance(drafter, ModelDrafter):
        return ModelDrafter(world.draft, min_confidence=drafter.min_confidence)
    if isinstance(drafter, CrossVocabDrafter):
        return CrossVocabDrafter(world.other_vocab_draft, world.target.tokenizer,
                                 VocabMap.between(world.target, world.other_vocab_draft))
    if isinstance(drafter, SharedVocabDrafter):
        return SharedVocabDrafter(world.other_vocab_draft, VocabMap.between(world.target, world.other_vocab_draft))
    if isinstance(drafter, TextDrafter):
        return TextDrafter(world.other_vocab_draft, world.target.tokenizer,
                           VocabMap.between(world.target, world.other_vocab_draft))
    if isinstance(drafter, NgramDrafter):
        return NgramDrafter(world.target.vocab, order=drafter.order, online=True, trees=drafter.proposes_trees)
    if isinstance(drafter, SuffixDrafter):
        return SuffixDrafter(SuffixCache(depth=4, max_nodes=30), trees=True)
    from .drafters.auto import AutoDrafter
    from .drafters.pool import NgramPool, PoolDrafter

    if isinstance(drafter, PoolDrafter):  # a small pool of short n-grams: the toy's sequences are short
        return PoolDrafter(NgramPool(1 << 8, orders=(2, 1)))
    if isinstance(drafter, AutoDrafter):
        return AutoDrafter(NgramPool(1 << 8, orders=(2, 1)), sources=drafter.sources, budget=4)
    if isinstance(drafter, PromptLookupDrafter):
        return PromptLookupDrafter()
    raise ValueError(f"no toy stand-in for {type(drafter).__name__}: check it as module:Name")
