"""The command line: `specdecode generate | info | analyze | alpha | profile | bench | serve | ngram fit |
distill`."""

from __future__ import annotations

import argparse
import json
import os
import sys

from .drafters.spec import LOOKUP

KERNEL_PATHS = ("avx512", "avx2", "neon", "portable", "torch")  # models/native/plan.py's PATHS (that imports torch)


def _gamma_arg(value: str):
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {value!r}") from None


def _gamma_policy(gamma, max_gamma: int, target):
    from .gamma import as_policy

    return as_policy(gamma, target, max_gamma)


def _model_options(with_draft: bool = True) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--target", help="target model: a .gguf file or a transformers directory "
                        "(default: the embedded SmolLM2-135M-Instruct)")
    if with_draft:
        common.add_argument("--draft", default=LOOKUP,
                            help="'lookup' for prompt lookup (default), 'suffix' for suffix drafting (the most "
                                 "frequent continuation of the longest earlier match), 'trained' for the draft "
                                 "network shipped for the embedded target, a draft model path, lookup+MODEL (copy "
                                 "where the text repeats, MODEL elsewhere, e.g. lookup+trained), or ngram:FILE.npz")
    common.add_argument("--backend", default="auto", choices=["auto", "hf", "llama.cpp", "native"],
                        help="native: specdecode's own PyTorch Llama (static KV cache, 4-bit or bf16 products, "
                             "C kernels); hf: transformers; llama.cpp: llama-cpp-python on a .gguf file; auto "
                             "(default): native for a Llama-family model on the CPU, else hf")
    if with_draft:
        common.add_argument("--draft-backend", default=None, choices=["auto", "hf", "llama.cpp", "native"],
                            help="backend of the draft model (default: the target's)")
        common.add_argument("--min-draft-confidence", type=float, default=0.0,
                            help="a draft model stops proposing when its top probability falls below this "
                                 "(default 0: always propose gamma tokens)")
    common.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's setting)")
    common.add_argument("--kernels", default=None, choices=["auto", *KERNEL_PATHS],
                        help="the native backend's kernel path (default: $SPECDECODE_KERNELS, else the best this "
                             "CPU runs; `specdecode info` shows the plan)")
    common.add_argument("--dtype", default="auto",
                        help="auto (default: on the native backend 4-bit products where the weights are 4-bit "
                             "groups, as a Q4_1 GGUF's are, with 8-bit activations (w4a8) where the CPU has vector "
                             "integer dot products, else bfloat16), int4 or w4a8 (native only), bfloat16 or float32")
    common.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    return common


def _sampling_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = all)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = all)")


def _prompt_options(parser: argparse.ArgumentParser, required: bool) -> None:
    parser.add_argument("--prompts", required=required, default=None,
                        help="prompt file: Spec-Bench jsonl (first turn), jsonl with 'prompt', or text lines")
    parser.add_argument("--categories", nargs="+", default=None, help="categories or Spec-Bench tasks to keep")
    parser.add_argument("--per-category", type=int, default=None, help="at most this many prompts per category")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdecode", description="Lossless speculative decoding.")
    commands = parser.add_subparsers(dest="command", required=True)

    gen = commands.add_parser("generate", parents=[_model_options()], help="generate text, speculatively by default")
    gen.add_argument("prompt", help="the user message (the target's chat template is applied unless --raw)")
    gen.add_argument("--gamma", type=_gamma_arg, default="auto",
                     help="draft tokens per target call, or 'auto' (default): chosen per call from the measured "
                          "verification cost and the running acceptance rate, 0 where speculation would not pay")
    gen.add_argument("--max-gamma", type=int, default=8, help="upper bound for --gamma auto (default 8)")
    _sampling_options(gen)
    gen.add_argument("--lenience", type=float, default=1.0,
                     help="lenient acceptance in (0, 1]; 1 = exact (the target's distribution)")
    gen.add_argument("--seed", type=int, default=None, help="make sampling reproducible")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--baseline", action="store_true", help="plain autoregressive decoding, no draft")
    gen.add_argument("--raw", action="store_true", help="do not apply the chat template")
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    gen.add_argument("--no-color", action="store_true", help="plain text, no Figure-1 colours")
    gen.add_argument("--compare", action="store_true",
                     help="then decode the same prompt plainly (no draft) and print the speedup measured in this run")

    info = commands.add_parser("info", parents=[_model_options(with_draft=False)],
                               help="this machine: CPU features, kernel plan, backends and their measured speed")
    info.add_argument("--refresh", action="store_true", help="measure the backends again")
    info.add_argument("--json", action="store_true")

    ana = commands.add_parser("analyze", help="the paper's formulas for given alpha and cost ratio c")
    ana.add_argument("--alpha", type=float, required=True, help="expected acceptance rate, in [0, 1]")
    ana.add_argument("--cost-ratio", type=float, default=0.0,
                     help="cost ratio c = draft step / target step (default 0)")
    ana.add_argument("--ops-ratio", type=float, default=None,
                     help="c_hat, the same ratio in arithmetic operations (default: --cost-ratio)")
    ana.add_argument("--gamma", type=int, nargs="+", default=[1, 2, 3, 4, 5, 7, 10], help="gammas to tabulate")
    ana.add_argument("--max-gamma", type=int, default=64, help="search bound for the optimal gamma")
    ana.add_argument("--verify-curve", default=None,
                     help="T(k)/T(1) for k=1.. as comma-separated numbers, or a profile JSON from `specdecode profile`")
    ana.add_argument("--plot", default=None, help="write the paper's figures to this PNG")
    ana.add_argument("--json", action="store_true")

    alpha = commands.add_parser("alpha", parents=[_model_options()],
                                help="measure alpha = E[sum min(p, q)] on tokens the target generates")
    _prompt_options(alpha, required=True)
    _sampling_options(alpha)
    alpha.add_argument("--max-new-tokens", type=int, default=64)
    alpha.add_argument("--seed", type=int, default=0)
    alpha.add_argument("--json", action="store_true")

    prof = commands.add_parser("profile", parents=[_model_options()],
                               help="cost ratio c and the verification curve T(k)/T(1)")
    prof.add_argument("--max-k", type=int, default=16)
    prof.add_argument("--context", type=int, default=256, help="cached positions before timing")
    prof.add_argument("--repeats", type=int, default=7)
    prof.add_argument("--refresh", action="store_true", help="measure again instead of using the cached profile")
    prof.add_argument("--json", action="store_true")

    bench = commands.add_parser("bench", parents=[_model_options(with_draft=False)],
                                help="benchmark drafters against the autoregressive baseline over a prompt set")
    _prompt_options(bench, required=True)
    bench.add_argument("--draft", action="append", default=[], help="a draft model path (or 'trained') to include")
    bench.add_argument("--ngram", default=None, help="an n-gram drafter file (.npz from `ngram fit`) to include")
    bench.add_argument("--suffix", action="store_true",
                       help="include suffix drafting (each run on its own: no memory of earlier prompts' outputs)")
    bench.add_argument("--gamma", type=_gamma_arg, nargs="+", default=[2, 4, 8, "auto"],
                       help="fixed gammas and/or 'auto' (default: 2 4 8 auto)")
    bench.add_argument("--max-gamma", type=int, default=8, help="upper bound for 'auto' (default 8)")
    bench.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    bench.add_argument("--max-new-tokens", type=int, default=128)
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--no-anchors", action="store_true",
                       help="leave out the backend's own generate() (plain and prompt lookup) as anchors")
    bench.add_argument("--anchor-lookup-tokens", type=int, default=10,
                       help="tokens the anchors' own prompt lookup proposes (default 10; 0 leaves those anchors out)")
    bench.add_argument("--out", default="benchmarks/results/latest", help="output directory")
    serve = commands.add_parser("serve", parents=[_model_options()],
                                help="an OpenAI-compatible HTTP server with speculative decoding")
    serve.add_argument("--also-draft", action="append", default=[], metavar="SPEC",
                       help="another drafter requests may pick with specdecode.draft (repeatable; --draft is the default)")
    serve.add_argument("--gamma", type=_gamma_arg, default="auto",
                       help="default draft length, or 'auto' (default: chosen per call from the measured cost)")
    serve.add_argument("--max-gamma", type=int, default=8, help="upper bound for 'auto' (default 8)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--model-name", action="append", default=None, metavar="NAME",
                       help="the model id clients send (default: the target's file name); repeat for aliases, "
                            "the first is the one responses carry")
    serve.add_argument("--max-batch", type=int, default=16,
                       help="requests decoded together, each with its own KV cache sized to its prompt + max_tokens "
                            "(default 16; 1 serves one at a time)")
    serve.add_argument("--max-queue", type=int, default=16,
                       help="requests that may wait behind a full batch (default 16); past them, 429")
    serve.add_argument("--max-tokens", type=int, default=1024,
                       help="largest max_tokens a request may ask for (default 1024); a request without max_tokens "
                            "gets min(256, this), capped at the room its prompt leaves in the context window")
    serve.add_argument("--api-key", default=None, metavar="KEY",
                       help="require 'Authorization: Bearer KEY' on every route but /health (default: the "
                            "SPECDECODE_API_KEY environment variable, which keeps the key out of process listings)")
    serve.add_argument("--metrics-open", action="store_true", help="serve /metrics without the API key")
    serve.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body (default 1 MiB)")
    on_ray = serve.add_argument_group("on a Ray Serve cluster (pip install 'specdecode[ray]')")
    on_ray.add_argument("--ray", action="store_true",
                        help="serve with Ray Serve: --replicas engines behind one endpoint at --host:--port; "
                             "--threads is per replica (default 1), and each replica reserves that many CPUs")
    on_ray.add_argument("--replicas", type=int, default=None,
                        help="replicas, each one engine (default 1; with autoscaling, how many start)")
    on_ray.add_argument("--min-replicas", type=int, default=None, help="autoscale down to this many (default 1)")
    on_ray.add_argument("--max-replicas", type=int, default=None,
                        help="autoscale up to this many (default: --replicas, at least --min-replicas)")
    on_ray.add_argument("--address", default=None,
                        help="the Ray cluster to join: auto or HEAD:6379 (default: start one on this machine)")

    ngram = commands.add_parser("ngram", help="n-gram drafters")
    ngram_commands = ngram.add_subparsers(dest="ngram_command", required=True)
    fit = ngram_commands.add_parser("fit", parents=[_model_options(with_draft=False)],
                                    help="count k-grams of a corpus tokenized with the target's tokenizer")
    fit.add_argument("--corpus", required=True, help="text file (one document a line), jsonl ('text', 'prompt', 'turns'), or a "
                          "distillation corpus .npz from `distill` (its answers are used)")
    fit.add_argument("--order", type=int, default=2, help="1 = unigram, 2 = bigram (default), k = k-gram")
    fit.add_argument("--out", required=True, help="output .npz file")

    dist = commands.add_parser("distill", parents=[_model_options(with_draft=False)],
                               help="train a small draft model for the target on its own generations")
    dist.add_argument("--out", required=True, help="output directory of the trained draft")
    dist.add_argument("--corpus", default=None,
                      help="corpus file: reused when it exists, else generated and written there "
                           "(default: OUT.corpus.npz)")
    dist.add_argument("--data-minutes", type=float, default=50.0, help="time for generating the corpus (default 50)")
    dist.add_argument("--train-minutes", type=float, default=55.0, help="training time (default 55)")
    dist.add_argument("--data-batches", type=int, default=None,
                      help="stop generating after this many batches, even within --data-minutes")
    dist.add_argument("--train-steps", type=int, default=None,
                      help="stop training after this many steps, even within --train-minutes")
    dist.add_argument("--layers", type=int, default=3)
    dist.add_argument("--dim", type=int, default=256)
    dist.add_argument("--heads", type=int, default=4)
    dist.add_argument("--mlp-dim", type=int, default=768)
    dist.add_argument("--embed-dim", type=int, default=128, help="factorised input embedding size (default 128)")
    dist.add_argument("--kept", type=int, default=12288, help="output vocabulary: the most used tokens (default 12288)")
    dist.add_argument("--window", type=int, default=1024, help="attention window in tokens (default 1024)")
    dist.add_argument("--lr", type=float, default=2e-3)
    dist.add_argument("--batch-tokens", type=int, default=8192, help="tokens per training batch (default 8192)")
    dist.add_argument("--gen-batch", type=int, default=32, help="prompts per generation batch (default 32)")
    dist.add_argument("--answer-tokens", type=int, default=256, help="longest answer generated (default 256)")
    dist.add_argument("--seed", type=int, default=0)
    return parser


def _load_target(args):
    from .models.load import load_model

    if getattr(args, "kernels", None):
        from .models.native.plan import ENV

        os.environ[ENV] = args.kernels
    target = load_model(args.target, args.backend, args.dtype, args.device, args.threads)
    # later steps see the concrete backend; a draft model is loaded with the backend asked for (or its own)
    args.requested_backend, args.backend = args.backend, getattr(target, "backend", "hf")
    return target


def _engine_facts(target, args) -> dict:
    """What ran the target and why: the backend (with the measurement behind an `auto` choice) and,
    on the native backend, its kernel plan."""
    choice = getattr(target, "backend_choice", None)
    facts = dict(backend=args.backend, backend_reason=choice.reason if choice else f"--backend {args.requested_backend}")
    if hasattr(target, "kernel_plan"):
        facts["kernels"] = target.kernel_plan
    return facts


def _draft_backend(args) -> str:
    """A draft model's backend: the one asked for (auto: its own best), not the one auto chose for the target."""
    return getattr(args, "requested_backend", args.backend)


def _load_draft_model(path: str, args, target):
    from .drafters.spec import load_draft_model

    return load_draft_model(path, target, getattr(args, "draft_backend", None) or _draft_backend(args), args.dtype,
                            args.device, args.threads)


def _draft_spec(args):
    from .drafters.spec import DraftSpec

    return DraftSpec(args.draft, args.draft_backend, args.min_draft_confidence)


def _load_drafter(args, target):
    from .drafters.spec import make_drafter

    if getattr(args, "baseline", False):
        return None
    return make_drafter(_draft_spec(args), target, backend=_draft_backend(args), dtype=args.dtype, device=args.device,
                        threads=args.threads)


def _params(args):
    from .sampling import SamplingParams

    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)


def _positive(name: str, value: int) -> None:
    from .options import check_positive

    check_positive(name, value)


def cmd_generate(args) -> int:
    import torch
    from rich.console import Console

    from .options import check_gamma, check_lenience, check_max_new_tokens, check_prompt_text, check_stop
    from .render import format_summary, render_step
    from .stats import Stats
    from .text import encode_prompt, generate

    # Validate everything cheap before loading any model.
    params = _params(args)
    if args.gamma != "auto":
        check_gamma(args.gamma, "--gamma")
    _positive("--max-gamma", args.max_gamma)
    check_lenience(args.lenience, "--lenience")
    check_max_new_tokens(args.max_new_tokens, "--max-new-tokens")
    check_prompt_text(args.prompt)
    check_stop(args.stop)
    _draft_spec(args)

    target = _load_target(args)
    drafter = _load_drafter(args, target)
    prompt_ids = encode_prompt(target.tokenizer, args.prompt, chat=not args.raw)
    gamma = _gamma_policy(args.gamma, args.max_gamma, target) if drafter is not None else 0
    if args.compare and drafter is not None:  # warm up once, so neither timed run pays first-call costs
        target.forward(torch.tensor([prompt_ids]), target.new_cache(), num_logits=1)
    stats = Stats()
    stream = generate(
        target, prompt_ids, drafter, gamma=gamma, params=params, max_new_tokens=args.max_new_tokens,
        lenience=args.lenience, seed=args.seed, stop=args.stop, stats=stats,
    )
    out = Console(no_color=args.no_color, highlight=False, soft_wrap=True)
    color = out.is_terminal and not args.no_color
    text = []
    try:
        for piece in stream:
            text.append(piece.accepted_text + piece.target_text)
            if not args.json:
                out.print(render_step(piece, color), end="")
    except KeyboardInterrupt:
        stats.finish_reason = "interrupted"
    finally:
        stream.close()
    summary = stats.summary()
    comparison = None
    if args.compare and drafter is not None and stats.finish_reason != "interrupted":
        plain = Stats()
        for _ in generate(target, prompt_ids, None, params=params, max_new_tokens=args.max_new_tokens,
                          seed=args.seed, stop=args.stop, stats=plain):
            pass
        comparison = dict(plain_tokens=plain.new_tokens, plain_tokens_per_second=plain.tokens_per_second,
                          speedup=stats.tokens_per_second / plain.tokens_per_second if plain.tokens_per_second else None,
                          identical=plain.tokens == stats.tokens if params.is_greedy else None)  # greedy only
        summary["compare"] = comparison
    if args.json:
        record = {
            "text": "".join(text),
            "tokens": stats.tokens,
            "prompt_tokens": len(prompt_ids),
            "mode": "baseline" if drafter is None else "speculative",
            **_engine_facts(target, args),
            "draft": None if drafter is None else args.draft,
            "gamma": None if drafter is None else args.gamma,
            "temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
            "lenience": args.lenience, "seed": args.seed,
            **summary,
        }
        print(json.dumps(record, ensure_ascii=False))
    else:
        out.print()
        err = Console(stderr=True, no_color=args.no_color, highlight=False, soft_wrap=True)
        err.print(format_summary(stats), style="dim")
        if comparison:
            same = {True: " | same output: yes", False: " | same output: no", None: ""}[comparison["identical"]]
            err.print(f"plain decoding of the same prompt: {comparison['plain_tokens']} tokens, "
                      f"{comparison['plain_tokens_per_second']:.1f} tokens/s | speculative speedup "
                      f"{comparison['speedup']:.2f}x{same}")
    return 130 if stats.finish_reason == "interrupted" else 0


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


def cmd_info(args) -> int:
    from importlib.metadata import PackageNotFoundError, version

    from .models.files import cache_root
    from .models.load import load_model
    from .models.native.plan import cpu_flags, cpu_name, kernel_plan, runnable_paths

    if args.kernels:
        from .models.native.plan import ENV

        os.environ[ENV] = args.kernels
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
                  backend_reason=choice.reason if choice else f"--backend {args.backend}",
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


def cmd_analyze(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from .formulas import expected_tokens, hardware_speedup, operations_increase, optimal_gamma, speedup

    alpha, cost_ratio = args.alpha, args.cost_ratio
    ops_ratio = cost_ratio if args.ops_ratio is None else args.ops_ratio
    if not (0.0 <= alpha <= 1.0):
        raise ValueError(f"--alpha must be in [0, 1], got {alpha}")
    if not (cost_ratio >= 0 and ops_ratio >= 0):
        raise ValueError(f"--cost-ratio and --ops-ratio must be >= 0, got {cost_ratio} and {ops_ratio}")
    if any(g < 0 for g in args.gamma):
        raise ValueError(f"--gamma values must be >= 0, got {args.gamma}")
    _positive("--max-gamma", args.max_gamma)
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
        from .analysis.plots import plot_analysis

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


def _load_prompt_ids(args, tokenizer):
    from .bench.prompts import load_prompts
    from .text import encode_prompt

    prompts = load_prompts(args.prompts, args.categories, args.per_category)
    return prompts, [encode_prompt(tokenizer, p.text) for p in prompts]


def cmd_alpha(args) -> int:
    from .analysis.measure import measure_alpha

    params = _params(args)
    _positive("--max-new-tokens", args.max_new_tokens)
    target = _load_target(args)
    drafter = _load_drafter(args, target)
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


def cmd_profile(args) -> int:
    from .analysis.measure import drafter_step_seconds, profile_model

    _positive("--max-k", args.max_k)
    _positive("--context", args.context)
    _positive("--repeats", args.repeats)
    target = _load_target(args)
    drafter = _load_drafter(args, target)
    profile = profile_model(target, args.max_k, args.context, args.repeats, use_cache=not args.refresh)
    context = list(range(100, 100 + args.context))
    draft_seconds = drafter_step_seconds(drafter, context, repeats=args.repeats * 2)
    result = dict(target=profile.model, dtype=profile.dtype, threads=profile.threads, draft=args.draft,
                  **_engine_facts(target, args),
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


def cmd_bench(args) -> int:
    import platform
    from pathlib import Path

    import torch
    from rich.progress import Progress

    from .bench.prompts import load_prompts
    from .bench.report import aggregate
    from .bench.runner import run_benchmark
    from .bench.suite import plan_suite, write_results
    from .models.load import load_model
    from .models.native.plan import cpu_name
    from .models.profile import profile_model
    from .sampling import SamplingParams

    for t in args.temperatures:
        SamplingParams(temperature=t)
    if any(g != "auto" and g < 1 for g in args.gamma):
        raise ValueError(f"--gamma values must be >= 1 or 'auto', got {args.gamma}")
    _positive("--max-gamma", args.max_gamma)
    _positive("--max-new-tokens", args.max_new_tokens)
    if len(args.draft) > 1:
        raise ValueError("bench takes at most one --draft model")
    if args.anchor_lookup_tokens < 0:
        raise ValueError(f"--anchor-lookup-tokens must be >= 0, got {args.anchor_lookup_tokens}")
    prompts = load_prompts(args.prompts, args.categories, args.per_category)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = _load_target(args)
    draft = _load_draft_model(args.draft[0], args, target) if args.draft else None
    hf_dtype = "float32" if args.dtype == "float32" else "bfloat16"  # transformers has no 4-bit path here
    suite = plan_suite(target, args.backend, args.gamma, draft, args.draft[0] if args.draft else None, args.ngram,
                       suffix=args.suffix, anchors=not args.no_anchors, anchor_lookup_tokens=args.anchor_lookup_tokens,
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
                             gamma_policy=lambda g: _gamma_policy(g, args.max_gamma, target))
    meta = dict(command="specdecode " + " ".join(sys.argv[1:]), machine=platform.platform(),
                processor=cpu_name(), threads=torch.get_num_threads(),
                torch=torch.__version__, target=target.name, **_engine_facts(target, args),
                dtype="gguf" if args.backend == "llama.cpp" else str(getattr(target, "dtype", args.dtype)),
                max_new_tokens=args.max_new_tokens, prompts=len(prompts),
                target_step_seconds=profile.step_seconds, verify_ratios=profile.verify_ratios)
    header = (f"Command: `{meta['command']}`\n\nMachine: {meta['processor']}, {meta['machine']}, {meta['threads']} "
              f"torch threads, torch {meta['torch']}; target {meta['target']} ({args.backend}, {meta['dtype']}"
              + (f"; kernels {meta['kernels']}" if "kernels" in meta else "") + f"), T(1) = "
              f"{profile.step_seconds * 1e3:.1f} ms, T(8)/T(1) = {profile.ratio(8):.2f}; {len(prompts)} prompts, "
              f"max_new_tokens {args.max_new_tokens}\n\n")
    print(write_results(out, runs, aggregate(runs, profile), meta, header))
    print(f"written: {out}/results.md, results.json, speedup.png, timeline.png")
    return 0


def cmd_serve(args, app_only: bool = False) -> int:
    """`specdecode serve`; app_only: return the app instead of serving it (what each Ray replica runs)."""
    from pathlib import Path

    import uvicorn

    from .drafters.spec import DraftSpec
    from .options import check_gamma, check_queue_size
    from .server.app import create_app
    from .server.engine import Engine
    from .server.request import Limits

    if args.gamma != "auto":
        check_gamma(args.gamma, "--gamma")
    for name in ("max_gamma", "max_tokens", "max_body_bytes", "max_batch"):
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    check_queue_size("--max-queue", args.max_queue)
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    api_key = args.api_key if args.api_key is not None else os.environ.get("SPECDECODE_API_KEY") or None
    if api_key is not None and not api_key.strip():
        raise ValueError("--api-key must not be empty")
    if any(not name.strip() for name in args.model_name or []):
        raise ValueError("--model-name must not be empty")
    if api_key is None and not app_only and not _loopback(args.host):
        print(f"specdecode: warning: serving on {args.host} without an API key: anyone who can reach this port "
              "can use the model; set SPECDECODE_API_KEY (or --api-key)", file=sys.stderr, flush=True)
    drafts = {spec: spec for spec in [args.draft, *args.also_draft]}
    for spec in drafts:
        DraftSpec(spec)
    if args.ray:  # the app below on every replica of a Ray Serve application
        from .server.ray import serve_on_ray

        return serve_on_ray(args)
    if (args.replicas, args.min_replicas, args.max_replicas, args.address) != (None,) * 4:
        raise ValueError("--replicas, --min-replicas, --max-replicas and --address need --ray")
    target = _load_target(args)
    engine = Engine(target, drafts, args.draft, gamma=args.gamma, max_gamma=args.max_gamma, max_queue=args.max_queue,
                    max_batch=args.max_batch, backend=args.draft_backend or _draft_backend(args), dtype=args.dtype, device=args.device,
                    threads=args.threads)
    name, *aliases = args.model_name or [Path(target.name).name.removesuffix(".gguf")]
    app = create_app(engine, name, Limits(max_tokens=args.max_tokens, default_max_tokens=min(256, args.max_tokens),
                                          max_gamma=max(16, args.max_gamma)), args.max_body_bytes,
                     aliases=aliases, api_key=api_key, metrics_open=args.metrics_open)
    if app_only:
        return app
    print(f"specdecode: serving {', '.join([name, *aliases])} (drafts: {', '.join(drafts)}; gamma {args.gamma}) on "
          f"http://{args.host}:{args.port}/v1", flush=True)
    import logging

    # the server's own errors (every 5xx, with its id and traceback) on stderr
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        engine.close()
    return 0


def _loopback(host: str) -> bool:
    import ipaddress

    try:
        return host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def cmd_ngram(args) -> int:
    from .bench.prompts import load_prompts
    from .drafters.ngram import NgramDrafter
    from .models.load import load_model

    _positive("--order", args.order)
    target = load_model(args.target, args.backend, args.dtype, args.device, args.threads)
    if args.corpus.endswith(".npz"):  # a distillation corpus: the target's own answers, already tokens
        from .distill.data import Corpus

        corpus = Corpus.load(args.corpus)
        sequences = [corpus.answer(i).tolist() for i in range(corpus.num_sequences)]
    else:
        documents = load_prompts(args.corpus)
        sequences = [target.tokenizer.encode(d.text, add_special_tokens=False) for d in documents]
    drafter = NgramDrafter(target.vocab, order=args.order).fit(sequences)
    path = drafter.save(args.out)
    contexts = sum(len(table) for table in drafter.counts)
    print(f"fitted a {args.order}-gram on {sum(map(len, sequences))} tokens from {len(sequences)} documents "
          f"({contexts} contexts); written to {path} ({path.stat().st_size / 1e6:.2f} MB)")
    return 0


def cmd_distill(args) -> int:
    from .distill.run import distill
    from .models.hf import HFModel

    for name in ("layers", "dim", "heads", "mlp_dim", "embed_dim", "kept", "window", "batch_tokens", "gen_batch",
                 "answer_tokens"):
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    if args.data_minutes <= 0 or args.train_minutes <= 0:
        raise ValueError("--data-minutes and --train-minutes must be positive")
    for name in ("data_batches", "train_steps"):
        if getattr(args, name) is not None:
            _positive("--" + name.replace("_", "-"), getattr(args, name))
    if args.lr <= 0:
        raise ValueError(f"--lr must be positive, got {args.lr}")
    if args.backend == "auto":
        args.backend = "hf"
    if args.backend != "hf":
        raise ValueError("distill generates its corpus on the transformers backend; use --backend hf")
    out = os.path.abspath(args.out)
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise ValueError(f"--out {args.out!r} exists and is not an empty directory; nothing was overwritten")
    target = _load_target(args)
    if not isinstance(target, HFModel):
        raise ValueError("distill needs a transformers target")
    config = dict(layers=args.layers, dim=args.dim, heads=args.heads, mlp_dim=args.mlp_dim, embed_dim=args.embed_dim,
                  kept=args.kept, window=args.window)
    distill(target, out, args.corpus or out.rstrip("/") + ".corpus.npz", args.data_minutes * 60,
            args.train_minutes * 60, config, lr=args.lr, tokens_per_batch=args.batch_tokens, seed=args.seed,
            batch_size=args.gen_batch, max_new_tokens=args.answer_tokens, log=lambda m: print(m, flush=True),
            max_batches=args.data_batches, max_steps=args.train_steps)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        commands = {"generate": cmd_generate, "info": cmd_info, "analyze": cmd_analyze, "alpha": cmd_alpha, "profile": cmd_profile,
                    "bench": cmd_bench, "serve": cmd_serve, "ngram": cmd_ngram, "distill": cmd_distill}
        return commands[args.command](args)
    except (ValueError, FileNotFoundError, OSError, ImportError) as err:
        print(f"specdecode: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
