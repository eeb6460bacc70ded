"""What `specdecode serve` serves, from typed options: the target, one engine with its drafts, the app.

The command line turns its arguments into a `ServeOptions` once and calls `build_app` in its own
process; `specdecode serve --ray` hands the same options to every replica of a Ray Serve
application (`server/ray.py`), which calls `build_app` there. Nothing here reads the command line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from fastapi import FastAPI

from .. import defaults
from ..drafters.spec import LOOKUP, DraftSpec
from ..checks import check_gamma, check_positive_settings, check_queue_size
from .app import create_app
from .engine import Engine
from .request import Limits

API_KEY_ENV = "SPECDECODE_API_KEY"


def api_key_from_environment(given: str | None) -> str | None:
    """The key given (--api-key), else $SPECDECODE_API_KEY (which keeps it out of process listings)."""
    return given if given is not None else os.environ.get(API_KEY_ENV) or None


@dataclass(frozen=True)
class ServeOptions:
    """Every setting `specdecode serve` builds and serves with; checked when made, each ValueError
    naming the option at fault as the command line spells it. The drafts are checked by `drafts()`."""

    target: str | None = None  # a .gguf file or a transformers directory; None: the embedded default
    backend: str = "auto"  # the target's; the drafts' too unless draft_backend (auto: each its own best)
    dtype: str = "auto"
    device: str | None = None
    threads: int | None = None
    ctx_size: int = defaults.CONTEXT  # positions the target's cache holds (its own window where smaller)
    # The native backend's kernel path. The backend reads it from $SPECDECODE_KERNELS, for the whole
    # process: the process's entry point sets it (the command line, each Ray replica), not build_app.
    kernels: str | None = None
    draft: str = defaults.DRAFT  # the drafter a request gets unless it names another
    also_drafts: tuple[str, ...] = ()  # the others a request may pick with specdecode.draft
    draft_backend: str | None = None
    gamma: int | str = "auto"
    max_gamma: int = defaults.MAX_GAMMA
    model_names: tuple[str, ...] = ()  # the id responses carry, then aliases; empty: the target's file name
    max_batch: int = defaults.MAX_BATCH
    prompt_rows: int = defaults.PROMPT_ROWS  # prompt tokens a step feeds beside decode rows (Batch's prompt_rows)
    prefix_memory: int = defaults.PREFIX_MIB  # MiB of recent prompts' keys and values kept for reuse (Batch's prefix_bytes)
    max_queue: int = defaults.MAX_QUEUE
    max_tokens: int | None = None  # a cap on max_tokens; None: the room the prompt leaves in the context
    api_key: str | None = None  # None: every route is open (see api_key_from_environment)
    metrics_open: bool = False
    max_body_bytes: int = defaults.MAX_BODY_BYTES
    host: str = defaults.HOST  # where the HTTP server listens (uvicorn, or Ray Serve's proxy)
    port: int = defaults.PORT

    def __post_init__(self) -> None:
        if self.gamma != "auto":
            check_gamma(self.gamma, "--gamma")
        check_positive_settings(self, "ctx_size", "max_gamma", "max_tokens", "max_body_bytes", "max_batch", "prompt_rows")
        if not isinstance(self.prefix_memory, int) or self.prefix_memory < 0:
            raise ValueError(f"--prefix-memory must be a whole number of MiB >= 0, got {self.prefix_memory!r}")
        check_queue_size("--max-queue", self.max_queue)
        if not 0 < self.port < 65536:
            raise ValueError(f"--port must be in 1..65535, got {self.port}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("--api-key must not be empty")
        if any(not name.strip() for name in self.model_names):
            raise ValueError("--model-name must not be empty")

    def drafts(self) -> dict[str, str]:
        """The drafters requests may pick (spec -> spec), the default first; each spec checked. Prompt
        lookup is always among them: it holds nothing, and clients name it."""
        drafts = {spec: spec for spec in [self.draft, *self.also_drafts, LOOKUP]}
        for spec in drafts:
            DraftSpec(spec)
        return drafts


class Served(NamedTuple):
    app: FastAPI
    engine: Engine  # close() it when done serving
    names: list[str]  # the model id responses carry, then its aliases


def load_target(options: ServeOptions):
    """The target model the options name, loaded in this process."""
    from ..models.load import load_model

    return load_model(options.target, options.backend, options.dtype, options.device, options.threads,
                      n_ctx=options.ctx_size)


def build_app(options: ServeOptions, target=None) -> Served:
    """The app `specdecode serve` runs: `target` (default: loaded from the options), one engine
    decoding for every request with the options' drafts, and create_app's routes in front of it."""
    drafts = options.drafts()
    if target is None:
        target = load_target(options)
    # a draft model loads on the backend asked for (auto: its own best), not the one auto chose for the target
    engine = Engine(target, drafts, options.draft, gamma=options.gamma, max_gamma=options.max_gamma,
                    max_queue=options.max_queue, max_batch=options.max_batch, prompt_rows=options.prompt_rows,
                    prefix_bytes=options.prefix_memory << 20,
                    backend=options.draft_backend or options.backend, dtype=options.dtype, device=options.device,
                    threads=options.threads)
    name, *aliases = options.model_names or [Path(target.name).name.removesuffix(".gguf")]
    limits = Limits(max_tokens=options.max_tokens, default_max_tokens=min(256, options.max_tokens or 256),
                    max_prompts=options.max_batch,
                    max_gamma=max(16, options.max_gamma))
    app = create_app(engine, name, limits, options.max_body_bytes, aliases=aliases, api_key=options.api_key,
                     metrics_open=options.metrics_open)
    return Served(app, engine, [name, *aliases])
