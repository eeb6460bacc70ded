"""`specdecode generate`: one prompt, decoded speculatively (or plainly with --baseline), streamed."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from .loading import draft_spec, engine_facts, gamma_policy, load_drafter, load_target, sampling_params, use_kernels


def grammar_of(args: argparse.Namespace):
    """--json-schema FILE ('-': any JSON object), --grammar FILE (Lark) or --regex PATTERN, compiled
    before any model loads (None without one)."""
    from ..grammar import Grammar, GrammarError

    if args.json_schema == "-":
        return Grammar.json_object()
    if args.json_schema is not None:
        try:
            schema = json.loads(Path(args.json_schema).read_text())
        except json.JSONDecodeError as err:
            raise GrammarError(f"--json-schema {args.json_schema} is not JSON: {err}") from None
        return Grammar.json_schema(schema)
    if args.grammar is not None:
        return Grammar.lark(Path(args.grammar).read_text())
    return Grammar.regex(args.regex) if args.regex is not None else None


def cmd_generate(args: argparse.Namespace) -> int:
    """`specdecode generate PROMPT`: stream the answer, each step coloured by who wrote it (or --json)."""
    import torch
    from rich.console import Console

    from ..checks import (check_gamma, check_lenience, check_max_new_tokens, check_positive_settings, check_prompt_text,
                          check_stop)
    from ..render import format_summary, no_gain, render_step
    from ..stats import Stats
    from ..text import encode_prompt, generate

    # Validate everything cheap before loading any model.
    params = sampling_params(args)
    if args.gamma != "auto":
        check_gamma(args.gamma, "--gamma")
        if args.gamma > args.max_gamma:
            raise ValueError(f"--gamma {args.gamma} is above --max-gamma {args.max_gamma}: each call would verify "
                             f"more drafted tokens than the cost model allows (a rejected guess costs its "
                             f"verification); raise --max-gamma to insist")
    check_positive_settings(args, "max_gamma")
    check_lenience(args.lenience, "--lenience")
    check_max_new_tokens(args.max_new_tokens, "--max-new-tokens")
    check_prompt_text(args.prompt)
    check_stop(args.stop)
    draft_spec(args)
    grammar = grammar_of(args)

    use_kernels(args.kernels)
    target = load_target(args)
    drafter = load_drafter(args, target)
    prompt_ids = encode_prompt(target.tokenizer, args.prompt, chat=not args.raw)
    gamma = gamma_policy(args.gamma, args.max_gamma, target) if drafter is not None else 0
    if args.compare and drafter is not None:  # warm up once, so neither timed run pays first-call costs
        target.forward(torch.tensor([prompt_ids]), target.new_cache(), num_logits=1)
    stats = Stats()
    stream = generate(
        target, prompt_ids, drafter, gamma=gamma, params=params, max_new_tokens=args.max_new_tokens,
        lenience=args.lenience, seed=args.seed, stop=args.stop, stats=stats, grammar=grammar,
    )
    no_color = args.no_color or bool(os.environ.get("NO_COLOR"))  # https://no-color.org
    out = Console(no_color=no_color, highlight=False, soft_wrap=True)
    color = out.is_terminal and not no_color
    text = []
    try:
        for piece in stream:
            text.append(piece.accepted_text + piece.target_text)
            if not args.json:
                out.print(render_step(piece, color, args.show_rejected), end="")
    except KeyboardInterrupt:
        stats.finish_reason = "interrupted"
    finally:
        stream.close()
    summary = stats.summary()
    comparison = None
    if args.compare and drafter is not None and stats.finish_reason != "interrupted":
        plain = Stats()
        for _ in generate(target, prompt_ids, None, params=params, max_new_tokens=args.max_new_tokens,
                          seed=args.seed, stop=args.stop, stats=plain, grammar=grammar):
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
            **engine_facts(target, args.backend),
            "draft": None if drafter is None else args.draft,
            "gamma": None if drafter is None else args.gamma,
            "temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
            "lenience": args.lenience, "seed": args.seed,
            **summary,
        }
        print(json.dumps(record, ensure_ascii=False))
    else:
        out.print()
        err = Console(stderr=True, no_color=no_color, highlight=False, soft_wrap=True)
        err.print(format_summary(stats), style=None if no_color else "dim")
        if comparison:
            same = {True: " | same output: yes", False: " | same output: no", None: ""}[comparison["identical"]]
            err.print(f"plain decoding of the same prompt: {comparison['plain_tokens']} tokens, "
                      f"{comparison['plain_tokens_per_second']:.1f} tokens/s | speculative speedup "
                      f"{comparison['speedup']:.2f}x{same}")
            if comparison["speedup"] is not None and comparison["speedup"] < 1:
                err.print(no_gain(stats), style=None if no_color else "dim")
    return 130 if stats.finish_reason == "interrupted" else 0
