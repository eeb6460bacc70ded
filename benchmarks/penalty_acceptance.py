"""How much of a copying draft a repetition penalty lets through: prompt lookup at a fixed gamma,
greedy, on Spec-Bench prompts, with and without the penalty. Reports the draft tokens accepted
(acceptance) and the tokens each target call yields; no timing, so the host's speed does not enter.

    python benchmarks/penalty_acceptance.py --per-task 1 --out benchmarks/results/penalty_acceptance.md
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from record import SPEC_BENCH, cpu_model, publish  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default=str(SPEC_BENCH))
    parser.add_argument("--per-task", type=int, default=1)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--penalties", type=float, nargs="+", default=[1.1, 1.3])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from specdecode import PromptLookupDrafter, SamplingParams, Stats, encode_prompt, generate
    from specdecode.bench.prompts import load_prompts
    from specdecode.models.load import load_model

    target = load_model(None, backend="native")
    prompts = [encode_prompt(target.tokenizer, p.text) for p in load_prompts(args.prompts,
                                                                            per_category=args.per_task)]
    rows = []
    for penalty in [1.0, *args.penalties]:
        params = SamplingParams(temperature=0, repetition_penalty=penalty)
        calls = tokens = proposed = accepted = 0
        for ids in prompts:
            stats = Stats()
            for _ in generate(target, ids, PromptLookupDrafter(), gamma=args.gamma, params=params,
                              max_new_tokens=args.max_new_tokens, stats=stats):
                pass
            calls, tokens = calls + stats.target_calls, tokens + len(stats.tokens)
            proposed, accepted = proposed + stats.proposed, accepted + stats.accepted
        rows.append(f"| {penalty:g} | {proposed / calls:.2f} | {accepted / max(proposed, 1):.1%} | "
                    f"{tokens / calls:.2f} |")
    publish(["# What a repetition penalty leaves of a copying draft", "",
             "```", "python " + " ".join(sys.argv), "```", "",
             f"Host: {cpu_model()}; target {target.name} on native ({target.kernel_plan}); prompt lookup, gamma "
             f"{args.gamma}, greedy; {len(prompts)} Spec-Bench prompts ({args.per_task} a category), "
             f"{args.max_new_tokens} tokens each.", "",
             "| repetition penalty | draft tokens proposed a call | accepted | tokens a target call |",
             "|---|---|---|---|", *rows], args.out)


if __name__ == "__main__":
    main()
