"""The feature draft's step against the target's, on the native kernels, in turns.

Loads the embedded target (native backend) and a feature draft (`--draft`, default the shipped
one), builds the draft with 4- and 8-bit weights, and times, taking turns run by run (the
machine's speed drifts): the target's step T(1) at 256 cached positions, and one draft step (one
new pair: fc, the layer, the norm, the cut head, the argmax) at 256 cached positions; best of
`--runs`. The goal the step is held to: at most 8% of a target step.

    python benchmarks/eagle_step.py --out benchmarks/results/eagle_step.md
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from specdecode.drafters.eagle import SHIPPED, FeatureDraft
from specdecode.models.default import default_target_path
from specdecode.models.eagle import load_eagle
from specdecode.models.load import load_model
from record import cpu_model, publish


def best_time(fn, calls: int) -> float:
    """The least mean seconds of `calls` calls, over 5 tries."""
    best = 1e9
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draft", default=str(SHIPPED), help="a feature draft directory (default: the shipped one)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    target = load_model(str(default_target_path()), backend="native")
    net, meta = load_eagle(args.draft)
    drafts = {bits: FeatureDraft(net, target, bits=bits) for bits in FeatureDraft.BITS}
    cache = target.new_cache(1024)
    target.forward(torch.randint(0, target.vocab_size, (1, 256)), cache)
    token = torch.tensor([[42]])

    def target_step() -> None:
        cache.length = 256
        target.forward(token, cache)

    caches = {bits: d.new_cache(1024) for bits, d in drafts.items()}
    feature, ids = torch.randn(1, target.dim), torch.tensor([42])

    def draft_step(bits: int) -> None:
        draft, c = drafts[bits], caches[bits]
        c.length = 256
        _, logits = draft.step(ids, feature, c)
        draft.kept_ids[logits[0].argmax()]

    best = {"target": 1e9, **{bits: 1e9 for bits in drafts}}
    for _ in range(args.runs):
        best["target"] = min(best["target"], best_time(target_step, 50))
        for bits in drafts:
            best[bits] = min(best[bits], best_time(lambda: draft_step(bits), 200))
    lines = ["# The feature draft's step against the target's", "", "```",
             f"python benchmarks/eagle_step.py" + (f" --draft {args.draft}" if args.draft != str(SHIPPED) else ""),
             "```", "", f"Machine: {cpu_model()}, {platform.platform()}; target {target}: {target.kernel_plan}; "
             f"draft: {net.config.kept} kept tokens, MLP width {net.config.hidden}; best of {args.runs} runs, "
             "taking turns.", "",
             "| step | time | / target step |", "|---|---|---|",
             f"| target T(1), 256 cached positions | {best['target'] * 1e3:.3f} ms | 1 |"]
    for bits in drafts:
        lines.append(f"| draft, {bits}-bit weights, 256 cached positions | {best[bits] * 1e3:.3f} ms | "
                     f"{best[bits] / best['target']:.3f} |")
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
