"""What the commands share: the target and drafters loaded from their options, the sampling
settings, and what ran the target. Loading changes neither the arguments nor the environment: the
backend asked for stays `args.backend`, the one `auto` chose is the target's (`backend_of`)."""

from __future__ import annotations

import argparse
import os


def use_kernels(path: str | None) -> None:
    """--kernels: this process's native kernel path. The native backend reads it from
    $SPECDECODE_KERNELS when it builds its kernels, for every model the process loads (a draft model
    runs the target's kernels), so a command sets it once, before loading anything; None leaves it."""
    if path:
        from ..models.native.plan import ENV

        os.environ[ENV] = path


def load_target(args: argparse.Namespace):
    """The target of --target, on --backend (auto: chosen here), --dtype, --device, --threads."""
    from ..models.load import load_model

    return load_model(args.target, args.backend, args.dtype, args.device, args.threads, n_ctx=args.ctx_size)


def backend_of(target) -> str:
    """The backend the target runs on: what `auto` chose, or the one asked for."""
    return getattr(target, "backend", "hf")


def engine_facts(target, requested_backend: str) -> dict:
    """What ran the target and why: the backend (with the measurement behind an `auto` choice) and,
    on the native backend, its kernel plan."""
    choice = getattr(target, "backend_choice", None)
    facts = dict(backend=backend_of(target),
                 backend_reason=choice.reason if choice else f"--backend {requested_backend}")
    if hasattr(target, "kernel_plan"):
        facts["kernels"] = target.kernel_plan
    return facts


def draft_spec(args: argparse.Namespace):
    """--draft, --draft-backend and --min-draft-confidence, checked."""
    from ..drafters.spec import DraftSpec

    return DraftSpec(args.draft, args.draft_backend, args.min_draft_confidence)


def load_drafter(args: argparse.Namespace, target):
    """The drafter of --draft (None with --baseline). A draft model loads on --draft-backend, else on
    the backend asked for (auto: its own best), not the one auto chose for the target."""
    from ..drafters.spec import make_drafter

    if getattr(args, "baseline", False):
        return None
    return make_drafter(draft_spec(args), target, backend=args.backend, dtype=args.dtype, device=args.device,
                        threads=args.threads)


def sampling_params(args: argparse.Namespace):
    from .. import defaults
    from ..sampling import SamplingParams

    llama = args.repeat_penalty is not None  # llama.cpp's name: its window by default
    window = args.repeat_last_n if args.repeat_last_n is not None else defaults.REPEAT_LAST_N if llama else -1
    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
                          repetition_penalty=args.repeat_penalty if llama else args.repetition_penalty,
                          repeat_last_n=window, logit_bias=dict(args.logit_bias))


def gamma_policy(gamma, max_gamma: int, target):
    """--gamma (a number or 'auto', bounded by --max-gamma) as the decode loop's policy."""
    from ..gamma import as_policy

    return as_policy(gamma, target, max_gamma)
