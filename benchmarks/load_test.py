"""Load test of `specdecode serve` on 127.0.0.1: starts the server, sends a bounded number of
chat requests from many client threads with the official `openai` client (half streaming, some
clients disconnecting mid-stream), and records throughput, latency percentiles, 429 refusals, the
most requests the server held at once, and its memory before and after.

    python benchmarks/load_test.py --requests 500 --concurrency 16 --max-queue 8 \
        --out benchmarks/results/load_test.md

Every completed response must equal its own prompt's greedy reference output (taken before the
load), and every disconnected stream a prefix of it (`load_client.py` beside this file).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from load_client import run_load, served


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-queue", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--deadline", type=float, default=3000, help="seconds; the load stops by itself after it")
    parser.add_argument("--server-args", default="", help="extra arguments for `specdecode serve`")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    with served("--model-name", "smol", "--max-queue", str(args.max_queue), *args.server_args.split()) as (
            server, port, command):
        report = run_load(f"http://127.0.0.1:{port}/v1", "smol", args.requests, args.concurrency, args.max_tokens,
                          server_pid=server.pid, deadline_seconds=args.deadline)
        alive = server.poll() is None
    summary = report.summary() | {"server_alive_at_end": alive}
    growth = (report.rss_at_end - report.rss_after_warmup) / report.rss_after_warmup
    summary["rss_growth"] = f"{growth:+.1%}"
    text = (f"Command: `python benchmarks/{Path(__file__).name} {' '.join(sys.argv[1:])}`\n\n"
            f"Machine: {platform.platform()}; server: `{' '.join(command[1:])}` (port chosen free)\n\n"
            "| figure | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in summary.items()))
    print(text)
    if args.out:
        Path(args.out).write_text(text)
        Path(args.out).with_suffix(".json").write_text(json.dumps(summary, indent=1))
    return 0 if not report.failures and alive else 1


if __name__ == "__main__":
    sys.exit(main())
