"""What the speculative loop costs on top of plain decoding when speculation does not pay, on the
llama.cpp backend (a ~6 ms step, so per-step bookkeeping shows) or `--backend native`, side by side
with the same loop and prompt lookup as of an older commit.

Methods, interleaved per repeat on one prompt, or on the first Spec-Bench prompt of each of
`--spec-bench N` categories (greedy and temperature 1, 128 new tokens, seeded per prompt):
plain decoding; speculative decoding with gamma fixed at 0 (nothing is ever verified); adaptive
gamma with prompt lookup (speculation on only where the cost model says it pays; learning T(k) from its calls, as
`--gamma auto` does). "old" rows load
`decode.py` and `drafters/lookup.py` from `--old REV` with `git show`.

    python benchmarks/loop_overhead.py --old 09f826b --out benchmarks/results/loop_overhead.md
    python benchmarks/loop_overhead.py --backend native --spec-bench 8 --repeats 1
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specdecode import AdaptiveGamma, PromptLookupDrafter, SamplingParams, autoregressive_decode, encode_prompt
from specdecode.analysis.measure import profile_model
from specdecode.decode import speculative_decode
from specdecode.bench.prompts import load_prompts
from specdecode.models.load import load_model
from record import SPEC_BENCH, cpu_model, publish

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Write a short story about a robot who learns to paint."


def old_module(rev: str, path: str, name: str, folder: Path):
    """A module of this package as of `rev`, importable beside the current one."""
    source = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    package = "specdecode." + ".".join(Path(path).parent.parts[2:])  # src/specdecode/x/y.py -> specdecode.x
    file = folder / f"{name}.py"
    file.write_text(source)
    spec = importlib.util.spec_from_file_location(f"{package.rstrip('.')}._old_{name}", file)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = package.rstrip(".")
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", default=None, help="a commit whose decode loop and prompt lookup run side by side")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--backend", default="llama.cpp", choices=["llama.cpp", "native"])
    ap.add_argument("--spec-bench", type=int, default=0, metavar="N",
                    help="the first Spec-Bench prompt of each of N categories in place of the one prompt")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    target = load_model(None, args.backend, threads=2)
    texts = [p.text for p in load_prompts(SPEC_BENCH, per_category=1)[: args.spec_bench]] or [PROMPT]
    prompts = [encode_prompt(target.tokenizer, text) for text in texts]
    ratios = profile_model(target, max_k=8, context=64, repeats=3).verify_ratios
    loops = {"": (speculative_decode, PromptLookupDrafter)}
    if args.old:
        with tempfile.TemporaryDirectory() as folder:
            old_decode = old_module(args.old, "src/specdecode/decode.py", "decode", Path(folder))
            old_lookup = old_module(args.old, "src/specdecode/drafters/lookup.py", "lookup", Path(folder))
        loops["old "] = (old_decode.speculative_decode, old_lookup.PromptLookupDrafter)

    lines = [f"Command: `python benchmarks/loop_overhead.py {' '.join(sys.argv[1:])}`", "",
             f"Machine: {cpu_model()}. Target {target.name} on {args.backend}, 2 threads; "
             + (f"prompt {PROMPT!r}" if len(prompts) == 1 else f"{len(prompts)} Spec-Bench prompts (one a category)")
             + f", 128 new tokens; median tokens/s over {args.repeats} interleaved repeats.", "",
             "| temperature | method | tokens/s | vs plain |", "|---|---|---|---|"]
    for temperature in (0.0, 1.0):
        params = SamplingParams(temperature=temperature)
        runs = {"plain": lambda ids, seed: autoregressive_decode(target, ids, params=params, max_new_tokens=128,
                                                                 seed=seed)}
        for tag, (loop, lookup) in loops.items():
            runs[f"{tag}gamma 0"] = lambda ids, seed, loop=loop, lookup=lookup: loop(
                target, lookup(), ids, gamma=0, params=params, max_new_tokens=128, seed=seed)
            runs[f"{tag}gamma auto, lookup"] = lambda ids, seed, loop=loop, lookup=lookup: loop(
                target, lookup(), ids, gamma=AdaptiveGamma(ratios, learn_curve=True), params=params, max_new_tokens=128,
                seed=seed)
        rates = {name: [] for name in runs}
        for _ in range(args.repeats):
            totals = {name: [0, 0.0] for name in runs}  # tokens, seconds over the prompts
            for seed, ids in enumerate(prompts):
                for name, run in runs.items():
                    start = time.perf_counter()
                    totals[name][0] += sum(len(step.tokens) for step in run(ids, seed))
                    totals[name][1] += time.perf_counter() - start
            for name, (n, seconds) in totals.items():
                rates[name].append(n / seconds)
        plain = statistics.median(rates["plain"])
        for name, values in rates.items():
            rate = statistics.median(values)
            lines.append(f"| {temperature:g} | {name} | {rate:.1f} | {rate / plain:.3f}x |")
    publish(lines, args.out)


if __name__ == "__main__":
    main()
