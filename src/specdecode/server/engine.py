"""The serving engine: one loaded target, its drafters, and one worker thread that runs one
generation at a time (a model's KV cache never serves two requests at once).

Requests wait in a bounded queue; past `max_queue` waiting, `submit` refuses with a 429 that says
when to retry. Each job streams its text pieces back to the event loop that submitted it; a job
whose client went away is cancelled: the worker stops it at the next target call (or skips it if
it had not started) and takes the next one.
"""

from __future__ import annotations

import asyncio
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from ..drafters.spec import SUFFIX, DraftSpec, load_draft_model, make_drafter
from ..drafters.suffix import SuffixCache
from ..gamma import AdaptiveGamma, as_policy
from ..options import check_queue_size
from ..stats import Stats
from ..text import generate
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

    def emit(self, kind: str, value) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


class Engine:
    """target: a loaded model; drafts: drafter name -> spec (loaded once, here); gamma: the default
    draft length or "auto"; max_queue: requests that may wait behind the running one."""

    def __init__(self, target, drafts: dict[str, str], default_draft: str, gamma: int | str = "auto",
                 max_gamma: int = 8, max_queue: int = 16, on_finish: Callable[[Job], None] | None = None,
                 **load_options) -> None:
        if default_draft not in drafts:
            raise ValueError(f"the default draft {default_draft!r} is not among the loaded ones: {', '.join(drafts)}")
        check_queue_size("max_queue", max_queue)
        self.target = target
        self.default_draft = default_draft
        self.gamma = gamma
        self.max_gamma = max_gamma
        self.max_queue = max_queue
        self.on_finish = on_finish
        self._factories = {}
        for name, spec in drafts.items():  # draft models load now, once; drafters are made per request
            spec = DraftSpec(spec)
            model = cache = None
            if spec.model_path is not None:
                model = load_draft_model(spec.model_path, target, **load_options)
            if spec.spec == SUFFIX:  # one memory of earlier outputs, shared by the draft's requests
                cache = SuffixCache()
            self._factories[name] = (lambda spec=spec, model=model, cache=cache:
                                     make_drafter(spec, target, draft_model=model, suffix_cache=cache))
        self._auto = None  # the "auto" policy measured for this target, the template of every request's
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._admitted = 0  # waiting + running
        self._service_seconds = 1.0  # running mean of one generation's run time (not its wait), for Retry-After
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
        """Queue a job, or refuse with 429 when `max_queue` jobs already wait."""
        self.check_draft(job.request.draft)
        with self._lock:
            if self._admitted >= self.max_queue + 1:
                retry = max(1, math.ceil(self._service_seconds * self._admitted))  # until the queue drains
                waiting = self._admitted - 1
                waits = "1 request is waiting" if waiting == 1 else f"{waiting} requests are waiting"
                raise RequestError(429, f"the server is busy: {waits} (at most {self.max_queue}); "
                                        f"retry in about {retry} s",
                                   None, "queue_full", type="rate_limit_error", headers={"Retry-After": str(retry)})
            self._admitted += 1
        self._queue.put(job)

    def close(self) -> None:
        self._queue.put(None)
        self._worker.join(timeout=30)

    def _policy(self, gamma):
        """A request's gamma as a policy: 'auto' measures the target once (then cached on disk)."""
        if gamma != "auto":
            return gamma
        if self._auto is None:
            self._auto = as_policy(gamma, self.target, self.max_gamma)
        return AdaptiveGamma(self._auto.verify_ratios, max_gamma=self.max_gamma)

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            start = time.perf_counter()
            ran = not job.cancelled.is_set()
            try:
                if ran:
                    self._generate(job)
            except Exception as err:  # a failed generation fails its request, never the worker
                job.emit("error", f"generation failed: {type(err).__name__}: {err}")
            finally:
                with self._lock:
                    self._admitted -= 1
                    if ran:
                        self._service_seconds = 0.8 * self._service_seconds + 0.2 * (time.perf_counter() - start)
                if self.on_finish:
                    self.on_finish(job)

    def _generate(self, job: Job) -> None:
        request = job.request
        drafter = self._factories[request.draft or self.default_draft]()
        gamma = self._policy(self.gamma if request.gamma is None else request.gamma)
        stream = generate(self.target, job.prompt_ids, drafter, gamma=gamma, params=request.params,
                          max_new_tokens=request.max_tokens, lenience=request.lenience, seed=request.seed,
                          stop=request.stop, stats=job.stats)
        try:
            for piece in stream:
                if job.first_token_seconds is None:
                    job.first_token_seconds = time.perf_counter() - job.submitted
                job.emit("piece", piece)
                if job.cancelled.is_set():
                    job.stats.finish_reason = "cancelled"
                    break
        finally:
            stream.close()
        job.emit("done", job.stats)
