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

Per Spec-Bench category, each speculative configuration's tokens/s at one client over its own plain
configuration's in the same run (`specdecode serve --gamma 0`; llama-server without `--spec-type`):
what speculation adds to each server. With `--rounds R` every configuration runs R times, in an
order rotated each round, each time in a freshly started server (a prompt it has seen would hit its
prefix cache and its memory of earlier outputs): a slowdown of a shared machine then falls on all
of them alike. Tokens and times are summed over the rounds. With `--passes P` each started server
gets the one-client prompt set P times: a later pass repeats requests it has served (a drafter that
remembers earlier outputs, ours `pool` and `auto` or llama-server's `ngram-mod`, drafts them back;
each server's prefix or prompt cache also helps its plain configuration).
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
from record import SPEC_BENCH, cpu_model, publish

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
    # (one request's text, completion tokens, time to first token and latency)
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
                texts=[r["text"] for r in results],
                per_request=[(r["tokens"], r["latency"], r["ttft"]) for r in results])


def merge(runs: list[dict]) -> dict:
    """One configuration's rounds as one run: tokens and seconds summed, percentiles over all requests."""
    if len(runs) == 1:
        return runs[0]
    q = lambda values, p: statistics.quantiles(values, n=100, method="inclusive")[p - 1]  # noqa: E731
    latencies = [lat for r in runs for _, lat, _ in r["per_request"]]
    ttfts = [t for r in runs for _, _, t in r["per_request"]]
    tokens, wall = sum(r["tokens"] for r in runs), sum(r["wall"] for r in runs)
    return dict(requests=sum(r["requests"] for r in runs), tokens=tokens, wall=wall, tokens_per_second=tokens / wall,
                ttft_p50=statistics.median(ttfts), ttft_p99=q(ttfts, 99), latency_p50=statistics.median(latencies),
                latency_p99=q(latencies, 99), rounds=[r["tokens_per_second"] for r in runs])


def per_category(runs: list[dict], categories: list[str]) -> dict[str, float]:
    """category -> tokens/s at one client over a configuration's rounds: its requests' tokens over
    their latencies (one at a time, so the latencies add up to the time they took)."""
    tokens, seconds = {}, {}
    for run in runs:
        for category, (n, latency, _) in zip(categories, run["per_request"]):
            tokens[category] = tokens.get(category, 0) + n
            seconds[category] = seconds.get(category, 0.0) + latency
    rates = {c: tokens[c] / seconds[c] for c in tokens}
    rates["all"] = sum(tokens.values()) / sum(seconds.values())
    return rates


def gains_table(ones: dict[str, dict[str, float]], plain_of: dict[str, str | None], categories: list[str],
                counts: dict[str, int]) -> list[str]:
    """The per-category report at one client: each plain configuration's tokens/s, and each speculative
    one's over its own plain (its tokens/s in brackets); "all" is the whole set (tokens over seconds)."""
    names = [n for n in ones if plain_of.get(n) in ones or plain_of.get(n) is None]
    if not any(plain_of.get(n) for n in names):
        return []
    lines = ["", "At one client, per category: tokens/s of each plain configuration, and what speculation adds to "
             "each server (its tokens/s over its own plain configuration's in this run)", "",
             "| category (prompts) | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for category in [*categories, "all"]:
        cells = []
        for name in names:
            rate = ones[name].get(category) if category != "all" else ones[name]["all"]
            plain = plain_of.get(name)
            base = None if plain is None else (ones[plain].get(category) if category != "all" else ones[plain]["all"])
            cells.append("" if rate is None else f"{rate:.1f}" if base is None else f"{rate / base:.2f}x ({rate:.1f})")
        label = f"{category} ({counts[category]})" if category in counts else "all"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


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


def llama_file(kind: str, work: Path) -> Path:
    """llama-server's file: the shipped Q4_1, or the embedded model requantised to `kind` (once, in `work`)."""
    from specdecode.models.default import default_target_path

    work.mkdir(parents=True, exist_ok=True)
    shipped = default_target_path()
    return shipped if kind == "q4_1" else quantize(shipped, kind, work / f"smollm2-{kind}.gguf")


def llama_server(binary: Path, model: Path, port: int, threads: int, slots: int, spec: str | None) -> list[str]:
    """llama-server's command line: `slots` parallel sequences with 4,096 positions each, no web page,
    plain or with a `--spec-type`."""
    command = [str(binary / "llama-server"), "-m", str(model), "--port", str(port), "--host", "127.0.0.1",
               "-t", str(threads), "-np", str(slots), "-c", str(4096 * slots), "--no-webui"]
    return command + (["--spec-type", spec] if spec else [])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-bin", required=True, help="the folder holding llama-server")
    parser.add_argument("--prompts", default=str(SPEC_BENCH))
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--formats", nargs="*", default=["q4_1", "q4_0"], help="llama-server's files (q4_1: shipped)")
    parser.add_argument("--serve-args", default="", help="more arguments for `specdecode serve`, e.g. \"--prompt-rows 64\"")
    parser.add_argument("--ours", nargs="+", default=["lookup", "suffix"], help="drafts `specdecode serve` runs")
    parser.add_argument("--spec-types", nargs="+", default=SPEC_TYPES)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--fresh-profile", type=int, default=0, metavar="N",
                        help="measure our target's verification curve T(k)/T(1) N times before the servers start and "
                             "keep the quickest (the cached one is what `--gamma auto` and `--draft auto` plan by)")
    parser.add_argument("--passes", type=int, default=1,
                        help="at one client, send the prompt set this many times to each started server: a later "
                             "pass repeats earlier requests (what a memory of earlier outputs is for)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of every configuration, in turns (see above)")
    parser.add_argument("--no-ours-plain", dest="ours_plain", action="store_false",
                        help="leave out `specdecode serve --gamma 0` (ours without speculation)")
    parser.add_argument("--work", default="/tmp/serve_vs_llama_server")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    from specdecode.bench.prompts import load_prompts

    work = Path(args.work)
    chosen = load_prompts(args.prompts, CATEGORIES, args.per_category)
    prompts = [p.text for p in chosen]
    files = {kind: llama_file(kind, work) for kind in args.formats}
    rows, texts = [], {}
    categories = [p.category for p in chosen]
    curve = None
    if args.fresh_profile:  # on a shared machine one measurement may fall in a busy spell: keep the quickest
        from dataclasses import asdict

        from specdecode.models.load import load_model
        from specdecode.models.profile import profile_model, profile_path

        model = load_model(None)
        tries = [profile_model(model, use_cache=False) for _ in range(args.fresh_profile)]
        measured = min(tries, key=lambda p: p.step_seconds)
        profile_path(model).write_text(json.dumps(asdict(measured)))
        print("T(1) of each measurement:", ", ".join(f"{p.step_seconds * 1e3:.1f} ms" for p in tries), flush=True)
        curve = (f"the quickest of {len(tries)} measurements (T(1) of each: "
                 + ", ".join(f"{p.step_seconds * 1e3:.1f} ms" for p in tries) + "): "
                 f"T(1) {measured.step_seconds * 1e3:.2f} ms, T(k)/T(1) for k = 2..{len(measured.verify_ratios) - 1}: "
                 + " ".join(f"{r:.2f}" for r in measured.verify_ratios[2:]))
        print("measured:", curve, flush=True)
    top = max(args.concurrency)

    # every configuration: (name, its plain configuration's name or None, the command on a port, slots)
    configs = []
    for draft in (["plain"] if args.ours_plain else []) + args.ours:
        extra = ["--gamma", "0"] if draft == "plain" else ["--draft", draft]
        name = " ".join(["specdecode serve", "--gamma 0" if draft == "plain" else f"--draft {draft}",
                         *args.serve_args.split()])
        command = (lambda port, extra=extra: [sys.executable, "-m", "specdecode", "serve", "--port", str(port),
                                              "--model-name", "smol", *extra, "--max-batch", str(max(top, 1)),
                                              "--max-queue", str(4 * top), *args.serve_args.split()])
        configs.append((name, None if draft == "plain" else "ours-plain", command, top, f"serve-{draft}"))
    ours_plain = configs[0][0] if args.ours_plain else None
    for kind, path in files.items():
        for spec in [None, *args.spec_types]:
            for np_ in sorted({1, top}):
                name = f"llama-server {kind.upper()} {spec or 'plain'}" + (f" -np {np_}" if np_ > 1 else "")
                plain = None if spec is None else name.replace(spec, "plain")
                command = (lambda port, path=path, np_=np_, spec=spec:
                           llama_server(Path(args.llama_bin), path, port, args.threads, np_, spec))
                configs.append((name, plain, command, np_, f"llama-{kind}-{spec}-{np_}"))
    plain_of = {name: (ours_plain if plain == "ours-plain" else plain) for name, plain, *_ in configs}
    for again in range(2, args.passes + 1):  # a later pass against its plain configuration's same pass
        plain_of.update({f"{name}, pass {again}": plain and f"{plain}, pass {again}"
                         for name, plain in list(plain_of.items()) if ", pass " not in name})

    runs: dict[tuple[str, int], list[dict]] = {}
    for round_ in range(args.rounds):
        shift = round_ % len(configs)
        for name, _, command, slots, log in configs[shift:] + configs[:shift]:  # a rotated order each round
            port = free_port()
            with running(command(port), port, work / f"{log}.log"):
                for c in args.concurrency:
                    if c > slots:
                        continue
                    asked = prompts if c == 1 else prompts * 2  # enough requests to keep c clients busy
                    for again in range(args.passes if c == 1 else 1):  # the same prompts again, same server
                        label = name if again == 0 else f"{name}, pass {again + 1}"
                        result = load(f"http://127.0.0.1:{port}/v1", "smol", asked, c, args.max_tokens)
                        texts.setdefault((label, c), result["texts"])
                        runs.setdefault((label, c), []).append(result)
                        print(f"round {round_ + 1}: {label:42s} c={c}: {result['tokens_per_second']:6.1f} tokens/s, "
                              f"TTFT p50 {result['ttft_p50'] * 1e3:.0f} ms, latency p50 {result['latency_p50']:.2f} s",
                              flush=True)
    for (name, c), results in runs.items():
        merged = merge(results)
        rows.append(dict(server=name, concurrency=c, **{k: v for k, v in merged.items()
                                                         if k not in ("texts", "per_request")}))
    ones = {name: per_category(results, categories) for (name, c), results in runs.items() if c == 1}

    # the server's greedy text against the library's, prompt by prompt
    from specdecode import PromptLookupDrafter, SamplingParams
    from specdecode.models.load import load_model
    from specdecode.prompts import encode_chat
    from specdecode.text import generate

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
             f"concurrency > 1 each prompt is sent twice; {args.rounds} round(s) of every configuration, in turns, "
             f"each in a freshly started server (tokens and seconds summed over the rounds)", "",
             *([f"Our target's verification curve, measured before the servers started: {curve}", ""] if curve else []),
             "| server | clients | requests | tokens | tokens/s | TTFT p50 | TTFT p99 | latency p50 | latency p99 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['server']} | {r['concurrency']} | {r['requests']} | {r['tokens']} | "
                     f"{r['tokens_per_second']:.1f} | {r['ttft_p50'] * 1e3:.0f} ms | {r['ttft_p99'] * 1e3:.0f} ms | "
                     f"{r['latency_p50']:.2f} s | {r['latency_p99']:.2f} s |")
    lines += gains_table(ones, plain_of, CATEGORIES, dict(zip(CATEGORIES, (categories.count(c) for c in CATEGORIES))))
    lines += ["", "Greedy text through `specdecode serve` equal to the library's `generate` of the same prompt: "
              + ", ".join(f"{name} {n}/{len(prompts)}" for name, n in same.items()),
              "", f"The library itself (`text.generate` with prompt lookup, one prompt after another in this process, "
              f"after the servers stopped): {library_tokens} tokens, {library_rate:.1f} tokens/s; "
              + ", ".join(f"{r['server']} at 1 client {r['tokens_per_second'] / library_rate:.2f}x of it"
                          for r in rows if r['concurrency'] == 1 and r['server'].startswith("specdecode"))]
    publish(lines, args.out)
    if args.out:
        Path(args.out).with_suffix(".json").write_text(json.dumps(dict(rows=rows, identical=same,
                                                                         library_tokens_per_second=library_rate,
                                                                         per_category=ones), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
