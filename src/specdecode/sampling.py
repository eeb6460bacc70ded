"""Sampling settings turned into the adjusted distribution both models are compared under.

Leviathan et al. (2023), section 2.3: greedy, temperature, top-k and top-p sampling are all
"standard sampling from an adjusted distribution". Speculative sampling stays exact for any of
them as long as the target's and the draft's logits go through the *same* transform before
they are compared, which is what `SamplingParams.probs` is for.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch


MAX_REPEAT_LAST_N = 2**31 - 1  # llama.cpp's bound (an int32)


@dataclass(frozen=True)
class SamplingParams:
    """How a token is drawn from logits.

    temperature: 0 means greedy; otherwise logits are divided by it.
    top_k: keep the k most likely tokens (0 = no limit).
    top_p: keep the smallest set of most likely tokens whose mass reaches top_p (1 = no limit).
    greedy: a point mass on the argmax (ties go to the lowest token id).
    min_p: drop the tokens whose probability (after temperature and top-k) is below min_p times the
        best token's (0 = none; vLLM's and llama.cpp's meaning).
    logit_bias: (token id, bias) pairs added to the logits (OpenAI's; -100 bans a token in practice).
    presence_penalty, frequency_penalty: OpenAI's: a token's logit less presence_penalty if it
        appeared in the output so far, and less frequency_penalty times how often.
    repetition_penalty: vLLM's and llama.cpp's (`repeat_penalty`): a token among the tokens it reads
        has its logit divided by it where positive, multiplied where negative.
    repeat_last_n: which tokens the repetition penalty reads: -1 the prompt and the whole output
        (vLLM's `repetition_penalty`), n > 0 the last n tokens of prompt and output together
        (llama.cpp's `repeat_last_n`, 64 by default there), 0 none.

    The last four depend on the tokens before each position (`adjust`): the decode loop applies them
    to each verified position with the history its own prefix implies, drafted tokens before it
    included, so speculation stays exact under them.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    greedy: bool = False
    min_p: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    repeat_last_n: int = -1

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or math.isnan(self.temperature):
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if self.temperature < 0 or math.isinf(self.temperature):
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = no limit), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.min_p, (int, float)) or not (0.0 <= self.min_p <= 1.0):
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value!r}")
        if (isinstance(self.repetition_penalty, bool) or not isinstance(self.repetition_penalty, (int, float))
                or not 0.0 < self.repetition_penalty <= 10.0):
            raise ValueError(f"repetition_penalty must be in (0, 10], got {self.repetition_penalty!r}")
        if (isinstance(self.repeat_last_n, bool) or not isinstance(self.repeat_last_n, int)
                or not -1 <= self.repeat_last_n <= MAX_REPEAT_LAST_N):
            raise ValueError(f"repeat_last_n must be an integer in [-1, {MAX_REPEAT_LAST_N}] (-1 = the whole context), "
                             f"got {self.repeat_last_n!r}")
        bias = tuple(sorted((int(t), float(b)) for t, b in dict(self.logit_bias).items()))
        if any(t < 0 or not -100.0 <= b <= 100.0 for t, b in bias):
            raise ValueError("logit_bias maps token ids >= 0 to biases in [-100, 100]")
        object.__setattr__(self, "logit_bias", bias)
        if self.temperature == 0 and not self.greedy:
            object.__setattr__(self, "greedy", True)

    @property
    def adjusts(self) -> bool:
        """Whether `adjust` changes anything (logit_bias or a penalty is set)."""
        return bool(self.logit_bias) or self.presence_penalty != 0 or self.frequency_penalty != 0 or \
            self.repetition_penalty != 1

    def adjust(self, logits: torch.Tensor, prompt: Sequence[int], outputs: Sequence[Sequence[int]]) -> torch.Tensor:
        """Row i of logits [k, V] under the controls that depend on what came before it: logit_bias,
        then the repetition penalty over `prompt` and outputs[i] (their last `repeat_last_n` tokens
        where that is set), then the presence and frequency penalties over outputs[i] (the tokens
        generated before row i's position) -> float32 [k, V].
        (`History` keeps the same counts as tokens are emitted, for the decode loop.)"""
        history = History(self, prompt, logits.shape[-1])
        return history.adjust(logits, list(outputs))

    def penalise(self, logits: np.ndarray, seen: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """The penalties on logits [k, n] of n tokens, given which of them the repetition penalty reads
        for each row (seen [k, n] bool) and how often each row's output holds them (counts [k, n]),
        all numpy -> float32 [k, n]. Each token's penalty reads only its own column, so any subset of
        the vocabulary can be passed."""
        out = logits.astype(np.float32)
        if self.repetition_penalty != 1:
            with np.errstate(over="ignore"):  # a tiny penalty: clamped to float32's largest below
                divided = np.minimum(out / np.float32(self.repetition_penalty), np.finfo(np.float32).max)
                out = np.where(seen, np.where(out > 0, divided, out * np.float32(self.repetition_penalty)), out)
        if self.frequency_penalty:
            out = out - np.float32(self.frequency_penalty) * counts
        if self.presence_penalty:
            out = out - np.float32(self.presence_penalty) * (counts > 0)
        return out.astype(np.float32)

    @property
    def is_greedy(self) -> bool:
        return self.greedy

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Adjusted distribution: logits [..., V] -> float32 probabilities [..., V]."""
        if logits.dim() == 0 or logits.shape[-1] == 0:
            raise ValueError(f"logits must have a non-empty last (vocabulary) dimension, got shape {tuple(logits.shape)}")
        logits = logits.float()
        top = check_logits(logits)  # [...]: each row's largest logit
        if self.greedy:
            # argmax returns the first maximal index: ties are broken towards the lowest id.
            return torch.nn.functional.one_hot(argmax(logits), logits.shape[-1]).float()
        # shifted so the best token sits at 0 before dividing, and a temperature below float32's
        # smallest normal taken as that: a tiny temperature sends the others to -inf (a point mass on
        # the best, uniform over exact ties), never inf - inf or 0 / 0 = NaN
        temperature = max(self.temperature, torch.finfo(torch.float32).tiny)
        logits = (logits - top.unsqueeze(-1)) / temperature
        if self.top_k and self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k, dim=-1).values[..., -1:]  # [..., 1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if self.min_p > 0:  # relative to the best token, whose probability is exp(0) / Z
            probs = probs.masked_fill(probs < self.min_p * probs.amax(-1, keepdim=True), 0.0)
            probs = probs / probs.sum(-1, keepdim=True)
        if self.top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            mass_before = sorted_probs.cumsum(-1) - sorted_probs  # mass of strictly better tokens
            drop_sorted = mass_before >= self.top_p
            drop_sorted[..., 0] = False  # the most likely token never (a top_p below float32's range rounds to 0)
            drop = drop_sorted.scatter(-1, order, drop_sorted)
            probs = probs.masked_fill(drop, 0.0)
            probs = probs / probs.sum(-1, keepdim=True)
        return probs


class History:
    """What the history-dependent controls read, kept as a generation goes: the tokens the prompt or
    the output touched (the columns), which of them the prompt holds, how often the output holds each,
    and with a repetition window (`repeat_last_n` > 0) the last tokens of prompt and output.
    A call's rows are scored with these plus the drafted tokens before each row (`adjust`), on the
    touched tokens' columns only: the penalties leave every other logit as it is, so a call costs
    what the few hundred tokens seen so far cost, not the vocabulary. The bookkeeping is numpy and
    plain Python: a call's few dozen small operations cost microseconds each there, where each torch
    call's dispatch cost more than the arithmetic."""

    def __init__(self, params: SamplingParams, prompt: Sequence[int], vocab_size: int) -> None:
        self.params, self.vocab_size = params, vocab_size
        ids = self._ids(prompt)
        self.column: dict[int, int] = {}  # token id -> its column
        self.columns = np.zeros(0, dtype=np.int64)  # [n]: the touched ids, in column order
        self.in_prompt = np.zeros(0, dtype=bool)  # [n]
        self.counts = np.zeros(0, dtype=np.float32)  # [n]: in the output so far
        self._touch(ids)
        self.in_prompt[[self.column[t] for t in ids]] = True
        window = params.repeat_last_n
        self.recent = deque(ids[-window:], maxlen=window) if window > 0 else None

    def _ids(self, tokens: Sequence[int]) -> list[int]:
        return [int(t) for t in tokens if 0 <= t < self.vocab_size]

    def _touch(self, ids: Sequence[int]) -> None:
        """Columns for the ids not seen before."""
        new = [t for t in dict.fromkeys(ids) if t not in self.column]
        if new:
            self.column.update((t, len(self.columns) + j) for j, t in enumerate(new))
            self.columns = np.concatenate([self.columns, np.array(new, dtype=np.int64)])
            self.in_prompt = np.concatenate([self.in_prompt, np.zeros(len(new), dtype=bool)])
            self.counts = np.concatenate([self.counts, np.zeros(len(new), dtype=np.float32)])

    def extend(self, tokens: Sequence[int]) -> None:
        """Tokens emitted into the output."""
        ids = self._ids(tokens)
        self._touch(ids)
        for t in ids:
            self.counts[self.column[t]] += 1
        if self.recent is not None:
            self.recent.extend(ids)

    def adjust(self, logits: torch.Tensor, extra: Sequence[Sequence[int]]) -> torch.Tensor:
        """logits [k, V], row i after the output so far and then the tokens extra[i] -> float32 [k, V]."""
        params, out = self.params, logits.float().clone()
        if params.logit_bias:
            V = out.shape[-1]
            out[:, torch.tensor([t for t, _ in params.logit_bias if t < V], dtype=torch.long)] += torch.tensor(
                [b for t, b in params.logit_bias if t < V])
        if params.repetition_penalty == 1 and not params.presence_penalty and not params.frequency_penalty:
            return out
        drafted = [self._ids(tokens) for tokens in extra]
        self._touch([t for ids in drafted for t in ids])  # a drafted token the context never held
        column, k = self.column, out.shape[0]
        counts = np.repeat(self.counts[None], k, axis=0)  # [k, n]
        for i, ids in enumerate(drafted):
            for t in ids:
                counts[i, column[t]] += 1
        window = params.repeat_last_n
        if window < 0:
            seen = self.in_prompt | (counts > 0)  # [k, n]
        else:
            seen = np.zeros(counts.shape, dtype=bool)
            if window:
                recent = list(self.recent)
                for i, ids in enumerate(drafted):
                    seen[i, [column[t] for t in (recent + ids)[-window:]]] = True
        if out.device.type == "cpu":  # in place through numpy's flat view (numpy's 2-D fancy indexing is slow)
            flat = out.numpy().reshape(-1)
            where = (np.arange(k)[:, None] * out.shape[1] + self.columns).reshape(-1)  # [k * n]
            flat[where] = params.penalise(flat[where].reshape(k, -1), seen, counts).reshape(-1)
            return out
        index = torch.from_numpy(self.columns).to(out.device)
        block = out.index_select(1, index).cpu().numpy()  # [k, n]
        return out.index_copy_(1, index, torch.from_numpy(params.penalise(block, seen, counts)).to(out.device))


def check_logits(logits: torch.Tensor) -> torch.Tensor:
    """-inf marks a token a model cannot emit (probability 0, e.g. outside a draft's reduced
    vocabulary); NaN, +inf, or a row with every token at -inf make the output unusable. Returns
    each row's largest logit, [...] (what a softmax shifts by)."""
    top = logits.amax(-1)  # one pass: NaN propagates through max, +inf and all -inf show in it
    on_cpu = top.device.type == "cpu" and top.dtype == torch.float32  # numpy's test: no torch dispatch
    if np.isfinite(top.detach().numpy()).all() if on_cpu else torch.isfinite(top).all():
        return top
    if torch.isnan(top).any():
        raise ValueError("logits contain NaN values; the model's output is not usable")
    if torch.isposinf(top).any():
        raise ValueError("logits contain infinite values; the model's output is not usable")
    raise ValueError("logits are -inf for every token; the model's output is not usable")


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row: probs [..., V] -> token ids [...] (int64).

    Inverse-CDF sampling: one uniform per row against the cumulative distribution (in float64, so
    rounding cannot shift mass between tokens). Over a 49k vocabulary this takes tens of
    microseconds where torch.multinomial takes most of a millisecond. A token with zero
    probability is never drawn: its CDF step is flat, and the search returns the first index
    whose CDF exceeds the uniform.
    """
    flat = probs.reshape(-1, probs.shape[-1]).double()  # [N, V]
    cdf = flat.cumsum(-1)  # [N, V]
    u = torch.rand(flat.shape[0], 1, generator=generator, dtype=torch.float64, device=flat.device) * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, u, right=True)  # [N, 1]
    # u rounding up to the total (odds ~1e-16) would run off the end: take the last token with mass.
    last = torch.searchsorted(cdf, cdf[:, -1:].contiguous(), right=False)  # [N, 1]
    return torch.minimum(tokens, last).reshape(probs.shape[:-1])


def sample_distinct(probs: torch.Tensor, k: int, generator: torch.Generator | None = None) -> list[int]:
    """Up to k distinct tokens from probs [V], in the order of drawing one after another without
    replacement (each draw from probs renormalised over the tokens not yet drawn). Exponential
    races: token x finishes at E_x / p(x) with E_x ~ Exp(1); the finishing order is that sequence
    of draws. Tokens with zero probability never finish, so fewer than k may come back."""
    u = torch.rand(probs.shape, generator=generator, dtype=torch.float64, device=probs.device)  # [V]
    times = torch.where(probs > 0, -torch.log1p(-u) / probs.double(), torch.full_like(u, math.inf))  # [V]
    k = min(k, int((probs > 0).sum()))
    return torch.topk(times, k, largest=False).indices.tolist() if k else []


def draw(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row straight from logits [..., V] -> [...]: `sample(params.probs(logits))`,
    except that greedy takes the argmax directly (the same token, ~5x less work per step)."""
    if not params.is_greedy:
        return sample(params.probs(logits), generator)
    check_logits(logits)
    return argmax(logits)


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """The first largest entry's index along the last dimension, [..., V] -> [...] int64: numpy's
    on a CPU float32 tensor (the same first-maximum rule; torch's dispatch costs about ten times
    the work at one row of a 49k vocabulary, ~45 against ~4 microseconds), torch's elsewhere."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return torch.from_numpy(np.asarray(logits.detach().numpy().argmax(-1), dtype=np.int64))
    return logits.argmax(-1)


def make_generator(seed: int | None, generator: torch.Generator | None = None,
                   device: torch.device | str = "cpu") -> torch.Generator:
    """The random source of one generation: `generator` if given, else one on `device` (where the
    target's logits live) seeded with `seed` (or from the OS when seed is None)."""
    if generator is not None:
        return generator
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen
