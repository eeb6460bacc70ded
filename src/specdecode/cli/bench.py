"""`specdecode bench`: drafters against the autoregressive baseline over a prompt set."""

from __future__ import annotations

import argparse
import sys

from ..checks import check_positive_settings
from .loading import backend_of, engine_facts, gamma_policy, load_target, use_kernels


def cmd_bench(args: argparse.Namespace) -> int:
    """`specdecode bench`: every drafter asked for, and the anchors, against plain decoding over a prompt set;
    results.md, results.json and figures in --out."""
    import platform
    from pathlib import Path

    import torch
    from rich.progress import Progress

    from ..bench.prompts import load_prompts
    from ..bench.report import aggregate
    from ..bench.runner import run_benchmark
    from ..bench.suite import plan_suite, write_results
    from ..drafters.spec import DraftSpec, load_draft_model
    from ..models.load import load_model
    from ..models.native.plan import cpu_name
    from ..models.profile import profile_model
    from ..sampling import SamplingParams

    for t in args.temperatures:
        SamplingParams(temperature=t)
    if any(g != "auto" and g < 1 for g in args.gamma):
        raise ValueError(f"--gamma values must be >= 1 or 'auto', got {args.gamma}")
    check_positive_settings(args, "max_gamma", "max_new_tokens")
    # --draft takes the drafter specs `generate` takes; suffix, eagle[:DIR] and ngram:FILE join the suite
    # as --suffix, --eagle and --ngram do, the rest is the draft model
    models = []
    for spec in args.draft:
        if spec == "suffix":
            args.suffix = True
        elif spec == "eagle" or spec.startswith("eagle:"):
            args.eagle = spec.partition(":")[2]
        elif spec.startswith("ngram:"):
            args.ngram = spec.partition(":")[2]
        elif spec != "lookup":  # prompt lookup is always in the suite
            models.append(spec)
    args.draft = models
    if len(args.draft) > 1:
        raise ValueError(f"bench takes at most one draft model, got {', '.join(args.draft)}")
    if args.anchor_lookup_tokens < 0:
        raise ValueError(f"--anchor-lookup-tokens must be >= 0, got {args.anchor_lookup_tokens}")
    prompts = load_prompts(args.prompts, args.categories, args.per_category)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    use_kernels(args.kernels)
    target = load_target(args)
    backend = backend_of(target)
    # the draft model on the backend asked for (auto: its own best), not the one auto chose for the target
    draft = load_draft_model(DraftSpec(args.draft[0]).model_path, target, args.draft_backend or args.backend,
                             args.dtype, args.device,
                             args.threads) if args.draft else None
    hf_dtype = "float32" if args.dtype == "float32" else "bfloat16"  # transformers has no 4-bit path here
    suite = plan_suite(target, backend, args.gamma, draft, args.draft[0] if args.draft else None, args.ngram,
                       suffix=args.suffix, eagle=args.eagle, anchors=not args.no_anchors,
                       anchor_lookup_tokens=args.anchor_lookup_tokens,
                       load_anchor=lambda name: load_model(args.target or None, name,
                                                           hf_dtype if name == "hf" else args.dtype, args.device,
                                                           args.threads))
    total = len(prompts) * len(args.temperatures) * len(suite.methods)
    with Progress(transient=False) as progress:
        task = progress.add_task("profiling target", total=total)
        profile = profile_model(target)
        progress.update(task, description="benchmarking")
        runs = run_benchmark(target, prompts, suite, args.temperatures, args.max_new_tokens, args.seed,
                             on_run=lambda run: progress.advance(task),
                             gamma_policy=lambda g: gamma_policy(g, args.max_gamma, target))
    meta = dict(command="specdecode " + " ".join(sys.argv[1:]), machine=platform.platform(),
                processor=cpu_name(), threads=torch.get_num_threads(),
                torch=torch.__version__, target=target.name, **engine_facts(target, args.backend),
                dtype="gguf" if backend == "llama.cpp" else str(getattr(target, "dtype", args.dtype)),
                max_new_tokens=args.max_new_tokens, prompts=len(prompts),
                target_step_seconds=profile.step_seconds, verify_ratios=profile.verify_ratios)
    header = (f"Command: `{meta['command']}`\n\nMachine: {meta['processor']}, {meta['machine']}, {meta['threads']} "
              f"torch threads, torch {meta['torch']}; target {meta['target']} ({backend}, {meta['dtype']}"
              + (f"; kernels {meta['kernels']}" if "kernels" in meta else "") + f"), T(1) = "
              f"{profile.step_seconds * 1e3:.1f} ms, T(8)/T(1) = {profile.ratio(8):.2f}; {len(prompts)} prompts, "
              f"max_new_tokens {args.max_new_tokens}\n\n")
    print(write_results(out, runs, aggregate(runs, profile), meta, header))
    print(f"written: {out}/results.md, results.json, speedup.png, timeline.png")
    return 0
