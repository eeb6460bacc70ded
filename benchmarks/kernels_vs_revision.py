"""The C kernels of the working tree against those of a git revision, on the embedded model, in turns.

Builds csrc/ as it is and as it was at `--rev` for the same kernel path, loads the embedded model
once (native backend) and runs it on each library in turn: first a check that both give the same
logits bit for bit (a prompt, then 8 tokens), then a 512-token prompt's prefill and whole forwards
T(k) of k new tokens at 256 cached positions, the libraries taking turns run by run (the machine's
speed drifts by minutes); best of `--runs`.

    python benchmarks/kernels_vs_revision.py --rev HEAD --out benchmarks/results/kernels_vs_revision.md
"""

from __future__ import annotations

import argparse
import ctypes
import platform
import subprocess
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

import torch

from specdecode.models.default import default_target_path
from specdecode.models.load import load_model
from specdecode.models.native import plan
from specdecode.models.native.kernels import CKernels
from record import cpu_model, publish

REPO = Path(__file__).resolve().parents[1]


def build(csrc: Path, path: str, out: Path) -> ctypes.CDLL:
    """csrc's C files compiled as the kernel plan compiles them for `path`."""
    flags = plan.COMMON_FLAGS + plan.path_flags(path) + ["-pthread"]
    subprocess.run([plan.c_compiler(), *flags, f"-I{csrc}", *map(str, sorted(csrc.glob("*.c"))), "-o", str(out),
                    "-lm"], check=True)
    return plan._bind(ctypes.CDLL(str(out)))


def csrc_at(rev: str, into: Path) -> Path:
    """The kernels' sources as they were at git revision `rev`, extracted under `into`."""
    where = plan.CSRC.relative_to(REPO)
    archive = subprocess.run(["git", "archive", rev, str(where)], cwd=REPO, capture_output=True, check=True).stdout
    tarfile.open(fileobj=BytesIO(archive)).extractall(into)
    return into / where


def use(model, lib) -> None:
    """Point the model's kernels (its products and head included) at `lib`."""
    kernels = CKernels(lib, model.heads, model.kv_heads, model.head_dim, model.compute_dtype, model.kernels.plan,
                       model.n_threads, model.kernels.scale)
    model.kernels = kernels
    for block in model.blocks:
        for name in ("qkv", "o", "gate_up", "down"):
            block[name].kernels = kernels
    model.head.kernels = kernels


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default="HEAD", help="the git revision whose csrc/ is the baseline")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    args.rev = subprocess.run(["git", "rev-parse", "--short", args.rev], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()  # the commit, as the record names it
    model = load_model(str(default_target_path()), backend="native")
    path, described = model.kernels.plan.path, f"{model}: {model.kernel_plan}"  # before `use` replaces its kernels
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        libs = {args.rev: build(csrc_at(args.rev, tmp), path, tmp / "old.so"),
                "working tree": build(plan.CSRC, path, tmp / "new.so")}
        torch.manual_seed(0)
        prompt = torch.randint(0, model.vocab_size, (1, 512))
        logits = {}
        for name, lib in libs.items():
            use(model, lib)
            cache = model.new_cache(1024)
            logits[name] = torch.cat([model.forward(prompt[:, :300], cache, num_logits=1),
                                      model.forward(prompt[:, 300:308], cache, num_logits=8)], 1)
        same = torch.equal(*logits.values())
        best = {name: {} for name in libs}
        for _ in range(args.runs):
            for name, lib in libs.items():
                use(model, lib)
                cache = model.new_cache(1024)
                start = time.perf_counter()
                model.forward(prompt, cache, num_logits=1)
                times = {"prefill": time.perf_counter() - start}
                for k in (1, 4, 8):
                    times[k] = 1e9
                    for _ in range(10):
                        cache.length = 256
                        start = time.perf_counter()
                        model.forward(prompt[:, :k], cache, num_logits=k)
                        times[k] = min(times[k], time.perf_counter() - start)
                for key, value in times.items():
                    best[name][key] = min(best[name].get(key, 1e9), value)

    lines = ["# The C kernels of the working tree against a git revision's, on the embedded model", "",
             "```", f"python benchmarks/kernels_vs_revision.py --rev {args.rev}" + (f" --runs {args.runs}" if args.runs != 5 else ""),
             "```", "",
             f"Machine: {cpu_model()}, {platform.platform()}; {described}; best of {args.runs} runs, "
             f"the libraries taking turns.", "",
             f"Logits bit-identical (a 300-token prompt, then 8 tokens): {'yes' if same else 'NO'}", "",
             "| kernels | prefill 512 tokens | T(1) | T(4) | T(8) | T(8)/T(1) |", "|---|---|---|---|---|---|"]
    for name, t in best.items():
        lines.append(f"| {name} | {512 / t['prefill']:.0f} tokens/s | {t[1] * 1e3:.2f} ms | {t[4] * 1e3:.2f} ms | "
                     f"{t[8] * 1e3:.2f} ms | {t[8] / t[1]:.2f} |")
    publish(lines, args.out)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
