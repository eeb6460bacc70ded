"""The native backend's ragged batched forward against one forward per request: B requests of one
new row each (200 cached positions apiece), median of 7, on the kernel path $SPECDECODE_KERNELS
forces (the best one this CPU runs by default).

    SPECDECODE_KERNELS=avx2 python benchmarks/batch_forward.py --out benchmarks/results/batch_forward_avx2.md
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from specdecode.models.base import ForwardCall
from specdecode.models.default import default_target_path
from specdecode.models.native import load_native


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    target = load_native(default_target_path())
    caches = []
    for _ in range(max(args.batches)):
        cache = target.new_cache(300)
        target.forward(torch.randint(0, 1000, (1, 200)), cache, num_logits=1)
        caches.append(cache)
    rows = ["| B | forward_batch ms | B forwards ms | speedup |", "|---|---|---|---|"]
    for B in args.batches:
        batched, apart = [], []
        for _ in range(args.repeats):  # alternating, so a slow spell of the machine hits both
            start = time.perf_counter()
            target.forward_batch([ForwardCall(torch.tensor([[5]]), c, 1) for c in caches[:B]])
            batched.append(time.perf_counter() - start)
            for c in caches[:B]:
                c.trim(1)
            start = time.perf_counter()
            for c in caches[:B]:
                target.forward(torch.tensor([[5]]), c, num_logits=1)
            apart.append(time.perf_counter() - start)
            for c in caches[:B]:
                c.trim(1)
        b, a = 1000 * statistics.median(batched), 1000 * statistics.median(apart)
        rows.append(f"| {B} | {b:.1f} | {a:.1f} | {a / b:.2f}x |")
    cpu = subprocess.run(["sh", "-c", "lscpu | grep 'Model name' | sed 's/.*: *//'"], capture_output=True,
                         text=True).stdout.strip()
    text = (f"Command: `python benchmarks/{Path(__file__).name} {' '.join(sys.argv[1:])}`\n\n"
            f"Machine: {cpu}, {platform.platform()}; kernels: {target.kernel_plan}; "
            f"prompts row-invariant: {target.row_invariant_prompts}\n\n" + "\n".join(rows) + "\n")
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
