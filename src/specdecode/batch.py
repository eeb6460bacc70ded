"""Continuous batching: several requests decoded together, one ragged target forward a step.

Each request is a `decode.Decoding` (its own cache, drafter, gamma policy and random generator)
and a `text.TextPieces`. A step, as the `scheduler.Scheduler` decides who runs and how much,

1. admits waiting requests into free slots (at most `max_batch` hold a cache at once);
2. feeds prompts: where the target computes prompt rows row-invariantly, up to `prompt_rows` prompt
   tokens join the decode forward, the shortest prompts first (after the longest prefix reused from
   recent prompts, `prefix.PrefixCache`; a prompt several requests share, as n choices do, is computed
   once while the others wait for it); elsewhere one `PREFILL_CHUNK` of one prompt runs apart. Either way a long
   prompt never stalls the requests already decoding for long;
3. plans the draft length of every decoding request together (`Scheduler.draft_lengths`: the cost model
   of `--gamma auto` over the batch's rows, so speculation shrinks and stops as the batch fills);
4. runs their target calls in ONE forward (`models.base.forward_batch`), then verifies each.

Requests join and leave between steps. The native backend's kernels are row-invariant: a
request's logits do not depend on what shares the forward, so greedy output, and seeded sampled
output at a fixed gamma, are the tokens the request gets alone. With a planned gamma the draws
fall differently; the output distribution is still exactly the target's.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Sequence

from . import defaults
from .decode import Decoding, check_request
from .drafters.base import Drafter
from .drafters.lookup import PromptLookupDrafter
from .gamma import AUTO, AdaptiveGamma, GammaPolicy, as_policy
from .grammar import Constraint, Grammar, constraint_for
from .models.base import ForwardCall, capabilities, forward_batch, request_cache
from .checks import check_lenience, check_logprobs, check_stop
from .prefix import PrefixCache
from .scheduler import Scheduler
from .sampling import SamplingParams
from .stats import Stats
from .text import TextPieces, TextStep


@dataclass(frozen=True)
class Settings:
    """How one request decodes: the one object a request's fields travel in, from the server's
    parsing of a body (`server.request.Request.settings`) or a library call to the batch and its
    `Decoding`. `Batch.submit` takes it, or these fields by name."""

    gamma: int | str | GammaPolicy | None = None  # None: the batch's default (`--gamma auto`)
    params: SamplingParams = SamplingParams()
    max_new_tokens: int = 128
    lenience: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None  # alternatives each token's log-probability lists (None: none)
    grammar: Grammar | None = None  # what the output follows (`grammar.Grammar`)
    max_draft: int | None = None  # the longest draft it verifies (`Decoding`; 0: none; None: no cap)
    min_draft: int = 0  # deterministic drafts shorter than this are not verified


@dataclass(eq=False)
class BatchRequest:
    """One request in a `Batch`: its settings, its statistics, and how it ended."""

    prompt_ids: list[int]
    drafter: Drafter | None
    settings: Settings
    constraint: Constraint | None = None  # its grammar compiled for the target (`grammar.Constraint`)
    id: int = 0
    stats: Stats = field(default_factory=Stats)
    text: str = ""  # the text handed out so far
    finish_reason: str | None = None  # "eos", "length", "stop", "cancelled" or "error"
    error: str | None = None
    decoding: Decoding | None = None  # while it holds a slot
    pieces: TextPieces | None = None
    started: float = 0.0  # when it was submitted (perf_counter)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class Batch:
    """Requests decoded together on one target. `submit` queues one; `step` advances the batch by
    one target forward and returns the text pieces it produced; `run` steps until all are done.

    max_batch: requests holding a KV cache at once (the native backend sizes each to the request's
    prompt + max_new_tokens); the rest wait, in order.
    max_gamma: the longest draft a planned ("auto") request gets.
    prompt_rows: prompt tokens a step feeds beside the decode rows, where the target computes prompts
    row-invariantly (`row_invariant_prompts`); elsewhere a step runs one `PREFILL_CHUNK` of one prompt.
    prefix_bytes: memory for recent prompts' keys and values, reused by later prompts that share a
    prefix with them (`prefix.PrefixCache`; there too, and for the native backend's caches); 0: none.
    clock: seconds, for the step timings the requests' gamma policies learn from.
    """

    def __init__(self, target, max_batch: int = defaults.MAX_BATCH, max_gamma: int = defaults.MAX_GAMMA,
                 prompt_rows: int = defaults.PROMPT_ROWS, prefix_bytes: int = defaults.PREFIX_MIB << 20,
                 clock: Callable[[], float] = time.perf_counter, scheduler: Scheduler | None = None) -> None:
        """`scheduler`: who runs in each step (`scheduler.Scheduler`); by default one of max_batch,
        max_gamma and prompt_rows."""
        self.target, self.clock = target, clock
        self.scheduler = scheduler or Scheduler(max_batch=max_batch, max_gamma=max_gamma, prompt_rows=prompt_rows)
        self.can = capabilities(target)
        self.prefixes = (PrefixCache(prefix_bytes) if prefix_bytes and self.can.row_invariant_prompts
                         and self.can.sized_caches else None)
        self.waiting: list[BatchRequest] = []
        self.active: list[BatchRequest] = []
        self._ids = itertools.count()
        self._auto: AdaptiveGamma | None = None  # the target's measured curve, shared by "auto" requests
        self._prefilling: dict[int, tuple] = {}  # request id -> (its prefill call, prompt tokens fed so far)
        self.last_forward: tuple[int, int] | None = None  # the last step's decode forward: (requests, rows)

    def submit(self, prompt_ids: Sequence[int], drafter: Drafter | None = None, settings: Settings = Settings(), *,
               stats: Stats | None = None, **fields) -> BatchRequest:
        """Queue a request (plain decoding when `drafter` is None) with its `Settings`, or the same
        fields by name (which override `settings`'); bad settings raise ValueError here (a grammar
        that does not compile: `grammar.GrammarError`). `stats`: filled in as the request decodes (a
        fresh one by default)."""
        try:
            settings = replace(settings, **fields)
        except TypeError as err:
            raise TypeError(f"Batch.submit: {err}; its settings are the fields of batch.Settings") from None
        prompt_ids = list(prompt_ids)
        check_request(self.target, prompt_ids, settings.max_new_tokens)
        check_lenience(settings.lenience)
        gamma = AUTO if settings.gamma is None else settings.gamma
        if drafter is None:
            drafter, gamma = PromptLookupDrafter(), 0  # gamma 0: never asked to draft
        if gamma != AUTO:
            as_policy(gamma)  # checks it
        settings = replace(settings, gamma=gamma, stop=check_stop(settings.stop),
                           logprobs=check_logprobs(settings.logprobs))
        request = BatchRequest(prompt_ids, drafter, settings, constraint_for(settings.grammar, self.target),
                               id=next(self._ids), stats=Stats() if stats is None else stats)
        request.started = self.clock()
        self.waiting.append(request)
        return request

    def cancel(self, request: BatchRequest) -> None:
        """Stop a request now: its slot (and cache) is freed before the next step."""
        if not request.finished:
            self._end(request, "cancelled")

    @property
    def done(self) -> bool:
        return not self.waiting and not self.active

    def run(self) -> Iterator[tuple[BatchRequest, TextStep]]:
        while not self.done:
            yield from self.step()

    def step(self) -> list[tuple[BatchRequest, TextStep]]:
        """Admit waiting requests, then one forward: decode rows with prompt pieces beside them (or one
        prompt chunk apart, then the decode rows). Returns the text pieces made."""
        out: list[tuple[BatchRequest, TextStep]] = []
        self.last_forward = None
        for r in self.scheduler.admit(self.waiting, self.active):
            self._admit(r)
        if self.can.row_invariant_prompts:  # prompt pieces join the decode forward
            if self.active:
                self._decode(list(self.active), out)
            return out
        prefilling = next((r for r in self.active if self._prompt_left(r)), None)
        if prefilling is not None:
            self._prefill_chunk(prefilling, out)
        decoding = [r for r in self.active if r is not prefilling and not self._prompt_left(r)]
        if decoding:
            self._decode(decoding, out)
        return out

    @staticmethod
    def _prompt_left(r: BatchRequest) -> bool:
        return r.decoding.emitted == 0

    # -- the parts of a step --

    def _policy(self, gamma):
        if gamma != AUTO:
            return gamma
        if self._auto is None:
            self._auto = as_policy(AUTO, self.target, self.scheduler.max_gamma)
        return self._auto.fresh()

    def _admit(self, r: BatchRequest) -> None:
        try:
            s = r.settings
            cache = request_cache(self.target, len(r.prompt_ids) + s.max_new_tokens)
            r.decoding = Decoding(self.target, r.drafter, r.prompt_ids, gamma=self._policy(s.gamma), params=s.params,
                                  max_new_tokens=s.max_new_tokens, lenience=s.lenience, seed=s.seed, cache=cache,
                                  clock=self.clock, logprobs=s.logprobs, constraint=r.constraint,
                                  max_draft=s.max_draft, min_draft=s.min_draft)
            if self.prefixes is not None:  # a shared prefix of the prompt, computed once already
                self.prefixes.fill(r.prompt_ids, cache)
        except Exception as err:  # noqa: BLE001  (a request that cannot start fails alone)
            r.error, r.finish_reason = f"{type(err).__name__}: {err}", "error"
            return
        r.pieces = TextPieces(self.target.tokenizer, r.settings.stop, r.stats)
        self.active.append(r)

    def _prefill_chunk(self, r: BatchRequest, out: list) -> None:
        """One chunk of r's prompt (all of it where the target cannot prefill in chunks); the last one
        also draws r's first token."""
        d, target = r.decoding, self.target
        try:
            if r.id not in self._prefilling:
                self._prefilling[r.id] = (d.prepare(), 0)  # the prefill call: the whole prompt, no draft
            call, done = self._prefilling[r.id]
            chunk = self.can.PREFILL_CHUNK
            started = self.clock()
            if chunk is None or (done == 0 and call.tokens.shape[1] <= chunk):
                logits = target.forward(call.tokens, d.cache, num_logits=1)
            else:  # the prefill numerics for every chunk, as one call over the whole prompt computes them
                logits = target.forward(call.tokens[:, done : done + chunk], d.cache, num_logits=1, prefill=True)
                done += chunk
                if done < call.tokens.shape[1]:
                    self._prefilling[r.id] = (call, done)
                    return
            del self._prefilling[r.id]
            self._add(r, d.complete(logits, started=started), out)
        except Exception as err:  # noqa: BLE001
            self._fail(r, err)

    def _decode(self, requests: list[BatchRequest], out: list) -> None:
        """Plan, draft, one forward over every request's rows (and pieces of prompts, up to
        `prompt_rows` of them, where the target computes prompts row-invariantly), verify."""
        decoding = [r for r in requests if not self._prompt_left(r)]
        calls, ready, last = [], [], []  # last: whether the call ends its request's iteration
        computing = {tuple(r.prompt_ids) for r in requests if r.id in self._prefilling}
        for r in requests:
            if self._prompt_left(r) and r.id not in self._prefilling:
                if self.prefixes is not None:
                    if tuple(r.prompt_ids) in computing:  # the same prompt is being computed (n choices):
                        continue  # wait for it, then copy its keys and values
                    self.prefixes.fill(r.prompt_ids, r.decoding.cache)  # stored since it was admitted
                try:
                    self._prefilling[r.id] = (r.decoding.prepare(), 0)  # the whole prompt, no draft
                    computing.add(tuple(r.prompt_ids))
                except Exception as err:  # noqa: BLE001
                    self._fail(r, err)
        left = [(r, call.tokens.shape[1] - done) for r in requests if r.id in self._prefilling
                for call, done in [self._prefilling[r.id]]]
        for r, size in self.scheduler.prompt_pieces(left):
            call, done = self._prefilling[r.id]
            calls.append(ForwardCall(call.tokens[:, done : done + size], call.cache, 1))
            ready.append(r)
            last.append(done + size == call.tokens.shape[1])
            self._prefilling[r.id] = (call, done + size)
        prompt_rows = sum(c.tokens.shape[1] for c in calls)
        gammas = self.scheduler.draft_lengths([r.decoding for r in decoding], prompt_rows)
        for r, g in zip(decoding, gammas):
            try:
                calls.append(r.decoding.prepare(g))
                ready.append(r)
                last.append(True)
            except Exception as err:  # noqa: BLE001
                self._fail(r, err)
        if not calls:
            return
        rows = sum(c.tokens.shape[1] for c in calls)
        self.last_forward = (len(calls), rows)
        started = self.clock()
        lengths = [len(c.cache) for c in calls]
        try:
            logits = forward_batch(self.target, calls)
        except Exception:  # noqa: BLE001  (one request's state may have failed it for all: find which)
            logits = self._forward_alone(calls, lengths, ready)
        for r, row_logits, ends in zip(ready, logits, last):
            if not ends or row_logits is None:
                continue
            try:
                if self._prefilling.pop(r.id, None) and self.prefixes is not None:
                    self.prefixes.store(r.prompt_ids, r.decoding.cache)
                self._add(r, r.decoding.complete(row_logits, started=started, rows=rows), out)
            except Exception as err:  # noqa: BLE001
                self._fail(r, err)

    def _forward_alone(self, calls: list[ForwardCall], lengths: list[int], ready: list[BatchRequest]) -> list:
        """After a batched forward failed: every call again on its own, from the cache length it had
        before, so a failure is only its own request's (None in its place: that request has failed)."""
        out = []
        for call, length, r in zip(calls, lengths, ready):
            try:
                _rewind(call.cache, length)
                out.append(forward_batch(self.target, [call])[0])
            except Exception as err:  # noqa: BLE001
                _rewind(call.cache, length)
                self._fail(r, err)
                out.append(None)
        return out

    def _add(self, r: BatchRequest, step, out: list) -> None:
        piece = r.pieces.add(step)
        r.text += piece.accepted_text + piece.target_text
        out.append((r, piece))
        if piece.finish_reason:
            self._end(r, piece.finish_reason)

    def _fail(self, r: BatchRequest, err: Exception) -> None:
        r.error = f"{type(err).__name__}: {err}"
        self._end(r, "error")

    def _end(self, r: BatchRequest, reason: str) -> None:
        r.finish_reason = r.stats.finish_reason = reason
        if r in self.waiting:
            self.waiting.remove(r)
        if r in self.active:
            self.active.remove(r)
        self._prefilling.pop(r.id, None)
        r.decoding = None  # frees its cache


def _rewind(cache, length: int) -> None:
    """Drop what a failed forward may have appended to `cache` past `length` positions."""
    if len(cache) > length:
        cache.trim(len(cache) - length)


def generate_batch(target, prompts: Sequence[Sequence[int]], drafter=None, *, max_batch: int = defaults.MAX_BATCH,
                   **settings) -> list[BatchRequest]:
    """Decode several prompts together (continuous batching on one target) and return their requests
    (`.text`, `.stats`, `.finish_reason`), in prompt order.

    `drafter`: None (plain decoding), one callable making a fresh drafter per prompt, or a list of
    drafters (or None), one per prompt. `settings`: `Batch.submit`'s keywords, each either one value
    for all prompts or a list with one per prompt (e.g. seed=[1, 2, 3]).
    """
    n = len(prompts)
    per = {}
    for key, value in settings.items():
        if isinstance(value, list):
            if len(value) != n:
                raise ValueError(f"{key} has {len(value)} values for {n} prompts")
            per[key] = value
        else:
            per[key] = [value] * n
    if isinstance(drafter, list):
        if len(drafter) != n:
            raise ValueError(f"{len(drafter)} drafters for {n} prompts")
        drafters = drafter
    else:
        drafters = [drafter() if callable(drafter) else drafter for _ in range(n)]
    batch = Batch(target, max_batch=max_batch)
    requests = [batch.submit(p, drafters[i], **{k: v[i] for k, v in per.items()}) for i, p in enumerate(prompts)]
    for _ in batch.run():
        pass
    return requests
