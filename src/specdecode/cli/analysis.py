"""The measuring commands: `info` (this machine and backend), `analyze` (the paper's formulas),
`alpha` (acceptance measured) and `profile` (step costs and the verification curve)."""

from __future__ import annotations

import argparse
import json

from ..checks import check_positive_settings
from .loading import engine_facts, load_drafter, load_target, sampling_params, use_kernels


def _verify_curve(spec: str | None) -> list[float] | None:
    if spec is None:
        return None
    if spec.endswith(".json"):
        from pathlib import Path

        ratios = json.loads(Path(spec).read_text())["verify_ratios"]
    else:
        try:
            ratios = [0.0] + [float(x) for x in spec.split(",")]
        except ValueError:
            raise ValueError(f"--verify-curve must be comma-separated numbers T(1)/T(1), T(2)/T(1), ...; got {spec!r}") from None
    if len(ratios) < 2 or any(r <= 0 for r in ratios[1:]):
        raise ValueError("--verify-curve needs positive ratios starting at k = 1")
    return ratios


def cmd_info(args: argparse.Namespace) -> int:
    """`specdecode info`: this machine's CPU features and kernel plan, the installed backends, the model's
    backend and why."""
    from importlib.metadata import PackageNotFoundError, version

    from ..models.files import cache_root
    from ..models.load import auto_backend, load_model
    from ..models.native.plan import cpu_flags, cpu_name, kernel_plan, runnable_paths

    use_kernels(args.kernels)
    plan, _ = kernel_plan()
    versions = {}
    for package in ("torch", "transformers", "llama-cpp-python"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = None
    target = load_model(args.target, args.backend, args.dtype, args.device, args.threads, measure_again=args.refresh)
    choice = getattr(target, "backend_choice", None)
    features = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "asimd",
                "asimddp")
    result = dict(cpu=cpu_name(), features=[f for f in features if f in cpu_flags()],
                  kernel_paths=runnable_paths(), kernel_plan=dict(path=plan.path, isa=plan.isa, reason=plan.reason,
                                                                   library=plan.library),
                  versions=versions, model=target.name, backend=getattr(target, "backend", "hf"),
                  backend_reason=choice.reason if choice else (
                      auto_backend(args.target, args.device)[1] if args.backend == "auto" else f"--backend {args.backend}"),
                  measured={name: dict(step_ms=choice.step_ms[name], verify_8=choice.verify_8[name],
                                       predicted_tokens_per_second=choice.rates[name]) for name in choice.rates}
                  if choice else {}, cache=str(cache_root()))
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"CPU: {result['cpu']} ({', '.join(result['features']) or 'no vector extensions listed'})")
    print(f"kernel paths this CPU runs: {', '.join(result['kernel_paths'])}")
    print(f"kernel plan: {plan}")
    print("installed: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v))
    print(f"model: {result['model']} on {result['backend']} ({result['backend_reason']})")
    for name, m in result["measured"].items():
        print(f"  {name}: T(1) {m['step_ms']:.2f} ms, T(8)/T(1) {m['verify_8']:.2f}, "
              f"{m['predicted_tokens_per_second']:.0f} predicted tokens/s")
    if hasattr(target, "kernel_plan"):
        print(f"  native kernels: {target.kernel_plan}")
    print(f"cache: {result['cache']}")
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    """`specdecode analyze`: the paper's expected tokens, speedup and operations for given alpha and c."""
    from rich.console import Console
    from rich.table import Table

    from ..formulas import expected_tokens, hardware_speedup, operations_increase, optimal_gamma, speedup

    alpha, cost_ratio = args.alpha, args.cost_ratio
    ops_ratio = cost_ratio if args.ops_ratio is None else args.ops_ratio
    if not (0.0 <= alpha <= 1.0):
        raise ValueError(f"--alpha must be in [0, 1], got {alpha}")
    if not (cost_ratio >= 0 and ops_ratio >= 0):
        raise ValueError(f"--cost-ratio and --ops-ratio must be >= 0, got {cost_ratio} and {ops_ratio}")
    if any(g < 0 for g in args.gamma):
        raise ValueError(f"--gamma values must be >= 0, got {args.gamma}")
    check_positive_settings(args, "max_gamma")
    curve = _verify_curve(args.verify_curve)
    rows = []
    for g in args.gamma:
        row = dict(gamma=g, expected_tokens=expected_tokens(alpha, g), speedup=speedup(alpha, g, cost_ratio),
                   operations_increase=operations_increase(alpha, g, ops_ratio))
        if curve:
            row["speedup_hw"] = hardware_speedup(alpha, g, cost_ratio, curve)
        rows.append(row)
    best_gamma, best_speedup = optimal_gamma(alpha, cost_ratio, args.max_gamma)
    result = dict(alpha=alpha, cost_ratio=cost_ratio, ops_ratio=ops_ratio, rows=rows,
                  optimal_gamma=best_gamma, optimal_speedup=best_speedup)
    if curve:
        result["optimal_gamma_hw"], result["optimal_speedup_hw"] = optimal_gamma(alpha, cost_ratio, args.max_gamma, curve)
    if args.plot:
        from ..analysis.plots import plot_analysis

        result["plot"] = str(plot_analysis(args.plot, cost_ratio=cost_ratio if cost_ratio > 0 else 0.05, alpha=alpha))
    if args.json:
        print(json.dumps(result))
        return 0
    table = Table(title=f"alpha = {alpha}, c = {cost_ratio}, c_hat = {ops_ratio}")
    for column in ["gamma", "expected tokens/iteration", "speedup", "ops increase"] + (["speedup with T(k)"] if curve else []):
        table.add_column(column, justify="right")
    for row in rows:
        cells = [str(row["gamma"]), f"{row['expected_tokens']:.2f}", f"{row['speedup']:.2f}x",
                 f"{row['operations_increase']:.2f}x"]
        table.add_row(*cells + ([f"{row['speedup_hw']:.2f}x"] if curve else []))
    console = Console(highlight=False)
    console.print(table)
    console.print(f"optimal gamma: {best_gamma} (speedup {best_speedup:.2f}x)")
    if curve:
        console.print(f"optimal gamma with the verification curve: {result['optimal_gamma_hw']} "
                      f"(speedup {result['optimal_speedup_hw']:.2f}x)")
    if args.plot:
        console.print(f"figures written to {result['plot']}")
    return 0


def _load_prompt_ids(args: argparse.Namespace, tokenizer):
    from ..bench.prompts import load_prompts
    from ..prompts import encode_prompt

    prompts = load_prompts(args.prompts, args.categories, args.per_category)
    return prompts, [encode_prompt(tokenizer, p.text) for p in prompts]


def cmd_alpha(args: argparse.Namespace) -> int:
    """`specdecode alpha`: alpha measured on the tokens the target generates for a prompt set."""
    from ..analysis.measure import measure_alpha

    params = sampling_params(args)
    check_positive_settings(args, "max_new_tokens")
    use_kernels(args.kernels)
    target = load_target(args)
    drafter = load_drafter(args, target)
    prompts, ids = _load_prompt_ids(args, target.tokenizer)
    estimate = measure_alpha(target, drafter, ids, params, args.max_new_tokens, args.seed)
    result = dict(draft=args.draft, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                  alpha=estimate.alpha, stderr=estimate.stderr, positions=estimate.positions,
                  prompts=estimate.prompts)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"alpha = {estimate.alpha:.3f} +- {estimate.stderr:.3f} (standard error; {estimate.positions} "
              f"positions over {estimate.prompts} prompts; draft {args.draft}, temperature {params.temperature:g})")
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    """`specdecode profile`: the target's step time and verification curve, the draft's step, their ratio c."""
    from ..analysis.measure import drafter_step_seconds, profile_model

    check_positive_settings(args, "max_k", "context", "repeats")
    use_kernels(args.kernels)
    target = load_target(args)
    drafter = load_drafter(args, target)
    profile = profile_model(target, args.max_k, args.context, args.repeats, use_cache=not args.refresh)
    context = list(range(100, 100 + args.context))
    draft_seconds = drafter_step_seconds(drafter, context, repeats=args.repeats * 2)
    result = dict(target=profile.model, dtype=profile.dtype, threads=profile.threads, draft=args.draft,
                  **engine_facts(target, args.backend),
                  target_step_seconds=profile.step_seconds, draft_step_seconds=draft_seconds,
                  cost_ratio=draft_seconds / profile.step_seconds, verify_ratios=profile.verify_ratios)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"target step T(1) = {profile.step_seconds * 1e3:.2f} ms ({profile.model}, {profile.dtype}, "
          f"{profile.threads} threads, {profile.context} cached positions)")
    print(f"draft step ({args.draft}) = {draft_seconds * 1e3:.3f} ms  ->  cost ratio c = {result['cost_ratio']:.4f}")
    print("verification curve T(k)/T(1): " + ", ".join(
        f"{k}: {r:.2f}" for k, r in enumerate(profile.verify_ratios) if k))
    print(f"backend: {result['backend']} ({result['backend_reason']})"
          + (f"; kernels: {result['kernels']}" if "kernels" in result else ""))
    return 0
