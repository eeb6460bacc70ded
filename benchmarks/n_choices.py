"""n choices of one prompt in the batch: the prompt computed once or n times.

A Spec-Bench-length prompt (the first summarisation prompt, about 400 tokens) submitted n times at
once, as a server submits a request's n choices (seeds 0..n-1, temperature 0.8, 32 tokens each,
prompt lookup at gamma auto), on the embedded model; the prompt rows the batch's forwards computed
and the wall time to the last token, best of `--rounds`, for this checkout and, in its own process,
an earlier one (`--baseline`, its src/). The machine's load moves the times, not the rows.

    python benchmarks/n_choices.py --n 4 --baseline <checkout>/src --out benchmarks/results/n_choices.md
    python benchmarks/n_choices.py --n 4 --against-one   # n choices against one choice's time, this checkout
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from record import SPEC_BENCH, cpu_model, publish

ROOT = Path(__file__).resolve().parents[1]
CHILD = r"""
import json, sys, time
from specdecode import PromptLookupDrafter, SamplingParams, encode_prompt
from specdecode.batch import Batch
from specdecode.models.load import load_model
n, rounds, text = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
model = load_model(None, choose_by_speed=False)
ids = encode_prompt(model.tokenizer, text)
best = None
for _ in range(rounds):
    batch = Batch(model, max_batch=n)
    for seed in range(n):
        batch.submit(ids, PromptLookupDrafter(), params=SamplingParams(temperature=0.8), seed=seed, max_new_tokens=32)
    rows, start = 0, time.perf_counter()
    while not batch.done:
        batch.step()
        rows += batch.last_forward[1] if batch.last_forward else 0
    wall = time.perf_counter() - start
    best = wall if best is None else min(best, wall)
print(json.dumps({"prompt": len(ids), "rows": rows, "wall": best}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, default=None)
    parser.add_argument("--against-one", action="store_true", help="also time one choice (n = 1), this checkout")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    prompts = [json.loads(line) for line in SPEC_BENCH.open()]
    text = next(p["turns"][0] for p in prompts if p.get("category") == "summarization")
    trees = {"this checkout": ROOT / "src"}
    if args.baseline is not None:
        trees = {"baseline": args.baseline, **trees}
    lines = ["# n choices of one prompt", "", "```", "python benchmarks/n_choices.py " + " ".join(sys.argv[1:]), "```",
             "", f"Machine: {cpu_model()}; the embedded model, its default kernel path; n = {args.n}.", "",
             "| tree | choices | prompt tokens | rows the forwards computed | wall to the last token |",
             "|---|---|---|---|---|"]
    runs = [(name, tree, args.n) for name, tree in trees.items()]
    if args.against_one:
        runs.insert(0, ("this checkout", ROOT / "src", 1))
    walls = {}
    for name, tree, n in runs:
        done = subprocess.run([sys.executable, "-c", CHILD, str(n), str(args.rounds), text], check=True,
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tree)})
        m = json.loads(done.stdout.strip().splitlines()[-1])
        walls[(name, n)] = m["wall"]
        lines.append(f"| {name} | {n} | {m['prompt']} | {m['rows']} | {m['wall']:.2f} s |")
    if args.against_one:
        lines += ["", f"{args.n} choices took {walls[('this checkout', args.n)] / walls[('this checkout', 1)]:.2f}x "
                      "one choice's time."]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
