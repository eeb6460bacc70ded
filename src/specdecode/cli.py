"""`specdecode generate`: speculative decoding from the command line."""

from __future__ import annotations

import argparse
import json
import os
import sys

LOOKUP = "lookup"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdecode", description="Lossless speculative decoding.")
    commands = parser.add_subparsers(dest="command", required=True)

    gen = commands.add_parser("generate", help="generate text, speculatively by default")
    gen.add_argument("prompt", help="the user message (the target's chat template is applied unless --raw)")
    gen.add_argument("--target", help="target model: a .gguf file or a transformers directory "
                     "(default: the embedded SmolLM2-135M-Instruct)")
    gen.add_argument("--draft", default=LOOKUP, help="draft model path, or 'lookup' for prompt lookup (default)")
    gen.add_argument("--gamma", type=int, default=4, help="draft tokens per target call (default 4)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = all)")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = all)")
    gen.add_argument("--lenience", type=float, default=1.0,
                     help="lenient acceptance in (0, 1]; 1 = exact (the target's distribution)")
    gen.add_argument("--seed", type=int, default=None, help="make sampling reproducible")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--baseline", action="store_true", help="plain autoregressive decoding, no draft")
    gen.add_argument("--raw", action="store_true", help="do not apply the chat template")
    gen.add_argument("--dtype", default="bfloat16", help="bfloat16 (default, faster on CPU) or float32")
    gen.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    gen.add_argument("--no-color", action="store_true", help="plain text, no Figure-1 colours")
    return parser


def _load_target(args):
    from .models.default import load_default_target
    from .models.hf import load_hf

    if args.target:
        return load_hf(args.target, dtype=args.dtype, device=args.device)
    return load_default_target(dtype=args.dtype, device=args.device)


def _load_drafter(args, target):
    from .drafters import ModelDrafter, PromptLookupDrafter
    from .models.base import check_same_vocab
    from .models.hf import load_hf

    if args.baseline:
        return None
    if args.draft == LOOKUP:
        return PromptLookupDrafter()
    draft = load_hf(args.draft, dtype=args.dtype, device=args.device)
    check_same_vocab(target.vocab, draft.vocab)
    return ModelDrafter(draft)


def cmd_generate(args) -> int:
    from rich.console import Console

    from .generate import Stats, encode_prompt, generate
    from .render import format_summary, render_step
    from .sampling import SamplingParams

    # Validate everything cheap before loading any model.
    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    if args.gamma < 0:
        raise ValueError(f"--gamma must be >= 0, got {args.gamma}")
    if not (0.0 < args.lenience <= 1.0):
        raise ValueError(f"--lenience must be in (0, 1], got {args.lenience}")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if not args.prompt.strip():
        raise ValueError("the prompt is empty")

    target = _load_target(args)
    drafter = _load_drafter(args, target)
    prompt_ids = encode_prompt(target.tokenizer, args.prompt, chat=not args.raw)
    stats = Stats()
    stream = generate(
        target, prompt_ids, drafter, gamma=args.gamma, params=params, max_new_tokens=args.max_new_tokens,
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
    if args.json:
        record = {
            "text": "".join(text),
            "tokens": stats.tokens,
            "prompt_tokens": len(prompt_ids),
            "mode": "baseline" if drafter is None else "speculative",
            "draft": None if drafter is None else args.draft,
            "gamma": None if drafter is None else args.gamma,
            "temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
            "lenience": args.lenience, "seed": args.seed,
            **summary,
        }
        print(json.dumps(record, ensure_ascii=False))
    else:
        out.print()
        Console(stderr=True, no_color=args.no_color, highlight=False, soft_wrap=True).print(format_summary(stats), style="dim")
    return 130 if stats.finish_reason == "interrupted" else 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        return {"generate": cmd_generate}[args.command](args)
    except (ValueError, FileNotFoundError, OSError) as err:
        print(f"specdecode: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
