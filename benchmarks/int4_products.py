"""The native backend's two 4-bit product kernels, side by side in one process.

kernels.c's `q4_matmul` (bf16 dot products, weights unpacked once for up to 8 rows) and PyTorch's
`_weight_int4pack_mm_for_cpu`, on the embedded model's own 120 block products, then whole forwards
T(k) with each. The two take turns run by run (the machine's speed drifts).

    python benchmarks/int4_products.py --out benchmarks/results/int4_products.md
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from specdecode.models.native import kernels
from specdecode.models.load import load_model


def medians_ms(fns: list, repeats: int) -> list[float]:
    """Median wall time of each function, the functions taking turns at every repeat."""
    for fn in fns:
        fn()  # warm
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, spent in zip(fns, times):
            start = time.perf_counter()
            fn()
            spent.append(time.perf_counter() - start)
    return [statistics.median(t) * 1e3 for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--context", type=int, default=256, help="cached positions for the forwards")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    ours = load_model(None, backend="native")  # auto: the C kernel where this CPU has AVX512-BF16
    lib = kernels.load_library()
    if not getattr(ours.kernels, "q4", False):
        sys.exit("kernels.c's 4-bit product is not available here (needs a C compiler and AVX512-BF16)")
    available = lib.q4_available
    lib.q4_available = lambda: 0  # the same model with PyTorch's kernel
    try:
        theirs = load_model(None, backend="native")
    finally:
        lib.q4_available = available
    models = {"kernels.c q4_matmul": ours, "PyTorch int4pack": theirs}

    widths = dict(qkv=ours.dim, o=ours.heads * ours.head_dim, gate_up=ours.dim,
                  down=ours.blocks[0]["gate_up"].out_features // 2)
    inputs = {name: torch.randn(max(args.rows), width).bfloat16() for name, width in widths.items()}

    def products(model, rows):
        def run():
            for layer in model.blocks:
                for name, x in inputs.items():
                    layer[name](x[:rows])
        return run

    def forward(model, k):
        cache = model.new_cache()
        model.forward(torch.randint(0, model.vocab_size, (1, args.context)), cache)
        tokens = torch.randint(0, model.vocab_size, (1, k))

        def run():
            model.forward(tokens, cache)
            cache.trim(k)
        return run

    lines = [f"# {__doc__.splitlines()[0]}", "", "```", "python " + " ".join(sys.argv), "```", "",
             f"Machine: {platform.platform()}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
             f"medians of {args.repeats} runs, the two kernels taking turns run by run.", "",
             "The 120 block products of SmolLM2-135M (q|k|v, o, gate|up, down of 30 layers; each weight read "
             "once a pass):", "", "| rows | " + " | ".join(models) + " | ratio |", "|---|---|---|---|"]
    for rows in args.rows:
        a, b = medians_ms([products(m, rows) for m in models.values()], args.repeats)
        lines.append(f"| {rows} | {a:.2f} ms | {b:.2f} ms | {b / a:.2f}x |")
    # bytes a pass reads against what the machine reads at best (a sum over 512 MB, the same threads)
    nbytes = sum(t.numel() * t.element_size() for layer in ours.blocks for name in inputs
                 for t in (layer[name].packed, layer[name].coef))
    big = torch.ones(128 * 2 ** 20)
    sum_ms, one_row_ms = medians_ms([big.sum, products(ours, 1)], args.repeats)
    lines += ["", f"One row reads {nbytes / 1e6:.1f} MB (4-bit values and float32 group coefficients): "
              f"{nbytes / one_row_ms / 1e6:.1f} GB/s, while `torch.sum` over 512 MB reads "
              f"{big.numel() * 4 / sum_ms / 1e6:.1f} GB/s (the two taking turns)."]
    lines += ["", f"Whole forwards T(k) over k new tokens at {args.context} cached positions (LM head, attention "
              "and the rest included):", "", "| k | " + " | ".join(models) + " | ratio |", "|---|---|---|---|"]
    for k in args.rows:
        a, b = medians_ms([forward(m, k) for m in models.values()], args.repeats)
        lines.append(f"| {k} | {a:.2f} ms | {b:.2f} ms | {b / a:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
