"""The native backend's one-token step (T(1)), LM head and held bytes on one GGUF file, from this
checkout and from another, in turns (size_sweep.py's child process, each run a fresh load): a
before/after of a kernel change on a host whose speed drifts by minutes.

    python benchmarks/native_ab.py FILE --tree <a checkout of an earlier revision> --rounds 5 --runs 5 \
        --out benchmarks/results/<name>.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

from record import cpu_model, publish
from size_sweep import CHILD


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--tree", required=True, help="a checkout of the revision to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=5, help="size_sweep's runs in each child (best of 5 steps each)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    revision = subprocess.run(["git", "-C", args.tree, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
    trees = {"this checkout": Path(__file__).parents[1] / "src", f"{revision} (before)": Path(args.tree) / "src"}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"OMP_NUM_THREADS": str(args.threads)}
    runs = {name: [] for name in trees}
    for round_ in range(args.rounds):
        for name, src in trees.items():
            done = subprocess.run([sys.executable, "-c", CHILD, args.file, str(args.runs)], capture_output=True,
                                  text=True, env=env | {"PYTHONPATH": str(src)})
            if done.returncode:
                raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
            run = json.loads(done.stdout.strip().splitlines()[-1])
            runs[name].append(run)
            print(round_, name, f"T(1) {run['t1'] * 1e3:.2f} ms, head {run['head'] * 1e3:.2f} ms", flush=True)
    rows = []
    for name, rs in runs.items():
        t1, head = [r["t1"] * 1e3 for r in rs], [r["head"] * 1e3 for r in rs]
        rows.append(f"| {name} | {min(t1):.2f} ms | {statistics.median(t1):.2f} ms | {min(head):.2f} ms | "
                    f"{statistics.median(head):.2f} ms | {rs[0]['bytes'] / 2**20:.0f} MiB | "
                    f"{statistics.median(r['added'] for r in rs) / 2**20:.0f} MiB |")
    lines = ["# The native backend, this checkout against an earlier one, in turns", "", "```",
             "python benchmarks/native_ab.py " + " ".join(sys.argv[1:]), "```", "",
             f"Machine: {cpu_model()}, {platform.platform()}, {args.threads} threads; native: {runs['this checkout'][0]['plan']}; "
             f"file: {Path(args.file).name}; {args.rounds} rounds, the two in turns, each a fresh process (best of "
             f"{args.runs} x 5 steps). T(1): one new token at 256 cached positions; head: the LM head alone on "
             "one row; held: the products' and the head's bytes; RSS added: what the loaded model adds.", "",
             "| code | T(1) best | T(1) median | head best | head median | held | RSS added (median) |",
             "|---|---|---|---|---|---|---|", *rows]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
