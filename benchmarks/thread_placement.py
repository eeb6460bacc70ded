"""The same library call on the main thread and on another thread (as a server's decode thread runs
it): `generate_batch` of one prompt at a time, greedy, prompt lookup, 128 tokens, on the default
target, in rounds that alternate the two.

    python benchmarks/thread_placement.py --out benchmarks/results/thread_placement.md
"""

from __future__ import annotations

import argparse
import platform
import sys
import threading
import time

from record import cpu_model

PROMPTS = [
    "Summarize: the quick brown fox jumps over the lazy dog, then runs into the forest to hide behind a big old "
    "tree until the sun goes down.",
    "What is the capital of France? Explain its history briefly.",
    "Rewrite in the past tense: the committee reviews the budget and approves the plan.",
    "Explain what a hash table is to a beginner.",
    "Write a short poem about the sea.",
]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--label", default="", help="what this run measures (e.g. the commit)")
    parser.add_argument("--out", default=None, help="a markdown file to append the result to")
    args = parser.parse_args()

    from specdecode import PromptLookupDrafter, SamplingParams, encode_prompt
    from specdecode.batch import generate_batch
    from specdecode.models.load import load_model

    target = load_model(None, backend="native")
    ids = [encode_prompt(target.tokenizer, p) for p in PROMPTS]

    def run() -> tuple[int, float]:
        start, tokens = time.perf_counter(), 0
        for prompt in ids:
            request = generate_batch(target, [prompt], PromptLookupDrafter, params=SamplingParams(temperature=0),
                                     max_new_tokens=args.max_new_tokens)[0]
            tokens += len(request.stats.tokens)
        return tokens, time.perf_counter() - start

    def on_thread() -> tuple[int, float]:
        out = {}
        worker = threading.Thread(target=lambda: out.update(result=run()))
        worker.start()
        worker.join()
        return out["result"]

    run()  # warm-up: kernels built, profile cached
    rates = {"main thread": [], "another thread": []}
    for _ in range(args.rounds):
        for where, call in (("main thread", run), ("another thread", on_thread)):
            tokens, seconds = call()
            rates[where].append(tokens / seconds)
    plan = getattr(target, "kernel_plan", repr(target))
    lines = [f"### {args.label or 'this tree'}", "",
             f"`{' '.join(['python', *sys.argv])}` on {cpu_model()}, {platform.platform()}; {plan}", "",
             "| where | tokens/s per round | median |", "|---|---|---|"]
    for where, values in rates.items():
        lines.append(f"| {where} | {', '.join(f'{v:.0f}' for v in values)} | {sorted(values)[len(values) // 2]:.0f} |")
    report = "\n".join(lines) + "\n\n"
    print(report)
    if args.out:
        with open(args.out, "a") as f:
            f.write(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
