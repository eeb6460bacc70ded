"""The native backend's kernel paths side by side in one process, with llama.cpp beside them.

Loads the embedded model once per kernel path this CPU runs (`SPECDECODE_KERNELS` forced: avx512,
avx2, portable, torch) and precision (`--dtypes`, e.g. int4 w4a8) and llama.cpp on the same GGUF, then times their 120 block products at 1-8
rows and whole forwards T(k) at 256 cached positions, the models taking turns run by run (the
machine's speed drifts by minutes).

    python benchmarks/kernel_paths.py --out benchmarks/results/kernel_paths_avx2.md
    python benchmarks/kernel_paths.py --paths avx2 --dtypes int4 w4a8 --out benchmarks/results/int8_activations_avx2.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from specdecode.models.load import load_model
from specdecode.models.native import plan
from specdecode.models.profile import SETTLE_SECONDS
from record import publish


FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16")


def medians_ms(fns: list, repeats: int) -> list[float]:
    """Median wall time of each function, the functions taking turns at every repeat (each after
    SETTLE_SECONDS: the last engine's idle threads stop spinning on the cores first)."""
    for fn in fns:
        fn()  # warm
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, spent in zip(fns, times):
            if len(fns) > 1:
                time.sleep(SETTLE_SECONDS)
            start = time.perf_counter()
            fn()
            spent.append(time.perf_counter() - start)
    return [statistics.median(t) * 1e3 for t in times]


def load_on_path(path: str, dtype: str = "auto"):
    os.environ[plan.ENV] = path
    try:
        return load_model(None, backend="native", dtype=dtype)
    finally:
        del os.environ[plan.ENV]


def forward(model, k: int, context: int):
    cache = model.new_cache()
    model.forward(torch.randint(0, 1000, (1, context)), cache, num_logits=1)
    tokens = torch.randint(0, 1000, (1, k))

    def run():
        model.forward(tokens, cache)
        cache.trim(k)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", nargs="+", default=None, help="kernel paths (default: all this CPU runs)")
    parser.add_argument("--dtypes", nargs="+", default=["auto"], help="native precisions (default: auto)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--context", type=int, default=256, help="cached positions for the forwards")
    parser.add_argument("--no-llamacpp", action="store_true", help="leave llama.cpp out")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(2)

    models = {}
    for path in args.paths or plan.runnable_paths():
        for dtype in args.dtypes:
            model = load_on_path(path, dtype)
            models[f"native {path} ({model.dtype})"] = model
    plans = [f"- native {m.kernels.plan.path}: {m.kernel_plan}" for m in models.values()]
    if not args.no_llamacpp:
        models["llama.cpp Q4_1"] = load_model(None, backend="llama.cpp", threads=2)
    names = list(models)

    lines = [f"# {__doc__.splitlines()[0]}", "", "```", "python " + " ".join(sys.argv), "```", "",
             f"Machine: {plan.cpu_name()} ({', '.join(f for f in FLAGS if f in plan.cpu_flags())}), "
             f"{platform.platform()}, 2 threads, torch {torch.__version__}; medians of {args.repeats} runs, "
             "the models taking turns run by run.", "", "Kernel plans:", *plans, "",
             f"Whole forwards T(k) in ms over k new tokens at {args.context} cached positions (T(k)/T(1) in brackets):",
             "", "| k | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    firsts = None
    for k in args.rows:
        times = medians_ms([forward(m, k, args.context) for m in models.values()], args.repeats)
        firsts = firsts or times
        lines.append(f"| {k} | " + " | ".join(f"{t:.2f} ({t / f:.2f})" for t, f in zip(times, firsts)) + " |")
    if not args.no_llamacpp:
        base = firsts[-1]
        lines += ["", "T(1) against llama.cpp's: " + ", ".join(f"{n} {t / base:.2f}x" for n, t in zip(names[:-1], firsts))]

    natives = [m for m in models.values() if hasattr(m, "blocks")]
    widths = dict(qkv=natives[0].dim, o=natives[0].heads * natives[0].head_dim, gate_up=natives[0].dim,
                  down=natives[0].blocks[0]["gate_up"].out_features // 2)
    inputs = {name: torch.randn(max(args.rows), width) for name, width in widths.items()}

    def products(model, rows):
        xs = {name: x[:rows].to(model.compute_dtype) for name, x in inputs.items()}

        def run():
            for layer in model.blocks:
                for name, x in xs.items():
                    layer[name](x)
        return run

    lines += ["", "The 120 block products alone (q|k|v, o, gate|up, down of 30 layers), ms:", "",
              "| rows | " + " | ".join(n for n, m in models.items() if hasattr(m, "blocks")) + " |",
              "|---" * (len(natives) + 1) + "|"]
    for rows in args.rows:
        times = medians_ms([products(m, rows) for m in natives], args.repeats)
        lines.append(f"| {rows} | " + " | ".join(f"{t:.2f}" for t in times) + " |")
    publish(lines, args.out)


if __name__ == "__main__":
    main()
