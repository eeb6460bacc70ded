"""What speculation adds to each server at one client, per Spec-Bench category, paired per prompt:
`specdecode serve` with each of `--drafts` over itself with `--gamma 0`, and llama-server with a
`--spec-type` over itself without one.

All the servers run at once, idle but one. Every prompt goes to each of them in turn (the order
rotated prompt by prompt), through the same streamed `openai` client, greedy, so a slower spell of
a shared machine falls on a prompt's runs alike rather than on one configuration's whole run (as
a configuration-after-configuration run lets it). A server's gain on a prompt is its plain
configuration's latency over its speculative one's (the same text: each engine's plain and
speculative outputs are checked equal); a category's gain is its prompts' tokens over their summed
latencies, speculative over plain; "all" likewise over every prompt, with a 95% bootstrap interval
over prompts.

    PYTHON=.venv/bin/python ../shared/tools/llama-cpp-anchor.sh      # builds llama-server (once)
    .venv/bin/python benchmarks/speculation_gain.py --llama-bin <its folder> --per-category 4 \
        --out benchmarks/results/speculation_gain.md
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import openai
from record import SPEC_BENCH, bootstrap_interval, cpu_model, publish
from serve_vs_llama_server import free_port, llama_file, llama_server, one_request, running


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-bin", required=True, help="the folder holding llama-server")
    parser.add_argument("--prompts", default=str(SPEC_BENCH))
    parser.add_argument("--categories", nargs="*", default=None, help="default: every Spec-Bench category")
    parser.add_argument("--per-category", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--drafts", nargs="+", default=["lookup"], help="`specdecode serve --draft` of each "
                        "speculative configuration of ours")
    parser.add_argument("--spec-type", default="ngram-mod", help="llama-server's --spec-type")
    parser.add_argument("--format", default="q4_0", help="llama-server's file: q4_1 (shipped) or a requantisation")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", default="/tmp/serve_vs_llama_server")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    from specdecode.bench.prompts import load_prompts
    from specdecode.models.native.plan import kernel_plan

    work = Path(args.work)
    gguf = llama_file(args.format, work)
    prompts = load_prompts(args.prompts, args.categories, args.per_category)

    def ours(*extra):
        return lambda port: [sys.executable, "-m", "specdecode", "serve", "--port", str(port), "--model-name", "smol",
                             "--max-batch", "1", *extra]

    def theirs(spec):
        return lambda port: llama_server(Path(args.llama_bin), gguf, port, args.threads, 1, spec)

    llama = f"llama-server {args.format.upper()}"
    # every configuration: (name, its engine's plain configuration's name or None, the command on a port)
    configs = [("specdecode serve --gamma 0", None, ours("--gamma", "0")),
               *[(f"specdecode serve --draft {d}", "specdecode serve --gamma 0", ours("--draft", d)) for d in args.drafts],
               (f"{llama} plain", None, theirs(None)),
               (f"{llama} --spec-type {args.spec_type}", f"{llama} plain", theirs(args.spec_type))]
    runs = {name: [] for name, _, _ in configs}  # -> [(tokens, latency, text)] per prompt
    with ExitStack() as stack:
        clients = {}
        for i, (name, _, command) in enumerate(configs):
            port = free_port()
            stack.enter_context(running(command(port), port, work / f"gain-{i}.log"))
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
            one_request(client, "smol", "Say hello.", 8)  # warm-up, not counted
            clients[name] = client
        order = list(clients)
        for i, prompt in enumerate(prompts):
            shift = i % len(order)
            for name in order[shift:] + order[:shift]:
                r = one_request(clients[name], "smol", prompt.text, args.max_tokens)
                runs[name].append((r["tokens"], r["latency"], r["text"]))
            print(f"{i + 1}/{len(prompts)} {prompt.category}", flush=True)

    categories = list(dict.fromkeys(p.category for p in prompts))

    def rate(name, indices):
        return sum(runs[name][i][0] for i in indices) / sum(runs[name][i][1] for i in indices)

    def gain(name, plain, indices):
        return rate(name, indices) / rate(plain, indices)

    speculative = [(name, plain) for name, plain, _ in configs if plain is not None]
    plains = [name for name, plain, _ in configs if plain is None]
    every = range(len(prompts))
    lines = [f"Command: `python benchmarks/speculation_gain.py {' '.join(sys.argv[1:])}`", "",
             f"Host: {cpu_model()}, {args.threads} threads; our kernels: {kernel_plan()[0]}; {len(prompts)} Spec-Bench "
             f"prompts ({args.per_category} per category), chat template, greedy, max_tokens {args.max_tokens}, streamed "
             f"through the `openai` client, one at a time; every prompt to each of the {len(configs)} servers in turn "
             f"(the order rotated by prompt); {time.strftime('%Y-%m-%d')}.", "",
             "Each speculative configuration over its own server's plain one (tokens over summed latencies), then each "
             "plain configuration's tokens/s:", "",
             "| category (prompts) | " + " | ".join(name for name, _ in speculative) + " | "
             + " | ".join(plains) + " |", "|---" * (len(speculative) + len(plains) + 1) + "|"]
    for category in categories:
        indices = [i for i, p in enumerate(prompts) if p.category == category]
        cells = [f"{gain(name, plain, indices):.2f}x" for name, plain in speculative]
        cells += [f"{rate(name, indices):.1f}" for name in plains]
        lines.append(f"| {category} ({len(indices)}) | " + " | ".join(cells) + " |")
    cells = []
    for name, plain in speculative:
        low, high = bootstrap_interval(lambda ix: gain(name, plain, ix), len(prompts))
        cells.append(f"**{gain(name, plain, every):.2f}x** (95%: {low:.2f}-{high:.2f})")
    cells += [f"{rate(name, every):.1f}" for name in plains]
    lines.append("| all | " + " | ".join(cells) + " |")
    best = max(rate(name, every) for name, _, _ in configs if name.startswith(llama))
    same = {name: sum(a[2] == b[2] for a, b in zip(runs[plain], runs[name])) for name, plain in speculative}
    lines += ["", "Tokens/s over every prompt: " + ", ".join(
                  f"{name} {rate(name, every):.1f} ({rate(name, every) / best:.2f}x llama-server's best configuration)"
                  for name, _, _ in configs if not name.startswith(llama)) + ".",
              "Speculative text equal to the same server's plain text: "
              + ", ".join(f"{name} {same[name]}/{len(prompts)}" for name, _ in speculative) + "."]
    publish(lines, args.out)


if __name__ == "__main__":
    main()
