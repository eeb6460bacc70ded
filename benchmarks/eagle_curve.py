"""A feature draft's learning curve, as its training recorded it (`specdecode distill --eagle`).

At each evaluation the training tokens seen, the held-out first-step greedy agreement with the
target and the expected acceptance at temperature 1, alpha = E[sum_x min(p, q)] over the target's
whole vocabulary: what more data buys, measured rather than assumed.

    python benchmarks/eagle_curve.py --draft src/specdecode/weights/smollm2-135m-instruct-eagle \
        --command "specdecode distill --eagle ..." --out benchmarks/results/eagle_training.md
"""

from __future__ import annotations

import argparse

from specdecode.drafters.eagle import SHIPPED
from specdecode.models.eagle import load_eagle
from record import publish


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draft", default=str(SHIPPED))
    parser.add_argument("--command", default=None, help="the distill command that trained it, for the record")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    net, meta = load_eagle(args.draft)
    c = net.config
    lines = ["# A feature draft's learning curve", "", "```", args.command or "specdecode distill --eagle", "```", "",
             f"Target {meta.get('target', c.target)}; draft: one layer, MLP width {c.hidden}, {c.kept} kept tokens; "
             f"corpus: {meta.get('sequences')} answers, {meta.get('answer_tokens')} answer tokens "
             f"({meta.get('corpus_tokens')} tokens with the prompts); {meta.get('steps')} steps in "
             f"{meta.get('seconds')} s all told. Held-out: the sequences set aside ({meta['curve'][0]['positions']} "
             "positions).", "",
             "| step | training tokens | seconds | held-out greedy agreement | held-out alpha (temperature 1) |",
             "|---|---|---|---|---|"]
    for r in meta["curve"]:
        lines.append(f"| {r['step']} | {r['tokens']:,} | {r['seconds']} | {r['greedy']:.3f} | {r['alpha']:.3f} |")
    lines += ["", f"Kept: the weights of the best held-out alpha ({meta['best_alpha']:.3f})."]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
