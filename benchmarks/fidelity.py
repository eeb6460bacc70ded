"""How close each engine's next-token distributions are to the float32 reference.

The reference is transformers in float32 on the dequantised GGUF weights. For each prompt it
greedily writes an answer; every engine then reads prompt + answer (teacher-forced: the answer
after the prompt in one decode call, as a verification would) and the mean KL(reference || engine)
of the next-token distributions at the answer's positions is reported, with each engine's own
greedy answer's common prefix with the reference's (in tokens). The native precisions run in one
process beside llama.cpp on the same GGUF.

    python benchmarks/fidelity.py --paths avx512 avx2 --out benchmarks/results/fidelity.md
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
from pathlib import Path

import torch

from specdecode.bench.prompts import load_prompts
from specdecode.models.load import load_model
from specdecode.models.native import plan
from specdecode.prompts import encode_prompt

from kernel_paths import load_on_path
from record import SPEC_BENCH, publish

CATEGORIES = ["writing", "reasoning", "coding", "translation", "summarization", "qa", "math_reasoning", "rag"]


def distributions(model, prompt: list[int], answer: list[int]) -> torch.Tensor:
    """log-probabilities of the next token at the answer's positions: [len(answer), V]."""
    cache = model.new_cache()
    first = model.forward(torch.tensor([prompt]), cache, num_logits=1)[0]  # predicts answer[0]
    rest = model.forward(torch.tensor([answer[:-1]]), cache)[0] if len(answer) > 1 else first[:0]
    return torch.log_softmax(torch.cat([first, rest]).float(), dim=-1)


def greedy(model, prompt: list[int], n: int) -> list[int]:
    cache, out = model.new_cache(), []
    logits = model.forward(torch.tensor([prompt]), cache, num_logits=1)
    for _ in range(n):
        token = int(logits[0, -1].argmax())
        out.append(token)
        if token in model.eos_token_ids:
            break
        logits = model.forward(torch.tensor([[token]]), cache)
    return out


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=Path, default=SPEC_BENCH)
    parser.add_argument("--categories", nargs="+", default=CATEGORIES)
    parser.add_argument("--per-category", type=int, default=3)
    parser.add_argument("--answer-tokens", type=int, default=64)
    parser.add_argument("--dtypes", nargs="+", default=["int4", "w4a8", "float32"], help="native precisions")
    parser.add_argument("--paths", nargs="+", default=[plan.runnable_paths()[0]], help="native kernel paths")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(2)

    reference = load_model(None, backend="hf", dtype="float32")
    engines = {f"native {path} {d}": load_on_path(path, d) for path in args.paths for d in args.dtypes}
    engines["llama.cpp Q4_1"] = load_model(None, backend="llama.cpp", threads=2)
    prompts = load_prompts(args.prompts, args.categories, args.per_category)
    kl = {name: [] for name in engines}
    prefix = {name: [] for name in engines}
    identical = {name: 0 for name in engines}
    positions = 0
    for p in prompts:
        ids = encode_prompt(reference.tokenizer, p.text)
        answer = greedy(reference, ids, args.answer_tokens)
        ref = distributions(reference, ids, answer)
        positions += len(answer)
        for name, model in engines.items():
            log_q = distributions(model, ids, answer)
            kl[name].append((ref.exp() * (ref - log_q)).sum(-1).mean().item())
            own = greedy(model, ids, args.answer_tokens)
            prefix[name].append(common_prefix(answer, own))
            identical[name] += own == answer
        print(p.category, {n: round(v[-1], 5) for n, v in kl.items()}, {n: v[-1] for n, v in prefix.items()},
              file=sys.stderr)

    lines = [f"# {__doc__.splitlines()[0]}", "", "```", "python " + " ".join(sys.argv), "```", "",
             f"Machine: {plan.cpu_name()}, {platform.platform()}, 2 threads, torch {torch.__version__}. Reference: "
             f"transformers float32 on the dequantised {reference.name}; {len(prompts)} Spec-Bench prompts "
             f"({', '.join(args.categories)}; {args.per_category} each), {positions} answer positions "
             f"(answers of at most {args.answer_tokens} tokens, greedy by the reference).", "", "Engines:"]
    lines += [f"- {n}: {getattr(m, 'kernel_plan', m)}" for n, m in engines.items()]
    lines += ["", "| engine | mean KL(reference \\|\\| engine), nats | median over prompts | max | "
              "common greedy prefix (tokens, mean) | identical answers |", "|---|---|---|---|---|---|"]
    for name in engines:
        lines.append(f"| {name} | {statistics.mean(kl[name]):.5f} | {statistics.median(kl[name]):.5f} | "
                     f"{max(kl[name]):.5f} | {statistics.mean(prefix[name]):.1f} | {identical[name]}/{len(prompts)} |")
    publish(lines, args.out)


if __name__ == "__main__":
    main()
