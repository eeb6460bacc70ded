"""How far the native backend's quantised products (as `--dtype auto` runs them) are from exact
arithmetic on the same weights: next-token distributions over random tokens, the native backend in
float32 on the file's dequantised weights as the reference. Set beside `specdecode check --against
llama.cpp`, it tells which engine a disagreement comes from.

    python benchmarks/quantised_vs_exact.py FILE.gguf [...] --out benchmarks/results/quantised_vs_exact.md
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

from record import cpu_model, publish


def main() -> int:
    import torch

    from specdecode.models.native import load_native

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    tokens = torch.randint(0, 49000, (1, args.tokens), generator=torch.Generator().manual_seed(0))
    rows, plan = [], ""

    def logprobs(model):
        return torch.log_softmax(model.forward(tokens, model.new_cache(args.tokens + 1),
                                               num_logits=args.tokens)[0].double(), -1)

    for path in args.files:
        exact = logprobs(load_native(path, "float32", max_positions=args.tokens + 1))
        model = load_native(path, "auto", max_positions=args.tokens + 1)
        ours, plan = logprobs(model), model.kernel_plan
        kl = (exact.exp() * (exact - ours)).sum(-1).mean().item()
        agree = (exact.argmax(-1) == ours.argmax(-1)).double().mean().item()
        rows.append(f"| {Path(path).name} | {model.dtype} | {kl:.4f} | {agree:.3f} |")
        print(rows[-1], flush=True)
    lines = ["# The native backend's quantised products against exact arithmetic on the same weights", "", "```",
             "python benchmarks/quantised_vs_exact.py " + " ".join(sys.argv[1:]), "```", "",
             f"Machine: {cpu_model()}, {platform.platform()}; {plan}. {args.tokens} random tokens; the reference "
             "is the native backend in float32 on the file's dequantised weights.", "",
             "| file | products | mean KL (reference to ours) | argmax agreement |", "|---|---|---|---|", *rows]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
