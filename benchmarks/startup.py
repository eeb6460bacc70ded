"""Start-up time of the CLI, warm (caches filled): `specdecode --help`, and `specdecode generate` on
the embedded model, to its first token on stdout and to the end of the process (one new token),
with the part of it that importing torch alone takes in a fresh interpreter.

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


def wall(command: list[str], runs: int) -> tuple[list[float], list[float]]:
    """Seconds to the first byte on stdout, and to the process's end, of each run."""
    first, end = [], []
    for _ in range(runs):
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=ENV)
        process.stdout.read(1)
        first.append(time.perf_counter() - start)
        process.stdout.read()
        if process.wait():
            raise SystemExit(f"{command} failed")
        end.append(time.perf_counter() - start)
    return first, end


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
    rows = [f"| python -c 'import torch' | all | {fmt(wall([sys.executable, '-c', 'import torch'], args.runs)[1])} |"]
    for tree, root in trees.items():
        cli = [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(root / 'src')!r}); "
                                     "from specdecode.cli import main; sys.exit(main())"]
        subprocess.run([*cli, "generate", "--max-new-tokens", "1", "Hi"], check=True, capture_output=True,
                       env=ENV)  # warm
        rows.append(f"| specdecode --help | {tree} | {fmt(wall([*cli, '--help'], args.runs)[1])} |")
        first, end = wall([*cli, "generate", "--max-new-tokens", "1", "Hi"], args.runs)
        rows.append(f"| specdecode generate --max-new-tokens 1 Hi, to the first token | {tree} | {fmt(first)} |")
        rows.append(f"| specdecode generate --max-new-tokens 1 Hi, to the process's end | {tree} | {fmt(end)} |")
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
