"""The feature draft's step against the target's, on the native kernels, in turns.

Loads the embedded target (native backend) and a feature draft (`--draft`, default the shipped
one), builds the draft with 4- and 8-bit weights, and times, taking turns run by run (the
machine's speed drifts): the target's step T(1) at 256 cached positions, and one draft step (one
new pair: fc, the layer, the norm, the cut head, the argmax) at 256 cached positions, with the
head cut to `FeatureDraft.HEAD_TOKENS` and whole; best of `--runs`. The goal the step is held
to: at most 8% of a target step.

    python benchmarks/eagle_step.py --out benchmarks/results/eagle_step.md
"""

from __future__ import annotations

import argparse
import platform
import statistics
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
    cuts = sorted({FeatureDraft.HEAD_TOKENS, net.config.kept})
    drafts = {(bits, n): FeatureDraft(net, target, bits=bits, head_tokens=n) for bits in FeatureDraft.BITS
              for n in cuts}
    cache, tapped = target.new_cache(1024), target.new_cache(1024)
    tapped.keep_features(target.dim, net.config.layers)  # as the decode loop's, drafting with this net
    prompt = torch.randint(0, target.vocab_size, (1, 256))
    target.forward(prompt, cache)
    target.forward(prompt, tapped)
    token = torch.tensor([[42]])

    def target_step(c=cache) -> None:
        c.length = 256
        target.forward(token, c)

    caches = {kind: d.new_cache(1024) for kind, d in drafts.items()}
    feature, index = torch.randn(1, target.dim), torch.tensor([42])
    real = tapped.features[255:256]  # the target's features at a real position, as a catch-up pair reads them

    def draft_step(bits: int, n: int, tree: bool | str) -> None:
        """One drafted token as EagleDrafter.propose drafts it greedily: the pair (the last prediction,
        the kept token drawn), its logits, and the next token (and its q, for a tree's reach); or with
        tree "catch-up", the proposal's first: one real pair (the target's features, fused where the net
        reads layers, and a target id)."""
        draft, c = drafts[bits, n], caches[bits, n]
        c.length = 256
        if tree == "catch-up":
            _, logits = draft.step(index, real, c)
        else:
            _, logits = draft.step(index, feature, c, kept=True)
        if tree is True:
            float(torch.softmax(logits[0], -1).max(0).values)
        draft.kept_ids[logits[0].max(0).indices.view(1)]

    def after_target(bits: int, n: int, tree: bool, calls: int = 50) -> float:
        """The median draft step right after a target step (whose weights evict the draft's, as in the
        decode loop), the draft step alone on the clock."""
        times = []
        for _ in range(calls):
            target_step(tapped)
            start = time.perf_counter()
            draft_step(bits, n, tree)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    kinds = [(bits, n, tree) for bits, n in drafts for tree in (False, True, "catch-up")]
    best = {"target": 1e9, "tapped": 1e9, **{kind: 1e9 for kind in kinds}, **{("loop", *kind): 1e9 for kind in kinds}}
    for _ in range(args.runs):
        best["target"] = min(best["target"], best_time(target_step, 50))
        best["tapped"] = min(best["tapped"], best_time(lambda: target_step(tapped), 50))
        for kind in kinds:
            best[kind] = min(best[kind], best_time(lambda: draft_step(*kind), 200))
            best["loop", *kind] = min(best["loop", *kind], after_target(*kind))
    lines = ["# The feature draft's step against the target's", "", "```",
             f"python benchmarks/eagle_step.py" + (f" --draft {args.draft}" if args.draft != str(SHIPPED) else ""),
             "```", "", f"Machine: {cpu_model()}, {platform.platform()}; target {target}: {target.kernel_plan}; "
             f"draft: {net.config.kept} kept tokens, MLP width {net.config.hidden}, reading the features of "
             f"layers {list(net.config.layers)} and the final norm; best of {args.runs} runs, taking turns.", "",
             "| step | alone | / target step | after a target step | / target step |", "|---|---|---|---|---|",
             f"| target T(1), 256 cached positions | {best['target'] * 1e3:.3f} ms | 1 | | |",
             f"| target T(1), keeping the features the draft reads | {best['tapped'] * 1e3:.3f} ms | "
             f"{best['tapped'] / best['target']:.3f} | | |"]
    for kind in kinds:
        bits, n, tree = kind
        loop = best["loop", *kind]
        shape = {False: "chain", True: "tree", "catch-up": "catch-up pair"}[tree]
        lines.append(f"| draft, {bits}-bit weights, head of {n} tokens, {shape} | "
                     f"{best[kind] * 1e3:.3f} ms | {best[kind] / best['target']:.3f} | "
                     f"{loop * 1e3:.3f} ms | {loop / best['target']:.3f} |")
    lines += ["", "A drafted token: the draft's step over one new pair (fc over the kept token's embedding and "
              "the predicted features, the layer, the norm, the cut head) and the argmax; a tree's also takes q's "
              "top probability for the chain's reach; a catch-up pair is a proposal's first, over the target's "
              "own features (fused, for a draft that reads layers). Alone: draft steps back to back (its weights "
              "stay in the "
              "caches). After a target step: the median of 50 draft steps each timed right after a target step "
              "(the target's weights have evicted the draft's, as in the decode loop), best of the runs."]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
