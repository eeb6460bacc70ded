"""What speculation gives under a sampling control, against what it gives without: the default
drafter (`defaults.DRAFT`, `--gamma auto`) over plain decoding, greedy, with and without a control
(default: a repetition penalty of 1.1, a common chat front end's default, over each of
`--repeat-last-n`: all tokens as vLLM reads it, the last 64 as llama.cpp does), and sampled at each of
`--temperatures` (seeded per prompt), on Spec-Bench prompts, every run of a prompt in turns (the
order alternating by prompt and round), in one process.

    python benchmarks/controls_speedup.py --per-task 4 --temperatures 0.7 1.0 --rounds 2 \
        --out benchmarks/results/controls_speedup.md
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from record import SPEC_BENCH, bootstrap_interval, cpu_model, publish  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default=str(SPEC_BENCH))
    parser.add_argument("--per-task", type=int, default=4)
    parser.add_argument("--repetition-penalty", type=float, default=1.1, help="0: leave the penalty out")
    parser.add_argument("--repeat-last-n", type=int, nargs="+", default=[-1, 64],
                        help="the penalty's windows, one setting each (-1: all tokens)")
    parser.add_argument("--temperatures", type=float, nargs="*", default=[])
    parser.add_argument("--others", action="store_true",
                        help="also greedy under each other control: presence and frequency penalties of 0.5, "
                             "min_p 0.1, and a logit_bias of -3 on the token ' the'")
    parser.add_argument("--rounds", type=int, default=1, help="passes over the prompts, taking turns")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from specdecode import SamplingParams, Stats, defaults, encode_prompt, generate
    from specdecode.bench.prompts import load_prompts
    from specdecode.drafters.spec import make_drafter
    from specdecode.models.load import load_model

    target = load_model(None, backend="native")
    prompts = load_prompts(args.prompts, per_category=args.per_task)
    settings = {"none": SamplingParams(temperature=0)}
    penalties = {f"repetition {args.repetition_penalty:g}, " + ("all" if n < 0 else f"last {n}"): n
                 for n in args.repeat_last_n} if args.repetition_penalty else {}  # 0 leaves it out
    for name, n in penalties.items():
        settings[name] = SamplingParams(temperature=0, repetition_penalty=args.repetition_penalty, repeat_last_n=n)
    if args.others:
        the = target.tokenizer.encode(" the", add_special_tokens=False)[0]
        settings.update({"presence 0.5": SamplingParams(temperature=0, presence_penalty=0.5),
                         "frequency 0.5": SamplingParams(temperature=0, frequency_penalty=0.5),
                         "min_p 0.1": SamplingParams(temperature=0, min_p=0.1),
                         "logit_bias ' the' -3": SamplingParams(temperature=0, logit_bias={the: -3.0})})
    settings.update({f"temperature {t:g}": SamplingParams(temperature=t) for t in args.temperatures})
    speed = {(name, spec): [] for name in settings for spec in (False, True)}
    identical = {name: 0 for name in settings}
    by_category = {(name, spec): {} for name in settings for spec in (False, True)}
    for round_ in range(args.rounds):
        for i, prompt in enumerate(prompts):
            ids = encode_prompt(target.tokenizer, prompt.text)
            outputs = {}
            order = [(name, spec) for name in settings for spec in (False, True)]
            for name, spec in order if (i + round_) % 2 == 0 else order[::-1]:
                stats = Stats()
                drafter = make_drafter(defaults.DRAFT, target) if spec else None
                for _ in generate(target, ids, drafter, gamma="auto" if spec else 0,
                                  params=settings[name], max_new_tokens=args.max_new_tokens, stats=stats,
                                  seed=1000 * round_ + i):
                    pass
                speed[(name, spec)].append(stats.tokens_per_second)
                by_category[(name, spec)].setdefault(prompt.category, []).append(stats.tokens_per_second)
                outputs[(name, spec)] = stats.tokens
            for name in settings:
                identical[name] += outputs[(name, False)] == outputs[(name, True)]

    def mean(values):
        return math.exp(sum(map(math.log, values)) / len(values))

    rows, gains, runs = [], {}, len(prompts) * args.rounds
    for name in settings:
        plain, spec = mean(speed[(name, False)]), mean(speed[(name, True)])
        ratios = [s / p for s, p in zip(speed[(name, True)], speed[(name, False)])]
        gains[name] = mean(ratios)
        low, high = bootstrap_interval(lambda ix: mean([ratios[i] for i in ix]), len(ratios))
        same = f"{identical[name]}/{runs}" if settings[name].temperature == 0 else "(sampled)"
        rows.append(f"| {name} | {plain:.1f} | {spec:.1f} | {gains[name]:.3f}x | {low:.3f}-{high:.3f} | {same} |")
    categories = sorted({c for table in by_category.values() for c in table})
    per_category = [f"| {c} | " + " | ".join(
        f"{mean(by_category[(name, True)][c]) / mean(by_category[(name, False)][c]):.2f}x" for name in settings) + " |"
        for c in categories]
    under = " ".join(f"Under `{name}` the speedup is **{gains[name] / gains['none']:.3f}** of the speedup without it."
                     for name in penalties)
    publish(["# Speculation under sampling controls: " + ", ".join(name for name in settings if name != "none"), "",
             f"Host: {cpu_model()}; kernels: {target.kernel_plan}; {len(prompts)} Spec-Bench prompts "
             f"({args.per_task} a category), {args.rounds} round(s) taking turns, {args.max_new_tokens} tokens, "
             f"{time.strftime('%Y-%m-%d')}.", "",
             "```", "python " + " ".join(sys.argv), "```", "",
             f"| control | plain tok/s | {defaults.DRAFT} + gamma auto tok/s | speedup (geometric mean of ratios) | 95% interval "
             "(bootstrap) | greedy output identical |",
             "|---|---|---|---|---|---|", *rows, "",
             under, "",
             "Per category, speculation over plain (ratio of geometric means):", "",
             "| category | " + " | ".join(settings) + " |", "|---|" + "---|" * len(settings), *per_category],
            args.out)


if __name__ == "__main__":
    main()
