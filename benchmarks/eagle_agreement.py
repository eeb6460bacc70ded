"""How well feature drafts follow the target on Spec-Bench answers, teacher-forced.

The embedded target answers Spec-Bench prompts greedily (`--per-category` of each category, after
the first three that `specdecode bench --per-category 3` times, so never the timed ones); one
forward over each prompt and answer gives the target's features. Each draft (`--drafts`, default
the shipped one) then reads the real pairs (f_t, x_{t+1}) over the whole sequence in PyTorch and,
at every answer position, is scored on its first drafted token: greedy agreement (its argmax is
the target's) and alpha at temperature 1, sum_x min(p, q) over the target's whole vocabulary
(Leviathan et al. 2023, Definition 3.1), with its head cut to each of `--head-tokens`.

    python benchmarks/eagle_agreement.py --out benchmarks/results/eagle_agreement.md
"""

from __future__ import annotations

import argparse
import json
import platform
from collections import defaultdict
from pathlib import Path

import torch

from specdecode.decode import autoregressive_decode
from specdecode.distill.eagle import first_step_scores
from specdecode.drafters.eagle import SHIPPED, head_rows
from specdecode.models.eagle import load_eagle
from specdecode.models.load import load_model
from specdecode.sampling import SamplingParams
from specdecode.prompts import encode_prompt
from record import SPEC_BENCH, cpu_model, publish

CATEGORIES = ["writing", "reasoning", "coding", "translation", "summarization", "qa", "math_reasoning", "rag"]


def answers(target, prompts: Path, per_category: int, tokens: int,
            layers: tuple[int, ...] = ()) -> list[tuple[str, int, list[int], torch.Tensor]]:
    """(category, prompt length, prompt + greedy answer, the target's features [T, (len(layers) + 1) D]:
    after each of `layers`, then the final norm) per prompt."""
    rows = [json.loads(line) for line in prompts.read_text().splitlines() if line.strip()]
    out = []
    for category in CATEGORIES:
        for row in [r for r in rows if r["category"] == category][3 : 3 + per_category]:
            prompt = encode_prompt(target.tokenizer, row["turns"][0])
            answer = [t for s in autoregressive_decode(target, prompt, params=SamplingParams(temperature=0),
                                                       max_new_tokens=tokens) for t in s.tokens]
            seq = prompt + answer
            cache = target.new_cache(len(seq) + 1)
            cache.keep_features(target.dim, layers)
            target.forward(torch.tensor([seq]), cache)
            out.append((category, len(prompt), seq, cache.features[: len(seq)].clone()))
    return out


@torch.no_grad()
def score(net, target, data, full_head: torch.Tensor, head_tokens: int,
          layers: tuple[int, ...] = ()) -> dict[str, tuple[float, float, int]]:
    """category (and "overall") -> (greedy agreement, alpha, answer positions); `data`'s features are
    those of `layers`, then the final norm."""
    D, parts = target.dim, [*(layers.index(n) for n in net.config.layers), len(layers)]  # the net's, in order
    columns = torch.cat([torch.arange(j * D, (j + 1) * D) for j in parts])
    kept = net.kept_ids[:head_tokens]
    head = full_head[kept]  # [N, D]
    sums = defaultdict(lambda: [0.0, 0.0, 0])
    for category, P, seq, feats in data:
        T = len(seq) - 1  # pairs t = 0 .. T-1 predict f_{t+1}; answer tokens are x_{P} .. x_T
        embeds = target.embedding(torch.tensor(seq[1 : T + 1])).float()[None]
        pred = net(embeds, net.fuse_features(feats[None, :T, columns]), target.cos[:T].float(),
                   target.sin[:T].float(), target.attention_scale)[0]
        pred = pred[P - 1 : T - 1]  # predictions of f_P .. f_{T-1}: q over x_{P+1} .. x_T
        agree, alpha = first_step_scores(pred, feats[P:T, -D:], full_head, head, kept)
        for key in (category, "overall"):
            sums[key][0] += agree
            sums[key][1] += alpha
            sums[key][2] += len(pred)
    return {k: (a / n, b / n, n) for k, (a, b, n) in sums.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafts", nargs="+", default=[str(SHIPPED)], help="feature draft directories")
    parser.add_argument("--head-tokens", type=int, nargs="+", default=[2048], help="head cuts to score")
    parser.add_argument("--prompts", default=str(SPEC_BENCH))
    parser.add_argument("--per-category", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=96, help="answer length")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    target = load_model(None, backend="native")
    nets = {path: load_eagle(path)[0] for path in args.drafts}
    layers = tuple(sorted({n for net in nets.values() for n in net.config.layers}))
    data = answers(target, Path(args.prompts), args.per_category, args.tokens, layers)
    full_head = head_rows(target, torch.arange(target.vocab_size))  # [V, D]
    lines = ["# Feature drafts against the target on Spec-Bench answers, teacher-forced", "", "```",
             "python benchmarks/eagle_agreement.py " + " ".join(
                 [f"--drafts {' '.join(args.drafts)}", f"--head-tokens {' '.join(map(str, args.head_tokens))}",
                  f"--per-category {args.per_category}", f"--tokens {args.tokens}"]), "```", "",
             f"Machine: {cpu_model()}, {platform.platform()}; target {target}; {len(data)} prompts (Spec-Bench "
             f"categories {', '.join(CATEGORIES)}, {args.per_category} each, after the first three), greedy answers "
             f"of up to {args.tokens} tokens. Each cell: first-step greedy agreement / alpha at temperature 1, "
             "over the answer positions.", "",
             "| draft | head tokens | overall | " + " | ".join(CATEGORIES) + " |",
             "|---|---|---|" + "---|" * len(CATEGORIES)]
    for path, net in nets.items():
        for n in sorted({min(n, net.config.kept) for n in args.head_tokens}, reverse=True):
            result = score(net, target, data, full_head, n, layers)
            cells = [f"{result[k][0]:.3f} / {result[k][1]:.3f}" for k in ["overall", *CATEGORIES]]
            lines.append(f"| {path} | {n} | " + " | ".join(cells) + " |")
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
