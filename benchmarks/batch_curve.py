"""Continuous batching under load: aggregate tokens/s and per-request latency of `specdecode serve`
at several concurrencies, with speculation planned over the batch (--gamma auto), off (--gamma 0)
and fixed (--gamma 4), all on the same server settings otherwise.

    python benchmarks/batch_curve.py --concurrency 1 2 4 8 16 --out benchmarks/results/batch_curve.md

Each point sends `--per-client` requests per client thread (greedy, half streaming, none leaving
early) with the official `openai` client; every reply must equal its prompt's reference, taken one
request at a time before the load (`load_client.py`): batching must not change any output. Tokens/s
counts the server's own generated tokens (/metrics) over the point's wall time, without the
reference replies; rows/forward is the mean number of rows (tokens: prompt pieces and drafts
included) of the batched forwards.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import urllib.request
from pathlib import Path

from load_client import reference_outputs, run_load, served

MODES = {"planned": "auto", "off": "0", "fixed 4": "4"}


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as response:
        text = response.read().decode()
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def point(port: int, concurrency: int, per_client: int, max_tokens: int) -> dict:
    # run_load first takes its reference replies one at a time (untimed): they are taken here too,
    # once to warm the prefix cache as run_load's will find it, once to count them out of the point
    reference_outputs(f"http://127.0.0.1:{port}/v1", "smol", max_tokens=max_tokens)
    start = scrape(port)
    reference_outputs(f"http://127.0.0.1:{port}/v1", "smol", max_tokens=max_tokens)
    before = scrape(port)
    references = before["specdecode_generation_tokens_total"] - start["specdecode_generation_tokens_total"]
    report = run_load(f"http://127.0.0.1:{port}/v1", "smol", concurrency * per_client, concurrency, max_tokens,
                      disconnect_every=10**9)
    after = scrape(port)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    for k in ("specdecode_batch_size_sum", "specdecode_batch_size_count", "specdecode_batch_rows_sum"):
        delta[k] = delta.get(k, 0.0) - (before.get(k, 0.0) - start.get(k, 0.0))  # the references' forwards too
    summary = report.summary()
    forwards = delta.get("specdecode_batch_size_count", 0.0)
    return dict(
        concurrency=concurrency, requests=summary["requests"], failures=summary["failures"],
        tokens_per_s=(delta["specdecode_generation_tokens_total"] - references) / report.seconds,
        p50=summary["latency_p50"], p99=summary["latency_p99"],
        batch=delta.get("specdecode_batch_size_sum", 0.0) / forwards if forwards else 0.0,
        rows=delta.get("specdecode_batch_rows_sum", 0.0) / forwards if forwards else 0.0,
        errors=summary["errors"])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--per-client", type=int, default=4, help="requests per client thread at each point")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--server-args", default="", help="extra arguments for `specdecode serve`")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    rows, failed = [], False
    for mode in args.modes:
        with served("--model-name", "smol", "--max-batch", str(args.max_batch), "--max-queue", "64",
                    "--gamma", MODES[mode], *args.server_args.split()) as (server, port, command):
            for c in args.concurrency:
                r = point(port, c, args.per_client, args.max_tokens)
                failed |= bool(r["failures"])
                rows.append((mode, r))
                print(mode, r, flush=True)
    cpu = subprocess.run(["sh", "-c", "lscpu | grep 'Model name' | sed 's/.*: *//'"], capture_output=True,
                         text=True).stdout.strip()
    best = {}
    for mode, r in rows:
        if mode != "planned":
            best[r["concurrency"]] = max(best.get(r["concurrency"], 0.0), r["tokens_per_s"])
    table = ["| mode | concurrency | requests | failures | tokens/s | vs best other | p50 s | p99 s | requests/forward "
             "| rows/forward |", "|---|---|---|---|---|---|---|---|---|---|"]
    for mode, r in rows:
        ratio = (f"{r['tokens_per_s'] / best[r['concurrency']]:.2f}x" if mode == "planned" and best.get(r["concurrency"])
                 else "")
        table.append(f"| {mode} | {r['concurrency']} | {r['requests']} | {r['failures']} | {r['tokens_per_s']:.1f} | "
                     f"{ratio} | {r['p50']:.2f} | {r['p99']:.2f} | {r['batch']:.2f} | {r['rows']:.2f} |")
    text = (f"Command: `python benchmarks/{Path(__file__).name} {' '.join(sys.argv[1:])}`\n\n"
            f"Machine: {cpu}, {platform.platform()}; server: `specdecode serve --max-batch {args.max_batch} "
            f"--max-queue 64 --gamma G {args.server_args}` (default target and kernels, draft lookup)\n\n"
            + "\n".join(table) + "\n")
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
