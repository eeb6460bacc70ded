"""Structured outputs through HTTP: `specdecode serve` against llama.cpp's own `llama-server` on
the same prompts and JSON schemas (`structured.py`'s: extraction with strict schemas and forced
tool calls, sent as `response_format` json_schema), greedy, at 1 and 8 clients. Ours constrained
without speculation (`gamma` 0) and with it (prompt lookup, gamma auto); llama-server Q4_0 (its
fastest format here) plain and with `--spec-type ngram-mod`. Reports tokens/s and schema validity.

    python benchmarks/structured_vs_llama_server.py --llama-bin <llama.cpp build/bin> \\
        --out benchmarks/results/structured_vs_llama_server.md
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai

from record import cpu_model, publish
from serve_vs_llama_server import free_port, llama_file, llama_server, running
from structured import CASES, valid


def one(client: openai.OpenAI, model: str, schema: dict, prompt: str, max_tokens: int, extra: dict) -> dict:
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=max_tokens,
        response_format={"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": True}},
        extra_body=extra)
    text = reply.choices[0].message.content or ""
    try:
        ok = valid(json.loads(text), schema)
    except json.JSONDecodeError:
        ok = False
    return dict(tokens=reply.usage.completion_tokens, valid=ok)


def load(base: str, clients: int, max_tokens: int, extra: dict) -> dict:
    client = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=600)
    one(client, "smol", *CASES[0], 8, extra)  # warm-up, not counted
    asked = CASES if clients == 1 else CASES * 2
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda case: one(client, "smol", *case, max_tokens, extra), asked))
    wall = time.perf_counter() - start
    tokens = sum(r["tokens"] for r in results)
    return dict(requests=len(results), tokens=tokens, tokens_per_second=tokens / wall, wall=wall,
                valid=sum(r["valid"] for r in results))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-bin", required=True, help="the folder holding llama-server")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", default="/tmp/serve_vs_llama_server")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    work = Path(args.work)
    q4_0 = llama_file("q4_0", work)
    top, rows = max(args.clients), []

    def record(name: str, base: str, clients: list[int], extra: dict | None = None) -> None:
        for c in clients:
            result = load(base, c, args.max_tokens, extra or {})
            rows.append(dict(server=name, clients=c, **result))
            print(f"{name:48s} c={c}: {result['tokens_per_second']:6.1f} tokens/s, valid "
                  f"{result['valid']}/{result['requests']}", flush=True)

    port = free_port()
    command = [sys.executable, "-m", "specdecode", "serve", "--port", str(port), "--model-name", "smol",
               "--max-batch", str(top), "--max-queue", str(4 * top)]
    with running(command, port, work / "serve-structured.log"):
        base = f"http://127.0.0.1:{port}/v1"
        record("specdecode serve, schema, no speculation", base, args.clients, {"specdecode": {"gamma": 0}})
        record("specdecode serve, schema, lookup gamma auto", base, args.clients)
    for spec in (None, "ngram-mod"):
        for np_ in sorted({1, top}):
            port = free_port()
            command = llama_server(Path(args.llama_bin), q4_0, port, args.threads, np_, spec)
            with running(command, port, work / f"llama-structured-{spec}-{np_}.log"):
                record(f"llama-server Q4_0 {spec or 'plain'}" + (f" -np {np_}" if np_ > 1 else ""),
                       f"http://127.0.0.1:{port}/v1", [c for c in args.clients if (c > 1) == (np_ > 1)])

    lines = ["# Structured outputs through HTTP, against llama-server", "", "```",
             "python benchmarks/structured_vs_llama_server.py " + " ".join(sys.argv[1:]), "```", "",
             f"Machine: {cpu_model()}, {platform.platform()}, {args.threads} threads. {len(CASES)} prompts of "
             f"`benchmarks/structured.py` (extraction with strict JSON schemas, forced tool calls) as "
             f"`response_format` json_schema, greedy, max_tokens {args.max_tokens}, not streamed, through the "
             "`openai` client; at 8 clients each prompt is sent twice. Ours: the embedded SmolLM2 Q4_1 on the "
             "native backend; llama-server: the same model quantised to Q4_0.", "",
             "Wall: from the first request sent to the last reply; the servers write different numbers of "
             "tokens for the same schema (llama-server's grammar lets whitespace in), so both are given.", "",
             "| server | clients | requests | tokens | tokens/s | wall | valid |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['server']} | {r['clients']} | {r['requests']} | {r['tokens']} | {r['tokens_per_second']:.1f} | "
              f"{r['wall']:.2f} s | {r['valid']}/{r['requests']} |" for r in rows]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
