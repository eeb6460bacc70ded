"""The resident memory a native model adds, against its file, for this checkout and an earlier one.

Each (file, source tree) runs in a process of its own: torch imported, then the model loaded with a
1,024-position context (RSS read: "loaded"), then a 512-token prompt and decode forwards of 1 and 8
tokens (RSS read again: "after forwards", the cache and work buffers included). Memory does not
depend on the machine's load, unlike time.

    python benchmarks/model_memory.py FILE.gguf [...] --baseline <checkout of an earlier commit>/src \
        --out benchmarks/results/model_memory.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from record import cpu_model, publish

CHILD = r"""
import json, sys, torch
from specdecode.models.native import load_native
def rss():
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmRSS"))
before = rss()
model = load_native(sys.argv[1], max_positions=1024)
loaded = rss() - before
tokens = torch.randint(0, model.vocab_size, (1, 512), generator=torch.Generator().manual_seed(0))
cache = model.new_cache(1024)
model.forward(tokens, cache, num_logits=1)
for k in (1, 8):
    cache.length = 256
    model.forward(tokens[:, :k], cache, num_logits=k)
print(json.dumps({"loaded": loaded, "after": rss() - before}))
"""


def measure(path: Path, tree: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, env=env,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--baseline", type=Path, default=None, help="an earlier checkout's src/ to compare with")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    trees = {"this checkout": Path(__file__).resolve().parents[1] / "src"}
    if args.baseline is not None:
        trees = {"baseline": args.baseline, **trees}
    mib = 2 ** 20
    lines = ["# The resident memory a native model adds", "", "```", "python benchmarks/model_memory.py "
             + " ".join(sys.argv[1:]), "```", "", f"Machine: {cpu_model()}. RSS added over a process that has "
             "imported torch: after the load (1,024-position context), and after a 512-token prompt and decode "
             "forwards (its cache and work buffers too); the ratio is to the file's size.", "",
             "| file | file size | tree | loaded | after forwards |", "|---|---|---|---|---|"]
    for path in args.files:
        size = path.stat().st_size
        for name, tree in trees.items():
            m = measure(path, tree)
            lines.append(f"| {path.name} | {size / mib:.0f} MiB | {name} | {m['loaded'] / mib:.0f} MiB "
                         f"({m['loaded'] / size:.2f}x) | {m['after'] / mib:.0f} MiB ({m['after'] / size:.2f}x) |")
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
