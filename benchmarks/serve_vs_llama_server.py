"""`specdecode serve` against llama.cpp's own `llama-server`, end to end over HTTP on 127.0.0.1.

The same Spec-Bench chat prompts go through the same client (the official `openai` package,
streamed, greedy, `max_tokens` 128) to each server in turn, one at a time (concurrency 1) and from
8 client threads (`llama-server -np 8`, `specdecode serve --max-batch 8`). Reported per server
configuration: tokens/s over the whole run (prompt processing included), time to first token and
per-request latency (p50, p99). llama-server runs the shipped Q4_1 file and the same model
requantised to Q4_0 (llama.cpp's fast x86 format) with llama-cpp-python's quantize API, plain and
with its model-free speculative types.

    PYTHON=.venv/bin/python ../shared/tools/llama-cpp-anchor.sh      # builds llama-server (once)
    .venv/bin/python benchmarks/serve_vs_llama_server.py --llama-bin <its folder> \
        --out benchmarks/results/serve_vs_llama_server.md

Every greedy output of ours is checked against the library's own decoding of the same prompt
(`specdecode.text.generate`) in this run: the server must give the library's text.
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import openai
from record import cpu_model, publish

CATEGORIES = ["writing", "reasoning", "coding", "translation", "summarization", "qa", "math_reasoning", "rag"]
SPEC_TYPES = ["ngram-simple", "ngram-mod", "ngram-cache"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running(command: list[str], port: int, log: Path):
    """A server process answering GET /health on `port`; stopped on exit."""
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 600
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"{command[0]} exited with {process.returncode}: see {log}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{command[0]} did not come up: see {log}")
                time.sleep(0.5)
            yield process
        finally:
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()


def one_request(client: openai.OpenAI, model: str, prompt: str, max_tokens: int) -> dict:
    """Stream one greedy chat request: text, completion tokens, time to first token, latency."""
    start = time.perf_counter()
    first, pieces, usage = None, [], None
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                            temperature=0, max_tokens=max_tokens, stream=True,
                                            stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if first is None:
                first = time.perf_counter() - start
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    latency = time.perf_counter() - start
    return dict(text="".join(pieces), tokens=usage.completion_tokens if usage else len(pieces),
                ttft=first if first is not None else latency, latency=latency)


def load(base: str, model: str, prompts: list[str], concurrency: int, max_tokens: int) -> dict:
    client = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=600)
    one_request(client, model, "Say hello.", 8)  # warm-up, not counted
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda p: one_request(client, model, p, max_tokens), prompts))
    wall = time.perf_counter() - start
    tokens = sum(r["tokens"] for r in results)
    q = lambda values, p: statistics.quantiles(values, n=100, method="inclusive")[p - 1]  # noqa: E731
    latencies, ttfts = [r["latency"] for r in results], [r["ttft"] for r in results]
    return dict(requests=len(results), tokens=tokens, wall=wall, tokens_per_second=tokens / wall,
                ttft_p50=statistics.median(ttfts), ttft_p99=q(ttfts, 99),
                latency_p50=statistics.median(latencies), latency_p99=q(latencies, 99),
                texts=[r["text"] for r in results])


def quantize(source: Path, kind: str, out: Path) -> Path:
    import llama_cpp

    if out.exists():
        return out
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind.upper()}")
    params.allow_requantize = True
    if llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), params) != 0:
        raise RuntimeError(f"quantizing {source} to {kind} failed")
    return out


def llama_server(binary: Path, model: Path, port: int, threads: int, slots: int, spec: str | None) -> list[str]:
    """llama-server's command line: `slots` parallel sequences with 4,096 positions each, no web page,
    plain or with a `--spec-type`."""
    command = [str(binary / "llama-server"), "-m", str(model), "--port", str(port), "--host", "127.0.0.1",
               "-t", str(threads), "-np", str(slots), "-c", str(4096 * slots), "--no-webui"]
    return command + (["--spec-type", spec] if spec else [])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-bin", required=True, help="the folder holding llama-server")
    parser.add_argument("--prompts", default=str(Path(__file__).parents[2] / "shared/data/spec_bench/question.jsonl"))
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--formats", nargs="*", default=["q4_1", "q4_0"], help="llama-server's files (q4_1: shipped)")
    parser.add_argument("--serve-args", default="", help="more arguments for `specdecode serve`, e.g. \"--prompt-rows 64\"")
    parser.add_argument("--ours", nargs="+", default=["lookup", "suffix"], help="drafts `specdecode serve` runs")
    parser.add_argument("--spec-types", nargs="+", default=SPEC_TYPES)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", default="/tmp/serve_vs_llama_server")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    from specdecode.bench.prompts import load_prompts
    from specdecode.models.default import default_target_path

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    shipped = default_target_path()
    prompts = [p.text for p in load_prompts(args.prompts, CATEGORIES, args.per_category)]
    files = {kind: shipped if kind == "q4_1" else quantize(shipped, kind, work / f"smollm2-{kind}.gguf")
             for kind in args.formats}
    rows, texts = [], {}

    def record(name: str, base: str, model: str, np_: int) -> None:
        for c in args.concurrency:
            if c > np_:
                continue
            asked = prompts if c == 1 else prompts * 2  # enough requests to keep c clients busy
            result = load(base, model, asked, c, args.max_tokens)
            texts[(name, c)] = result.pop("texts")
            rows.append(dict(server=name, concurrency=c, **result))
            print(f"{name:42s} c={c}: {result['tokens_per_second']:6.1f} tokens/s, TTFT p50 "
                  f"{result['ttft_p50'] * 1e3:.0f} ms, latency p50 {result['latency_p50']:.2f} s", flush=True)

    top = max(args.concurrency)
    for draft in args.ours:
        port = free_port()
        command = [sys.executable, "-m", "specdecode", "serve", "--port", str(port), "--model-name", "smol",
                   "--draft", draft, "--max-batch", str(max(top, 1)), "--max-queue", str(4 * top), *args.serve_args.split()]
        with running(command, port, work / f"serve-{draft}.log"):
            record(" ".join([f"specdecode serve --draft {draft}", *args.serve_args.split()]), f"http://127.0.0.1:{port}/v1",
                   "smol", top)
    for kind, path in files.items():
        for spec in [None, *args.spec_types]:
            for np_ in sorted({1, top}):
                port = free_port()
                command = llama_server(Path(args.llama_bin), path, port, args.threads, np_, spec)
                name = f"llama-server {kind.upper()} {spec or 'plain'}" + (f" -np {np_}" if np_ > 1 else "")
                with running(command, port, work / f"llama-{kind}-{spec}-{np_}.log"):
                    record(name, f"http://127.0.0.1:{port}/v1", "smol", np_ if np_ > 1 else 1)

    # the server's greedy text against the library's, prompt by prompt
    from specdecode import PromptLookupDrafter, SamplingParams
    from specdecode.models.load import load_model
    from specdecode.text import encode_chat, generate

    target = load_model(None)
    library, library_tokens = [], 0
    start = time.perf_counter()
    for p in prompts:  # timed as the server's requests are: prompt processing included
        steps = list(generate(target, encode_chat(target.tokenizer, [{"role": "user", "content": p}]),
                              PromptLookupDrafter(), params=SamplingParams(temperature=0), max_new_tokens=args.max_tokens))
        library.append("".join(s.accepted_text + s.target_text for s in steps))
        library_tokens += sum(len(s.step.tokens) for s in steps)
    library_rate = library_tokens / (time.perf_counter() - start)
    same = {name: sum(t == lib for t, lib in zip(texts[(name, 1)], library))
            for name, c in texts if c == 1 and name.startswith("specdecode")}

    lines = [f"Command: `{' '.join(['python', *sys.argv])}`", "",
             f"Machine: {cpu_model()}, {platform.platform()}, {args.threads} threads; ours: {target!r}, {target.kernel_plan}; "
             f"{len(prompts)} Spec-Bench prompts ({args.per_category} per category: {', '.join(CATEGORIES)}), "
             f"chat template, greedy, max_tokens {args.max_tokens}, streamed through the `openai` client; at "
             f"concurrency > 1 each prompt is sent twice", "",
             "| server | clients | requests | tokens | tokens/s | TTFT p50 | TTFT p99 | latency p50 | latency p99 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['server']} | {r['concurrency']} | {r['requests']} | {r['tokens']} | "
                     f"{r['tokens_per_second']:.1f} | {r['ttft_p50'] * 1e3:.0f} ms | {r['ttft_p99'] * 1e3:.0f} ms | "
                     f"{r['latency_p50']:.2f} s | {r['latency_p99']:.2f} s |")
    lines += ["", "Greedy text through `specdecode serve` equal to the library's `generate` of the same prompt: "
              + ", ".join(f"{name} {n}/{len(prompts)}" for name, n in same.items()),
              "", f"The library itself (`text.generate` with prompt lookup, one prompt after another in this process, "
              f"after the servers stopped): {library_tokens} tokens, {library_rate:.1f} tokens/s; "
              + ", ".join(f"{r['server']} at 1 client {r['tokens_per_second'] / library_rate:.2f}x of it"
                          for r in rows if r['concurrency'] == 1 and r['server'].startswith("specdecode"))]
    publish(lines, args.out)
    if args.out:
        Path(args.out).with_suffix(".json").write_text(json.dumps(dict(rows=rows, identical=same,
                                                                         library_tokens_per_second=library_rate), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
