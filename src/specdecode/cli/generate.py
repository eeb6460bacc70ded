"""`specdecode generate`: one prompt, decoded speculatively (or plainly with --baseline), streamed."""

from __future__ import annotations

import argparse
import dataclasses
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


# settings under which the first token may be shown before the model loads: greedy, nothing that
# changes the first logits or their argmax, text streamed as it comes (`early_token`)
PLAIN = dict(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, presence_penalty=0.0, frequency_penalty=0.0,
             repetition_penalty=1.0, repeat_penalty=None, logit_bias=[], json_schema=None, grammar=None, regex=None,
             stop=[], json=False, compare=False, dtype="auto")


def _snapshot_place(args: argparse.Namespace):
    """(the target's path, the settings a first-token snapshot is saved under), or None where this
    command may not show a first token early (`PLAIN`, a native or auto backend on the CPU)."""
    from ..models.default import default_target_path

    if any(getattr(args, name) != value for name, value in PLAIN.items()) or args.backend not in ("auto", "native") \
            or args.device not in (None, "cpu"):
        return None
    path = Path(args.target).expanduser() if args.target else default_target_path()
    return (path, dict(backend=args.backend, threads=args.threads, ctx=args.ctx_size, device=args.device)) \
        if path.is_file() else None


def early_token(args: argparse.Namespace, out) -> str:
    """Print the greedy first token before PyTorch is imported (`models.native.first_token`), from the
    snapshot an earlier run of the same model and settings saved; the text shown ("" where none)."""
    from rich.text import Text

    from ..detokenize import IncrementalText, stable
    from ..models.native.first_token import greedy, open_snapshot
    from ..prompts import encode_prompt
    from ..render import TARGET

    place = _snapshot_place(args)
    snapshot = place and open_snapshot(*place)
    if not snapshot:
        return ""
    tokenizer = snapshot.tokenizer()
    logits = snapshot.first_logits(encode_prompt(tokenizer, args.prompt, chat=not args.raw))
    token = None if logits is None else greedy(logits)
    if token is None or token in snapshot.meta["eos"]:
        return ""
    text = stable(IncrementalText(tokenizer, [token]).upto(1), "")
    out.print(Text(text, style=TARGET if out.is_terminal and not out.no_color else None), end="")
    return text


def save_snapshot(args: argparse.Namespace, target) -> None:
    """After a load that `early_token` could not serve: save the snapshot that serves the next."""
    from ..models.native import first_token

    place = _snapshot_place(args)
    if place is None or getattr(target, "backend", None) != "native" or first_token.refusal(target):
        return
    from ..progress import waiting

    directory = first_token.location(*place)
    if not (directory / "meta.json").exists():
        with waiting("saving what shows the first token before the model loads, next time", once=True):
            first_token.save(target, directory, getattr(target, "backend_choice_file", None))


def _unshown(piece, shown: str):
    """(the piece less the text `shown` already put on the screen, what of `shown` is left). Where
    the loaded model's text does not begin with it (a tokenizer whose text of one token is not the
    start of its text of more), the piece whole on a new line: nothing of the answer is lost."""
    accepted = len(os.path.commonprefix([piece.accepted_text, shown]))
    rest = shown[accepted:]
    target = len(os.path.commonprefix([piece.target_text, rest])) if accepted == len(piece.accepted_text) else 0
    if accepted + target < min(len(shown), len(piece.accepted_text) + len(piece.target_text)):
        return dataclasses.replace(piece, accepted_text="\n" + piece.accepted_text), ""
    return dataclasses.replace(piece, accepted_text=piece.accepted_text[accepted:],
                               target_text=piece.target_text[target:]), rest[target:]


def cmd_generate(args: argparse.Namespace) -> int:
    """`specdecode generate PROMPT`: stream the answer, each step coloured by who wrote it (or --json)."""
    from rich.console import Console

    from ..checks import (check_gamma, check_lenience, check_max_new_tokens, check_positive_settings, check_prompt_text,
                          check_stop)

    # Validate everything cheap before loading any model.
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
    no_color = args.no_color or bool(os.environ.get("NO_COLOR"))  # https://no-color.org
    out = Console(no_color=no_color, highlight=False, soft_wrap=True)
    use_kernels(args.kernels)
    shown = early_token(args, out)  # before PyTorch's import: the plain settings only, which need no checks
    if shown:
        from ..progress import enable

        enable(False)  # no spinner over the answer's line

    import torch

    from ..prompts import encode_prompt
    from ..render import format_summary, no_gain, render_step
    from ..stats import Stats
    from ..text import generate

    params = sampling_params(args)
    grammar = grammar_of(args)
    target = load_target(args)
    if not shown:
        save_snapshot(args, target)
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
    color = out.is_terminal and not no_color
    text = []
    try:
        for piece in stream:
            text.append(piece.accepted_text + piece.target_text)
            if shown:
                piece, shown = _unshown(piece, shown)
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
