"""The native backend against llama.cpp's own `llama-bench` across model sizes and formats.

Random-weight Llama models of SmolLM2's shapes (0.1, 0.4 and 1.7 billion parameters; weights do not
change the time), written as F16 GGUFs and quantised by llama.cpp to each format
(`specdecode.bench.random_model`), are timed by `llama-bench` (2 threads: pp512, tg64) and by the
native backend in a process of its own: a 512-token prefill, and forwards of k = 1 and 8 new tokens
at 256 cached positions (best of `--runs`). The memory-bandwidth floor is the bytes a decode step
reads (the model's products and LM head as held) over the host's measured read bandwidth (a sum
over 1 GiB on all threads).

    python benchmarks/size_sweep.py --llama-bin <llama.cpp build/bin> --out benchmarks/results/size_sweep.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from record import cpu_model, publish

CHILD = r"""
import json, sys, time, torch
from specdecode.models.native import load_native
def rss():
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmRSS"))
path, runs = sys.argv[1], int(sys.argv[2])
before = rss()
start = time.perf_counter()
model = load_native(path, max_positions=1024)
load = time.perf_counter() - start
added = rss() - before
def held_bytes(product):  # a stacked product's parts each
    return sum(t.numel() * t.element_size() for part in getattr(product, "parts", [product])
               for t in vars(part).values() if isinstance(t, torch.Tensor))
held = sum(held_bytes(block[name]) for block in model.blocks for name in ("qkv", "o", "gate_up", "down"))
held += held_bytes(model.head)
tokens = torch.randint(0, model.vocab_size, (1, 512), generator=torch.Generator().manual_seed(0))
best = {"prefill": 1e9, 1: 1e9, 8: 1e9}
for _ in range(runs):
    cache = model.new_cache(1024)
    t = time.perf_counter(); model.forward(tokens, cache, num_logits=1); best["prefill"] = min(best["prefill"], time.perf_counter() - t)
    for k in (1, 8):
        for _ in range(5):
            cache.length = 256
            t = time.perf_counter(); model.forward(tokens[:, :k], cache, num_logits=k); best[k] = min(best[k], time.perf_counter() - t)
x = torch.randn(1, model.dim).to(model.compute_dtype)
head = 1e9
for _ in range(20):  # the LM head alone, one row: its share of T(1)
    t = time.perf_counter(); model.head(x); head = min(head, time.perf_counter() - t)
added = max(added, rss() - before)  # after the forwards: the cache and work buffers too
print(json.dumps({"model": repr(model), "plan": model.kernel_plan, "load": load, "bytes": held, "added": added,
                  "head": head, "prefill": 512 / best["prefill"], "t1": best[1], "t8": best[8]}))
"""


def bandwidth(threads: int) -> float:
    """Bytes a second the host reads: the best of 5 sums over a 1 GiB float32 tensor."""
    import torch

    torch.set_num_threads(threads)
    x = torch.ones(2 ** 28)
    x.sum()
    best = 1e9
    for _ in range(5):
        start = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - start)
    return x.numel() * 4 / best


def llama_bench(binary: Path, model: Path, threads: int) -> dict:
    """llama-bench's tokens/s for pp512 and tg64 (3 repetitions)."""
    done = subprocess.run([str(binary / "llama-bench"), "-m", str(model), "-t", str(threads), "-p", "512", "-n", "64",
                           "-r", "3", "-o", "json"], capture_output=True, text=True, check=True,
                          env={**os.environ, "LD_LIBRARY_PATH": str(binary)})
    results = json.loads(done.stdout)
    return {("pp" if r["n_prompt"] else "tg"): r["avg_ts"] for r in results}


def main() -> int:
    from specdecode.bench.random_model import SHAPES, quantize, write_shape

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-bin", required=True, help="the folder holding llama-bench")
    parser.add_argument("--sizes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--formats", nargs="+", default=["Q4_0", "Q4_K_M"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1,
                        help="llama-bench and the native backend in turns this many times, the best of each kept")
    parser.add_argument("--work", default="/tmp/size_sweep", help="where the model files are written (reused)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    work, binary = Path(args.work), Path(args.llama_bin)
    work.mkdir(parents=True, exist_ok=True)
    read = bandwidth(args.threads)
    rows = []
    for size in args.sizes:
        f16 = work / f"llama-{size}.F16.gguf"
        if not f16.exists():
            write_shape(f16, size)
        for fmt in args.formats:
            path = work / f"llama-{size}.{fmt}.gguf"
            if not path.exists():
                quantize(f16, fmt, path)
            theirs, ours = {}, {}
            for _ in range(args.rounds):  # the two take turns: this host's speed drifts by minutes
                bench = llama_bench(binary, path, args.threads)
                theirs = {k: max(v, theirs.get(k, 0)) for k, v in bench.items()}
                done = subprocess.run([sys.executable, "-c", CHILD, str(path), str(args.runs)], capture_output=True,
                                      text=True, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
                if done.returncode:
                    raise SystemExit(f"native on {path} failed:\n{done.stderr[-3000:]}")
                run = json.loads(done.stdout.strip().splitlines()[-1])
                ours = run if not ours else {**run, **{k: min(run[k], ours[k]) for k in ("load", "t1", "t8", "head")},
                                             "prefill": max(run["prefill"], ours["prefill"])}
            floor = ours["bytes"] / read
            tg = 1 / theirs["tg"]
            size_mib = path.stat().st_size / 2**20
            rows.append(f"| {size} | {fmt} | {size_mib:.0f} MiB | {ours['added'] / 2**20:.0f} MiB "
                        f"({ours['added'] / 2**20 / size_mib:.2f}x) | {ours['load']:.1f} s | "
                        f"{ours['t1'] * 1e3:.2f} ms | {tg * 1e3:.2f} ms | {ours['t1'] / tg:.2f} | {floor * 1e3:.2f} ms | "
                        f"{ours['t1'] / floor:.2f} | {ours['head'] / ours['t1']:.2f} | {ours['t8'] / ours['t1']:.2f} | "
                        f"{ours['prefill']:.0f} | "
                        f"{theirs['pp']:.0f} |")
            print(rows[-1], ours["model"], flush=True)
    lines = ["# The native backend against llama-bench across model sizes and formats", "", "```",
             "python benchmarks/size_sweep.py " + " ".join(sys.argv[1:]), "```", "",
             f"Machine: {cpu_model()}, {platform.platform()}, {args.threads} threads; native: {ours['plan']}; "
             f"measured read bandwidth {read / 1e9:.1f} GB/s; random-weight models of SmolLM2's shapes "
             f"(vocabulary 49152) and Llama 3.2's (vocabulary 128256, RoPE factors), F16 quantised by llama.cpp; "
             f"native best of {args.runs} runs, llama-bench "
             f"pp512 / tg64, 3 repetitions; the two in turns, {args.rounds} round(s), the best of each kept.", "",
             "T(1): one new token at 256 cached positions (llama-bench's tg: 1 / its tokens/s); floor: the bytes "
             "a decode step reads as held (products and LM head) over the read bandwidth; head: the LM head "
             "alone on one row, as a share of T(1); RSS added: the resident memory the loaded model adds "
             "(after the timed forwards: caches and buffers included), and its ratio to the file.", "",
             "| size | format | file | RSS added | native load | native T(1) | llama.cpp tg | T(1) / tg | floor | "
             "T(1) / floor | head / T(1) | T(8)/T(1) | native prefill tokens/s | llama.cpp pp512 tokens/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|", *rows]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
