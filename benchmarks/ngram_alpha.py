"""alpha of n-gram drafters vs prompt lookup on Spec-Bench prompts, for the embedded target.

The bigram is fitted on text the target itself generates from prompts built here (never the
Spec-Bench prompts, which are the evaluation set); the online variant also counts the running
context (prompt included). alpha = E[sum min(p, q)] on target generations, per Spec-Bench task.

    python benchmarks/ngram_alpha.py --out benchmarks/results/ngram_alpha.md
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from specdecode import PromptLookupDrafter, SamplingParams, autoregressive_decode, encode_prompt
from specdecode.analysis.measure import measure_alpha
from specdecode.bench.prompts import load_prompts
from specdecode.drafters.ngram import NgramDrafter
from specdecode.models.default import load_default_target
from record import SPEC_BENCH, publish

TOPICS = ["the ocean", "volcanoes", "a city park", "bread baking", "the moon", "chess", "rivers", "bees",
          "train travel", "photosynthesis", "a thunderstorm", "libraries", "bicycles", "coffee", "mountains",
          "the printing press", "recycling", "a marathon", "deserts", "music lessons"]
TASKS = ["Write a short paragraph about {}.", "Explain {} to a child.", "List three facts about {}."]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", default=str(SPEC_BENCH))
    ap.add_argument("--corpus-tokens", type=int, default=96, help="new tokens per corpus generation")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    target = load_default_target("bfloat16")
    start = time.perf_counter()
    corpus = []
    for i, (topic, task) in enumerate((t, k) for t in TOPICS for k in TASKS):
        ids = encode_prompt(target.tokenizer, task.format(topic))
        out = [t for s in autoregressive_decode(target, ids, params=SamplingParams(temperature=1.0), seed=i,
                                                 max_new_tokens=args.corpus_tokens) for t in s.tokens]
        corpus.append(ids + out)
    corpus_seconds = time.perf_counter() - start
    n_tokens = sum(map(len, corpus))

    categories = ["writing", "reasoning", "coding", "translation", "summarization", "qa", "math_reasoning", "rag"]
    prompts = load_prompts(args.questions, categories, per_category=1)
    tasks = list(dict.fromkeys(p.task for p in prompts))
    rows = []
    for temperature in (0.0, 1.0):
        params = SamplingParams(temperature=temperature)
        drafters = {
            "prompt lookup": lambda: PromptLookupDrafter(),
            "bigram": lambda: NgramDrafter(target.vocab, order=2).fit(corpus),
            "bigram + online": lambda: NgramDrafter(target.vocab, order=2, online=True).fit(corpus),
        }
        for name, make in drafters.items():
            cells = []
            for task in tasks:
                ids = [encode_prompt(target.tokenizer, p.text) for p in prompts if p.task == task]
                est = measure_alpha(target, make(), ids, params, args.max_new_tokens, seed=0)
                cells.append(f"{est.alpha:.2f} ± {est.stderr:.2f}")
                print(name, temperature, task, cells[-1], file=sys.stderr, flush=True)
            rows.append(f"| {name} | {temperature:g} | " + " | ".join(cells) + " |")

    lines = [
        f"Command: `python {' '.join(sys.argv)}`",
        f"Target SmolLM2-135M-Instruct (bf16, {torch.get_num_threads()} threads). Bigram fitted on {len(corpus)} target "
        f"generations from built prompts ({n_tokens} tokens, made in {corpus_seconds:.0f} s). alpha = E[sum min(p, q)] "
        f"± standard error over {args.max_new_tokens} generated tokens per prompt, 1 prompt per category.",
        "",
        "| drafter | temperature | " + " | ".join(tasks) + " |",
        "|---|---|" + "---|" * len(tasks),
        *rows,
    ]
    publish(lines, args.out)


if __name__ == "__main__":
    main()
