"""alpha per Spec-Bench task for prompt lookup, an n-gram drafter, a trained draft network and the
two combined (lookup on repeats, the network elsewhere), greedy and at temperature 1, for the
embedded target.

Every drafter is scored on the same target generations (one per prompt and temperature):
alpha = E[beta], beta = sum_x min(p(x), q(x)) at each generated position (Leviathan et al.,
Definition 3.1), with prompt-clustered standard errors.

    python benchmarks/drafter_alpha.py --ngram bigram.npz --draft DIR --out benchmarks/results/drafter_alpha.md
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from specdecode import LookupThenModelDrafter, ModelDrafter, PromptLookupDrafter, SamplingParams, autoregressive_decode, encode_prompt
from specdecode.analysis.measure import position_betas, summarize_betas
from specdecode.bench.prompts import SPEC_BENCH_TASKS, load_prompts
from specdecode.drafters.ngram import NgramDrafter
from specdecode.models.default import load_default_target
from specdecode.models.load import load_model
from record import SPEC_BENCH, publish

TASKS = ["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", default=str(SPEC_BENCH))
    ap.add_argument("--ngram", required=True, help="n-gram drafter .npz (counted online as well)")
    ap.add_argument("--draft", required=True, help="trained draft network directory")
    ap.add_argument("--per-task", type=int, default=4, help="prompts per task (mt_bench: spread over its categories)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    target = load_default_target(args.dtype)
    draft = load_model(args.draft, dtype="float32")
    drafters = {
        "prompt lookup": PromptLookupDrafter,
        "bigram + online": lambda: NgramDrafter.load(args.ngram, online=True),
        "trained draft": lambda: ModelDrafter(draft),
        "lookup + trained draft": lambda: LookupThenModelDrafter(ModelDrafter(draft)),
    }
    prompts = []
    for task in TASKS:
        cats = [c for c, t in SPEC_BENCH_TASKS.items() if t == task]
        per_cat = max(1, args.per_task // len(cats))
        prompts += load_prompts(args.questions, cats, per_cat)[: args.per_task]
    start = time.perf_counter()
    rows = []
    for temperature in (0.0, 1.0):
        params = SamplingParams(temperature=temperature)
        betas = {name: {task: [] for task in TASKS} for name in drafters}
        for n, prompt in enumerate(prompts):
            ids = encode_prompt(target.tokenizer, prompt.text)
            gen = torch.Generator().manual_seed(n)
            out = [t for s in autoregressive_decode(target, ids, params=params, max_new_tokens=args.max_new_tokens,
                                                     generator=gen) for t in s.tokens]
            for name, make in drafters.items():
                betas[name][prompt.task].append(position_betas(target, make(), ids, out, params, gen))
            print(f"temperature {temperature:g}: {n + 1}/{len(prompts)} prompts, {time.perf_counter() - start:.0f} s",
                  file=sys.stderr, flush=True)
        for name in drafters:
            cells = []
            for task in TASKS:
                est = summarize_betas(betas[name][task])
                cells.append(f"{est.alpha:.2f} ± {est.stderr:.2f}")
            overall = summarize_betas([b for task in TASKS for b in betas[name][task]])
            rows.append(f"| {name} | {temperature:g} | " + " | ".join(cells) + f" | {overall.alpha:.2f} ± {overall.stderr:.2f} |")
            print(rows[-1], file=sys.stderr, flush=True)

    per_task = {t: sum(p.task == t for p in prompts) for t in TASKS}
    lines = [
        f"Command: `python {' '.join(sys.argv)}`",
        "",
        f"Target SmolLM2-135M-Instruct ({args.dtype}, {torch.get_num_threads()} threads); {args.max_new_tokens} "
        f"target-generated tokens per prompt; prompts per task: {per_task}. alpha = E[sum min(p, q)] ± standard "
        f"error (prompts as clusters). {time.perf_counter() - start:.0f} s.",
        "",
        "| drafter | temperature | " + " | ".join(TASKS) + " | overall |",
        "|---|---|" + "---|" * (len(TASKS) + 1),
        *rows,
    ]
    publish(lines, args.out)


if __name__ == "__main__":
    main()
