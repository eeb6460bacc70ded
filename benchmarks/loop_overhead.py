"""What the speculative loop costs where it does not draft: plain decoding, prompt lookup with gamma
fixed at 0 (the speculative loop, never drafting) and prompt lookup with gamma auto, sampled, on the
first Spec-Bench prompt of each category, each prompt's three runs back to back.

    python benchmarks/loop_overhead.py --temperature 1.0
    PYTHONPATH=<a checkout>/src python benchmarks/loop_overhead.py   # the same for another revision
"""

from __future__ import annotations

import argparse
import os
import statistics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data",
                                                          "spec_bench", "question.jsonl"))
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    from specdecode import PromptLookupDrafter, SamplingParams, Stats, encode_prompt, generate
    from specdecode.bench.prompts import load_prompts
    from specdecode.models.load import load_model

    target = load_model(None, backend="native")
    prompts = load_prompts(args.prompts, per_category=1)[: args.count]
    params = SamplingParams(temperature=args.temperature)
    runs = {"plain": (None, 0), "lookup, gamma 0": (PromptLookupDrafter, 0), "lookup, gamma auto": (PromptLookupDrafter, "auto")}
    speed = {name: [] for name in runs}
    for i, prompt in enumerate(prompts):
        ids = encode_prompt(target.tokenizer, prompt.text)
        for name, (drafter, gamma) in runs.items():
            stats = Stats()
            for _ in generate(target, ids, drafter() if drafter else None, gamma=gamma, params=params,
                              max_new_tokens=args.max_new_tokens, stats=stats, seed=i):
                pass
            speed[name].append(stats.tokens_per_second)
    plain = statistics.geometric_mean(speed["plain"])
    for name, values in speed.items():
        mean = statistics.geometric_mean(values)
        print(f"{name}: {mean:.1f} tokens/s ({mean / plain:.3f}x plain)")


if __name__ == "__main__":
    main()
