"""What loading a model costs: seconds, and the resident memory it adds against its file's size.

Each model loads in a fresh process (nothing cached in memory from another), on the native backend
unless --backend says otherwise: RSS after importing torch and specdecode, then after the load (the
tokenizer included; not a KV cache), then after a prompt of up to 512 tokens and decode forwards of
1 and 8 tokens in a cache of `--positions` (its keys and values and the work buffers too); the
model's file size beside it. `--tree` runs another checkout's package (its `src/`),
so the same command measures before and after a change side by side.

    python benchmarks/load_memory.py --out benchmarks/results/load_memory.md
    python benchmarks/load_memory.py --tree /path/to/old/checkout MODEL.gguf
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from record import cpu_model, publish

CHILD = r"""
import json, sys, time
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
import torch
from specdecode.models.base import request_cache
from specdecode.models.load import load_model
before = rss()
start = time.perf_counter()
model = load_model(sys.argv[1], backend=sys.argv[2], choose_by_speed=False)
seconds, after = time.perf_counter() - start, rss()
positions = int(sys.argv[3])
cache = request_cache(model, positions)  # sized where the model sizes caches, else its own
prompt = torch.randint(0, model.vocab_size, (1, min(512, positions - 16)), generator=torch.Generator().manual_seed(0))
model.forward(prompt, cache, num_logits=1)
for k in (1, 8):
    model.forward(prompt[:, :k], cache, num_logits=k)
print(json.dumps({"seconds": seconds, "before": before, "after": after, "forwards": rss(), "model": repr(model)}))
"""


def measure(path: str, backend: str, tree: str | None, positions: int) -> dict:
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = str(Path(tree) / "src")
    done = subprocess.run([sys.executable, "-c", CHILD, path, backend, str(positions)], env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"loading {path} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    from specdecode.models.default import default_target_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="model files (default: the embedded model)")
    parser.add_argument("--backend", default="native")
    parser.add_argument("--tree", action="append", default=[], help="another checkout to measure beside this one")
    parser.add_argument("--positions", type=int, default=1024, help="the cache the forwards run in (default 1024)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    models = args.models or [str(default_target_path())]
    trees = [None, *args.tree]
    lines = ["# What loading a model costs: seconds, and the resident memory it adds", "", "```",
             "python benchmarks/load_memory.py " + " ".join(sys.argv[1:]), "```", "",
             f"Machine: {cpu_model()}, {platform.platform()}; each load in a fresh process (the file in the page "
             "cache: the second load of each is timed); RSS from /proc/self/status.", "",
             f"| model | file | code | load | RSS added | added / file | after forwards ({args.positions}-position cache) "
             "| loaded as |", "|---|---|---|---|---|---|---|---|"]
    for path in models:
        size = Path(path).stat().st_size
        for tree in trees:
            measure(path, args.backend, tree, args.positions)  # the file into the page cache, the kernels built
            r = measure(path, args.backend, tree, args.positions)
            added, forwards = r["after"] - r["before"], r["forwards"] - r["before"]
            lines.append(f"| {Path(path).name} | {size / 2**20:.0f} MiB | {tree or 'this checkout'} | "
                         f"{r['seconds']:.1f} s | {added / 2**20:.0f} MiB | {added / size:.2f} | "
                         f"{forwards / 2**20:.0f} MiB ({forwards / size:.2f}x) | {r['model']} |")
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
