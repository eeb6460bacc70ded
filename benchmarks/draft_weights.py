"""The shipped draft network with int8 weights against its own float ones, side by side in one run:
milliseconds a proposal inside the decode loop (the target's steps in between evict the draft's
weights from the caches, which is what a draft step pays for), tokens per call and alpha, with the
embedded target on the native backend at a fixed gamma.

    python benchmarks/draft_weights.py --out benchmarks/results/draft_weights.md
"""

from __future__ import annotations

import argparse
import copy
import platform
import time

import torch
from torch import nn

from specdecode import ModelDrafter, SamplingParams, encode_prompt, speculative_decode
from specdecode.bench.prompts import load_prompts
from specdecode.models.default import trained_draft_path
from specdecode.models.draftnet import DraftNetModel, load_draftnet
from specdecode.models.load import load_model
from specdecode.models.native.plan import cpu_name
from record import SPEC_BENCH, publish

CATEGORIES = ["writing", "reasoning", "coding", "translation", "summarization", "qa", "math_reasoning", "rag"]


class Bf16Linear(nn.Module):
    """A float32 stream through a bf16 copy of a linear layer (the draft's output head before int8)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.linear = linear.to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.bfloat16()).float()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", default=str(SPEC_BENCH))
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--gamma", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2, help="each variant runs every prompt this many times, "
                                                             "the variants in turn")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    target = load_model(backend="native")
    loaded = load_draftnet(trained_draft_path(), weights="float")
    drafts = {w: DraftNetModel(loaded.net, loaded.tokenizer, loaded.name, loaded.vocab, loaded.eos_token_ids,
                               weights=w) for w in ("int8", "float")}
    drafts["float, bf16 head"] = DraftNetModel(copy.deepcopy(loaded.net), loaded.tokenizer, loaded.name, loaded.vocab,
                                               loaded.eos_token_ids, weights="float")
    drafts["float, bf16 head"].net.head = Bf16Linear(drafts["float, bf16 head"].net.head)
    prompts = [encode_prompt(target.tokenizer, p.text)
               for p in load_prompts(args.questions, CATEGORIES, args.per_category)]
    totals = {w: dict(proposals=0, seconds=0.0, calls=0, tokens=0, proposed=0, accepted=0, betas=[]) for w in drafts}
    for temperature in (0.0, 1.0):
        for _ in range(args.rounds):
            for prompt in prompts:
                for weights, draft in drafts.items():  # in turn: all see the same machine state
                    t = totals[weights]
                    for step in speculative_decode(target, ModelDrafter(draft), prompt, gamma=args.gamma,
                                                   params=SamplingParams(temperature=temperature),
                                                   max_new_tokens=args.max_new_tokens, seed=0):
                        if step.proposed or step.draft_seconds:
                            t["proposals"] += 1
                            t["seconds"] += step.draft_seconds
                        t["calls"] += 1
                        t["tokens"] += len(step.tokens)
                        t["proposed"] += len(step.proposed)
                        t["accepted"] += step.num_accepted
                        t["betas"] += step.betas
    lines = [
        "# The shipped draft network: int8 weights against float (and the bf16 output head it had before)",
        "",
        "```",
        f"python benchmarks/draft_weights.py --per-category {args.per_category} --gamma {args.gamma} "
        f"--max-new-tokens {args.max_new_tokens} --rounds {args.rounds}" + (f" --out {args.out}" if args.out else ""),
        "```",
        "",
        f"Machine: {cpu_name()}, {platform.platform()}, torch {torch.__version__} "
        f"(kernel dispatch {torch.backends.cpu.get_cpu_capability()}), {torch.get_num_threads()} threads; "
        f"target {target.name} on the native backend ({target.kernel_plan}); draft {loaded.name}; "
        f"{len(prompts)} Spec-Bench prompts, greedy and temperature 1, {args.rounds} rounds each, gamma {args.gamma}.",
        "",
        "| draft weights | proposals | ms a proposal | tokens/call | draft tokens accepted | alpha |",
        "|---|---|---|---|---|---|",
    ]
    for weights, t in totals.items():
        alpha = sum(t["betas"]) / max(1, len(t["betas"]))
        lines.append(f"| {weights} | {t['proposals']} | {1e3 * t['seconds'] / max(1, t['proposals']):.3f} | "
                     f"{t['tokens'] / max(1, t['calls']):.3f} | {t['accepted']}/{t['proposed']} | {alpha:.3f} |")
    publish(lines, args.out)


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"({time.perf_counter() - start:.0f} s)")
