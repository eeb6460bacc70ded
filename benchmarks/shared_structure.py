"""A workload with shared structure through `specdecode serve`: requests that fill the same JSON
schema, sent one after another. Each request runs three ways on the same server, in turns: plain
decoding (gamma 0), prompt lookup and suffix drafting (gamma auto); the suffix draft's memory of
earlier outputs is the server's (one per draft, shared by its requests), so it sees only the
suffix runs of the requests before. Every output must equal the plain one.

    python benchmarks/shared_structure.py --requests 40 --out benchmarks/results/shared_structure.md
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
import time
from pathlib import Path

from openai import OpenAI

from specdecode.models.native import plan

from load_client import served
from record import publish

FIRST = ["Ada", "Ben", "Chloe", "Dmitri", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemi", "Luca"]
LAST = ["Moreau", "Okafor", "Svensson", "Tanaka", "Alvarez", "Novak", "Kowalski", "Haddad", "Byrne", "Rossi"]
CITIES = ["Lisbon", "Osaka", "Nairobi", "Toronto", "Krakow", "Austin", "Lyon", "Perth", "Bergen", "Quito"]
JOBS = ["nurse", "carpenter", "data analyst", "chef", "pilot", "teacher", "architect", "plumber", "editor"]


def prompts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
        out.append(
            f"{name} is {rng.randrange(22, 70)} years old, lives in {rng.choice(CITIES)} and works as a "
            f"{rng.choice(JOBS)}. Write this person as a JSON object with exactly these keys: \"name\", \"age\", "
            "\"city\", \"occupation\", \"email\" (make one up from the name), \"skills\" (a list of three). "
            "Answer with the JSON only.")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--first", type=int, default=5, help="how many first requests to report apart")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    methods = {"plain": dict(draft="lookup", gamma=0), "lookup": dict(draft="lookup", gamma="auto"),
               "suffix": dict(draft="suffix", gamma="auto")}
    rows = []  # (request, method, tokens, seconds, tokens per call)
    with served("--model-name", "smol", "--draft", "suffix", "--also-draft", "lookup") as (_, port, _command):
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        # warm-up, not timed: the server measures its verification curve for "auto" on first use
        client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Hello"}], max_tokens=8,
                                       extra_body={"specdecode": methods["lookup"]})
        for number, text in enumerate(prompts(args.requests)):
            outputs = {}
            for method, options in methods.items():
                start = time.perf_counter()
                reply = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": text}],
                                                       max_tokens=args.max_tokens, temperature=0,
                                                       extra_body={"specdecode": options})
                seconds = time.perf_counter() - start
                outputs[method] = reply.choices[0].message.content
                usage = reply.usage.model_extra["speculative"]
                rows.append((number, method, reply.usage.completion_tokens, seconds, usage["tokens_per_call"]))
            if len(set(outputs.values())) != 1:
                raise SystemExit(f"request {number}: the outputs differ: {outputs}")
            print(number, {m: f"{r[2] / r[3]:.0f} tok/s" for m, r in zip(methods, rows[-3:])}, file=sys.stderr)

    def rate(method: str, requests) -> tuple[float, float]:
        chosen = [r for r in rows if r[1] == method and r[0] in requests]
        return sum(r[2] for r in chosen) / sum(r[3] for r in chosen), statistics.mean(r[4] for r in chosen)

    groups = {f"first {args.first}": range(args.first), f"the other {args.requests - args.first}":
              range(args.first, args.requests), f"all {args.requests}": range(args.requests)}
    lines = [f"# {__doc__.splitlines()[0]}", "", "```", "python " + " ".join(sys.argv), "```", "",
             f"Machine: {plan.cpu_name()}, {platform.platform()}; kernel plan {plan.kernel_plan()[0]}; server: "
             "`specdecode serve --draft suffix --also-draft lookup` (embedded SmolLM2-135M-Instruct, the default "
             f"backend and precision: native, w4a8 where the kernels have integer products), greedy, at most "
             f"{args.max_tokens} tokens a request; tokens/s as the client saw them (HTTP included). Every "
             "output equal to the plain one.", "",
             "| requests | plain tok/s | lookup tok/s | suffix tok/s | lookup vs plain | suffix vs plain | "
             "tokens/call lookup | tokens/call suffix |", "|---|---|---|---|---|---|---|---|"]
    for name, requests in groups.items():
        (plain, _), (lookup, lookup_calls), (suffix, suffix_calls) = (rate(m, requests) for m in methods)
        lines.append(f"| {name} | {plain:.1f} | {lookup:.1f} | {suffix:.1f} | {lookup / plain:.2f}x | "
                     f"{suffix / plain:.2f}x | {lookup_calls:.2f} | {suffix_calls:.2f} |")
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
