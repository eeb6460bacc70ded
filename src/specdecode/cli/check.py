"""`specdecode check --draft SPEC`: the losslessness checks the test suite runs, on any drafter.

1. Whole-sequence chi-square tests on the toy target (`lossless`), at temperature 1, top-k 2 and
   top-p 0.8: the drafter's own code (a toy model in place of its draft model) through the real
   decode loop, against the target's exactly enumerated distribution over every sequence.
2. The control: the same drafter under a verifier that accepts every draft token, which must fail.
   Where it does not, the check has no power over this drafter and the verdict says so.
3. Greedy identity: greedy speculative output equal to plain greedy decoding, on the target
   (--target, default the embedded model; `toy` for the toy target) over a prompt set.

Exit code 0 when the drafter is shown lossless, 1 when a check fails or the control cannot fail.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..progress import waiting
from .loading import draft_spec, load_target, use_kernels


def _prompts(args: argparse.Namespace, target) -> list[list[int]]:
    from ..bench.prompts import load_prompts
    from ..distill.prompts import seed_prompts
    from ..prompts import encode_prompt

    if args.prompts:
        texts = [p.text for p in load_prompts(args.prompts, args.categories, args.per_category)]
    else:
        texts = [prompt for _, prompt in seed_prompts(args.num_prompts, seed=args.seed)]
    return [encode_prompt(target.tokenizer, text) for text in texts[: args.num_prompts]]


def run_checks(args: argparse.Namespace) -> list:
    from ..drafters.spec import NGRAM, load_draft_model, make_drafter
    from ..lossless import greedy_identity, stand_in, statistical_checks, toy_world

    spec = draft_spec(args)
    user_spec = spec.spec if spec.is_user else None
    if args.target == "toy":
        if spec.model_path is not None or spec.spec.startswith(NGRAM):
            raise ValueError(f"--target toy runs drafters that need no model or file; --draft {spec.spec} needs "
                             "a real target (leave --target out for the embedded model)")
        make = lambda w: make_drafter(spec, w.target)  # noqa: E731  (lookup, suffix or a user's: any vocabulary)
        world = toy_world()
        toy_prompts = [[0], [1, 2], [2, 2, 1], [0, 1, 0, 1], [1, 1], [2, 0, 2], [0, 0, 1, 2]]
        greedy = greedy_identity(world.target, lambda: make(world), toy_prompts[: args.num_prompts], args.gamma,
                                 args.max_new_tokens)
    else:
        use_kernels(args.kernels)
        target = load_target(args)
        draft_model = None if spec.model_path is None else load_draft_model(
            spec.model_path, target, spec.backend or args.backend, args.dtype, args.device, args.threads)
        fresh = lambda: make_drafter(spec, target, draft_model=draft_model)  # noqa: E731
        drafter = fresh()
        greedy = greedy_identity(target, fresh, _prompts(args, target), args.gamma, args.max_new_tokens)
        make = lambda w: stand_in(drafter, w, user_spec)  # noqa: E731
    return statistical_checks(make, gamma=args.gamma, samples=args.samples, seed=args.seed) + [greedy]


def verdict(results) -> tuple[str, bool]:
    failed = [r for r in results if not r.passed]
    if not failed:
        return "lossless: every check passed, and the broken verifier was caught", True
    if all(r.name.startswith("control") for r in failed):
        return "inconclusive: the checks passed but could not catch a broken verifier on this drafter", False
    return "NOT lossless: " + "; ".join(r.name for r in failed if not r.name.startswith("control")), False


def check_against(args: argparse.Namespace) -> int:
    """--against llama.cpp: the native path's numerics and tokenisation against llama.cpp's on --target;
    a quantised file past the thresholds is measured from both engines on its dequantised copy
    (`analysis.oracle.Reference`), or always with --reference."""
    from ..analysis.oracle import compare, is_quantised, reference, report, report_reference
    from ..models.default import default_target_path
    from ..models.load import load_model

    path = args.target or str(default_target_path())
    if not path.endswith(".gguf"):
        raise ValueError(f"--against llama.cpp compares on a .gguf file, and {path!r} is not one")
    use_kernels(args.kernels)
    ours = load_model(path, backend="native", dtype=args.dtype, threads=args.threads, n_ctx=512)
    oracle = load_model(path, backend="llama.cpp", threads=args.threads, n_ctx=512)
    result = compare(ours, oracle)
    ref, agrees = None, result.agrees
    if (args.reference or not result.agrees) and result.texts_agree and is_quantised(path):
        with waiting("writing the file dequantised to F16 and running both engines on it"):
            ref = reference(ours, oracle, lambda copy, backend: load_model(
                str(copy), backend=backend, dtype="float32" if backend == "native" else "auto", threads=args.threads,
                n_ctx=512), path)
        agrees = ref.agrees
    if args.json:
        extra = {} if ref is None else {"reference": {**vars(ref.exact), "ours_from_exact": ref.ours_from_exact,
                                                      "theirs_from_exact": ref.theirs_from_exact}}
        print(json.dumps({"target": path, "kernels": ours.kernel_plan, **vars(result), **extra, "agrees": agrees}))
    else:
        lines = report(result, f"{path} ({ours.kernel_plan})") + ([] if ref is None else report_reference(ref))
        print("\n".join(lines + [f"verdict: {'agrees' if agrees else 'DISAGREES'}"]))
    return 0 if agrees else 1


def cmd_check(args: argparse.Namespace) -> int:
    from ..checks import check_positive_settings

    if args.against:
        return check_against(args)

    check_positive_settings(args, "samples", "gamma", "max_new_tokens", "num_prompts")
    results = run_checks(args)
    text, ok = verdict(results)
    if args.json:
        print(json.dumps({"draft": args.draft, "checks": [vars(r) for r in results], "verdict": text, "lossless": ok},
                         indent=2))
        return 0 if ok else 1
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"specdecode check --draft {args.draft}")
    for column in ("check", "statistic", "result", "note"):
        table.add_column(column)
    for r in results:
        table.add_row(r.name, r.statistic, "pass" if r.passed else "FAIL", r.note)
    console = Console(file=sys.stdout, width=140)
    console.print(table)
    console.print(f"verdict: {text}")
    return 0 if ok else 1
