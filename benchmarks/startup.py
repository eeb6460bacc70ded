"""Start-up time of the CLI, warm (caches filled): `specdecode --help`, and `specdecode generate` on
the embedded model to its first token (one new token, the whole process), with the part of it that
importing torch alone takes in a fresh interpreter.

    python benchmarks/startup.py [--tree <a checkout of an earlier revision>] --out benchmarks/results/startup.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from record import cpu_model, publish

# as a user's Python runs: compiled bytecode written once and read after (an environment that sets
# PYTHONDONTWRITEBYTECODE recompiles the package at every start)
ENV = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}


def wall(command: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, env=ENV)
        times.append(time.perf_counter() - start)
    return times


def fmt(times: list[float]) -> str:
    return f"{statistics.median(times):.2f} s | {min(times):.2f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tree", default=None, help="a checkout of an earlier revision to time beside this one")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    trees = {"this checkout": Path(__file__).parents[1]}
    if args.tree:
        revision = subprocess.run(["git", "-C", args.tree, "rev-parse", "--short", "HEAD"], capture_output=True,
                                  text=True).stdout.strip()
        trees[f"a checkout of {revision} (before)"] = Path(args.tree)
    rows = [f"| python -c 'import torch' | all | {fmt(wall([sys.executable, '-c', 'import torch'], args.runs))} |"]
    for tree, root in trees.items():
        cli = [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(root / 'src')!r}); "
                                     "from specdecode.cli import main; sys.exit(main())"]
        subprocess.run([*cli, "generate", "--max-new-tokens", "1", "Hi"], check=True, capture_output=True,
                       env=ENV)  # warm
        for name, rest in (("specdecode --help", ["--help"]),
                           ("specdecode generate --max-new-tokens 1 Hi (to the first token)",
                            ["generate", "--max-new-tokens", "1", "Hi"])):
            rows.append(f"| {name} | {tree} | {fmt(wall([*cli, *rest], args.runs))} |")
    from specdecode.models.native.plan import kernel_plan

    lines = ["# Start-up time of the CLI, warm", "", "```", "python benchmarks/startup.py " + " ".join(sys.argv[1:]),
             "```", "", f"Machine: {cpu_model()}, {platform.platform()}; kernel path: {kernel_plan()[0]}; "
             f"{args.runs} runs each, whole processes, after one run that fills the caches (bytecode "
             "included).", "",
             "| command | code | median | best |", "|---|---|---|---|", *rows]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
