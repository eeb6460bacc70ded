"""The serving engine: one loaded target, its drafters, and one worker thread that decodes up to
`max_batch` requests together (continuous batching, `specdecode.batch`): requests join and leave
between target forwards, each with its own KV cache, and get the tokens they would get alone.

Requests beyond the batch wait in a bounded queue; past `max_queue` waiting, `submit` refuses with
a 429 that says when to retry. Each job streams its text pieces back to the event loop that
submitted it; a job whose client went away is cancelled: the worker frees its slot before the
next forward (or drops it if it had not started).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from .. import defaults
from ..batch import Batch, BatchRequest
from ..decode import token_logprobs
from ..drafters.spec import DraftSpec, built_in, load_draft_model, make_drafter
from ..checks import check_queue_size
from ..models.base import request_cache
from ..scheduler import Scheduler
from ..stats import Stats
from .request import Request, RequestError


@dataclass
class Job:
    request: Request
    prompt_ids: list[int]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue  # ("piece", TextStep) ... then ("done", Stats) or ("error", message)
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)
    stats: Stats = field(default_factory=Stats)
    first_token_seconds: float | None = None
    prompt_logprobs: list | None = None  # echo with logprobs: the prompt's tokens from the second on (TokenLogprob)

    def emit(self, kind: str, value) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


class Engine:
    """target: a loaded model; drafts: drafter name -> spec (loaded once, here); gamma: the default
    draft length or "auto" (planned over the batch); max_batch: requests decoded together; prompt_rows:
    prompt tokens a step feeds beside the decode rows and prefix_bytes: memory for recent prompts' keys and values
    (`Batch`);
    max_queue: requests that may wait behind them. on_finish(job) after each request; on_step(requests,
    rows) after each batched decode forward."""

    def __init__(self, target, drafts: dict[str, str], default_draft: str, gamma: int | str = "auto",
                 max_gamma: int = defaults.MAX_GAMMA, max_queue: int = defaults.MAX_QUEUE,
                 max_batch: int = defaults.MAX_BATCH, prompt_rows: int = defaults.PROMPT_ROWS,
                 prefix_bytes: int = defaults.PREFIX_MIB << 20,
                 on_finish: Callable[[Job], None] | None = None,
                 on_step: Callable[[int, int], None] | None = None, **load_options) -> None:
        if default_draft not in drafts:
            raise ValueError(f"the default draft {default_draft!r} is not among the loaded ones: {', '.join(drafts)}")
        check_queue_size("max_queue", max_queue)
        self.scheduler = Scheduler(max_batch=max_batch, max_gamma=max_gamma, prompt_rows=prompt_rows,
                                   max_queue=max_queue)  # checks them
        self._batch = Batch(target, prefix_bytes=prefix_bytes, scheduler=self.scheduler)
        self.target = target
        self.default_draft = default_draft
        self.gamma = gamma
        self.on_finish, self.on_step = on_finish, on_step
        self._factories = {}
        for name, spec in drafts.items():  # draft models load now, once; drafters are made per request
            spec = DraftSpec(spec)
            model = memory = own = None
            if spec.model_path is not None:
                model = load_draft_model(spec.model_path, target, **load_options)
            if (kind := built_in(spec.spec)) is not None and kind.memory is not None:
                memory = kind.memory(target, max_gamma)  # earlier outputs, an n-gram pool: shared by its requests
                own = kind.alone(memory) if kind.alone is not None else None  # what a request alone gets instead
            # p_min: a request's own confidence below which a draft model stops (llama-server's speculative.p_min);
            # alone: the drafter reads nothing other requests left (`Kind.alone`)
            self._factories[name] = (lambda p_min=None, alone=False, spec=spec, model=model, memory=memory, own=own:
                                     make_drafter(spec if p_min is None else replace(spec, min_confidence=p_min),
                                                  target, draft_model=model, memory=own if alone else memory))
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._admitted = 0  # waiting + decoding
        self._service_seconds = 1.0  # running mean of one request's decoding time (not its wait), for Retry-After
        self._worker = threading.Thread(target=self._run, name="specdecode-engine", daemon=True)
        self._worker.start()

    @property
    def drafts(self) -> list[str]:
        return list(self._factories)

    @property
    def in_flight(self) -> int:
        return self._admitted

    def check_draft(self, name: str | None) -> None:
        if name is not None and name not in self._factories:
            raise RequestError(400, f"unknown draft {name!r}; this server has: {', '.join(self._factories)}",
                               "specdecode.draft", "invalid_value")

    def submit(self, job: Job) -> None:
        """Queue a job, or refuse with 429 when `max_queue` jobs already wait behind a full batch."""
        self.check_draft(job.request.draft)
        with self._lock:
            full = self.scheduler.refusal(self._admitted, self._service_seconds)
            if full is not None:
                waiting, retry = full
                waits = "1 request is waiting" if waiting == 1 else f"{waiting} requests are waiting"
                raise RequestError(429, f"the server is busy: {waits} (at most {self.scheduler.max_queue}); "
                                        f"retry in about {retry} s",
                                   None, "queue_full", type="rate_limit_error", headers={"Retry-After": str(retry)})
            self._admitted += 1
        self._queue.put(job)

    def close(self) -> None:
        self._queue.put(None)
        self._worker.join(timeout=30)

    def _run(self) -> None:
        batch, jobs = self._batch, {}  # BatchRequest -> Job
        while True:
            try:  # new jobs join between forwards; with nothing to do, wait for one
                while True:
                    job = self._queue.get(block=batch.done)
                    if job is None:
                        return
                    self._start(job, jobs)
            except queue.Empty:
                pass
            for r, job in jobs.items():
                if job.cancelled.is_set():
                    batch.cancel(r)
            for r, piece in batch.step():
                job = jobs[r]
                if job.first_token_seconds is None:
                    job.first_token_seconds = time.perf_counter() - job.submitted
                job.emit("piece", piece)
            if batch.last_forward and self.on_step:
                self.on_step(*batch.last_forward)
            for r in [r for r in jobs if r.finished]:
                self._end(r, jobs.pop(r))

    def _start(self, job: Job, jobs: dict) -> None:
        request = job.request
        if job.cancelled.is_set():  # the client left while it waited
            job.stats.finish_reason = "cancelled"
            self._end(None, job)
            return
        try:
            settings = request.settings
            if request.echo and settings.logprobs is not None:
                job.prompt_logprobs = self._prompt_logprobs(job.prompt_ids, settings.logprobs)
            # A seeded sampled request drafts from itself alone: its text then depends on its prompt and
            # seed, not on what other requests left in a shared memory (greedy text never depends on drafts)
            alone = settings.seed is not None and settings.params.temperature > 0
            drafter = self._factories[request.draft or self.default_draft](p_min=request.p_min, alone=alone)
            if settings.gamma is None:
                settings = replace(settings, gamma=self.gamma)  # the server's --gamma
            r = self._batch.submit(job.prompt_ids, drafter, settings, stats=job.stats)
        except Exception as err:  # a request that cannot start fails alone
            job.emit("error", f"generation failed: {type(err).__name__}: {err}")
            self._end(None, job)
            return
        jobs[r] = job

    def _prompt_logprobs(self, ids: list[int], top: int) -> list:
        """Each prompt token's log-probability given the ones before it (from the second token on),
        from one forward over the prompt in a cache of its own (the batch then prefills it again:
        evaluation tools that send `echo` ask for one token or none)."""
        logits = self.target.forward(torch.tensor([ids]), request_cache(self.target, len(ids)),
                                     num_logits=len(ids))  # [1, T, V]
        return token_logprobs(logits[:, :-1], ids[1:], None, top)

    def _end(self, r: BatchRequest | None, job: Job) -> None:
        if r is not None and r.finish_reason == "error":
            job.emit("error", f"generation failed: {r.error}")
        elif r is not None:
            job.emit("done", job.stats)
        with self._lock:
            self._admitted -= 1
            if r is not None and r.finish_reason != "cancelled":
                self._service_seconds = 0.8 * self._service_seconds + 0.2 * (time.perf_counter() - r.started)
        if self.on_finish:
            self.on_finish(job)
