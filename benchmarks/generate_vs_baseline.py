"""specdecode generate (prompt lookup) vs plain autoregressive decoding on Spec-Bench prompts.

Both run in one process on one loaded model, alternating, so machine noise hits them alike.
Greedy; reports the median tokens/s over repeats and whether the outputs are identical.

    python benchmarks/generate_vs_baseline.py --categories summarization rag writing \
        --out benchmarks/results/generate_vs_baseline.md
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys

import torch

from specdecode import PromptLookupDrafter, SamplingParams, Stats, encode_prompt, generate
from specdecode.bench.prompts import load_prompts
from specdecode.models.default import load_default_target
from record import SPEC_BENCH, publish



def first_of(categories, path):
    """The first prompt of each category, in the order the categories are given."""
    prompts = load_prompts(path, categories, per_category=1)
    return sorted(prompts, key=lambda p: categories.index(p.category))


def run(target, ids, drafter, gamma, max_new_tokens):
    stats = Stats()
    for _ in generate(target, ids, drafter, gamma=gamma, params=SamplingParams(temperature=0),
                      max_new_tokens=max_new_tokens, stats=stats):
        pass
    return stats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--categories", nargs="+", default=["summarization", "rag", "writing"])
    ap.add_argument("--questions", default=str(SPEC_BENCH))
    ap.add_argument("--gamma", type=int, nargs="+", default=[4])
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    target = load_default_target(dtype=args.dtype)
    rows = []
    for q in first_of(args.categories, args.questions):
        ids = encode_prompt(target.tokenizer, q.text)
        runs = {"baseline": []} | {f"lookup g={g}": [] for g in args.gamma}
        for _ in range(args.repeats):
            runs["baseline"].append(run(target, ids, None, 0, args.max_new_tokens))
            for g in args.gamma:
                runs[f"lookup g={g}"].append(run(target, ids, PromptLookupDrafter(), g, args.max_new_tokens))
        base_tps = statistics.median(s.tokens_per_second for s in runs["baseline"])
        base_tokens = runs["baseline"][0].tokens
        for name, stats in runs.items():
            tps = statistics.median(s.tokens_per_second for s in stats)
            rows.append(dict(category=q.category, question_id=q.id, prompt_tokens=len(ids),
                             method=name, new_tokens=stats[0].new_tokens,
                             tokens_per_call=stats[0].tokens_per_call, acceptance=stats[0].acceptance_rate,
                             alpha=stats[0].alpha,
                             tokens_per_second=tps, speedup=tps / base_tps,
                             identical=stats[0].tokens == base_tokens))
            print(json.dumps(rows[-1]), file=sys.stderr)

    lines = [
        f"Command: `python {' '.join(sys.argv)}`",
        f"Machine: {platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}, "
        f"dtype {args.dtype}, greedy, max_new_tokens {args.max_new_tokens}, median of {args.repeats} runs",
        "",
        "| task | question | prompt tokens | method | new tokens | tokens/call | acceptance | alpha | tokens/s | speedup | identical to baseline |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.1%}"
        alpha = "-" if r["alpha"] is None else f"{r['alpha']:.2f}"
        lines.append(f"| {r['category']} | {r['question_id']} | {r['prompt_tokens']} | {r['method']} | {r['new_tokens']} "
                     f"| {r['tokens_per_call']:.2f} | {acc} | {alpha} | {r['tokens_per_second']:.1f} | {r['speedup']:.2f}x "
                     f"| {'yes' if r['identical'] else 'no'} |")
    publish(lines, args.out)


if __name__ == "__main__":
    main()
