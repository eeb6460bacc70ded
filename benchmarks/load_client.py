"""A bounded load test of a running server with the official `openai` client (127.0.0.1 only).

Each request picks one of a few prompts; greedy outputs must equal that prompt's reference output
(taken one request at a time before the load), whether the request streamed or not, so a response
mixed up with another request's shows as a mismatch. Some streaming clients disconnect after a few
chunks: what they received must be a prefix of the reference, and the server must free their slot.
Requests refused with 429 (queue full) are counted and retried after the Retry-After they were given.
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

@contextmanager
def served(*serve_args: str):
    """`specdecode serve` on a free port of 127.0.0.1, answering /health: yields (process, port, command);
    stopped on exit."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "specdecode", "serve", "--port", str(port), *serve_args]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        yield server, port, command
    finally:
        server.terminate()
        server.wait(timeout=60)


PROMPTS = [
    "Summarize in one sentence: the bridge closed on Monday for repairs and will reopen in May.",
    "Repeat exactly: red, green, blue, yellow, red, green, blue, yellow.",
    "What is the capital of France?",
    "Write the numbers from one to ten in words.",
    "Rewrite in the past tense: the committee reviews the budget and approves it.",
    "Name three primary colours.",
    "Translate to French: good morning, my friend.",
    "List four fruits, one per line.",
]


@dataclass
class Outcome:
    ok: bool
    latency: float
    stream: bool
    disconnected: bool = False
    refused: int = 0  # 429 answers before it got through
    error: str | None = None


@dataclass
class Report:
    requests: int
    concurrency: int
    seconds: float
    outcomes: list[Outcome] = field(default_factory=list)
    rss_after_warmup: int | None = None
    rss_at_end: int | None = None
    max_in_flight: int = 0  # the most requests /health showed waiting or running at once

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]

    def summary(self) -> dict:
        done = [o.latency for o in self.outcomes if o.ok and not o.disconnected]
        q = statistics.quantiles(done, n=100) if len(done) >= 2 else [float("nan")] * 99
        return dict(
            requests=self.requests, concurrency=self.concurrency, seconds=round(self.seconds, 2),
            completed=sum(o.ok and not o.disconnected for o in self.outcomes),
            disconnected=sum(o.disconnected for o in self.outcomes),
            streamed=sum(o.stream for o in self.outcomes), failures=len(self.failures),
            refused_429=sum(o.refused for o in self.outcomes), max_in_flight=self.max_in_flight,
            throughput_rps=round(self.requests / self.seconds, 3),
            latency_p50=round(q[49], 3), latency_p90=round(q[89], 3), latency_p99=round(q[98], 3),
            rss_after_warmup_mb=self.rss_after_warmup and round(self.rss_after_warmup / 2**20, 1),
            rss_at_end_mb=self.rss_at_end and round(self.rss_at_end / 2**20, 1),
            errors=sorted({o.error for o in self.failures if o.error})[:5],
        )


def _client(base_url: str):
    from openai import OpenAI

    return OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)


def reference_outputs(base_url: str, model: str, prompts=PROMPTS, max_tokens: int = 24) -> dict[str, str]:
    client = _client(base_url)
    return {p: client.chat.completions.create(model=model, messages=[{"role": "user", "content": p}],
                                              temperature=0, max_tokens=max_tokens).choices[0].message.content
            for p in prompts}


def _one(base_url: str, model: str, prompt: str, expected: str, stream: bool, disconnect_after: int | None,
         max_tokens: int) -> Outcome:
    import openai

    client = _client(base_url)
    start = time.perf_counter()
    refused = 0
    while True:
        try:
            kwargs = dict(model=model, messages=[{"role": "user", "content": prompt}], temperature=0,
                          max_tokens=max_tokens)
            if not stream:
                text = client.chat.completions.create(**kwargs).choices[0].message.content
                return Outcome(text == expected, time.perf_counter() - start, False, refused=refused,
                               error=None if text == expected else f"mismatch on {prompt[:30]!r}: {text[:40]!r}")
            pieces, chunks = [], 0
            with client.chat.completions.create(stream=True, **kwargs) as events:
                for event in events:
                    if event.choices and event.choices[0].delta.content:
                        pieces.append(event.choices[0].delta.content)
                    chunks += 1
                    if disconnect_after is not None and chunks >= disconnect_after:
                        break  # leaving the `with` closes the connection mid-stream
            text = "".join(pieces)
            if disconnect_after is not None and chunks >= disconnect_after:
                ok = expected.startswith(text)
                return Outcome(ok, time.perf_counter() - start, True, True, refused,
                               None if ok else f"disconnected stream is no prefix on {prompt[:30]!r}")
            return Outcome(text == expected, time.perf_counter() - start, True, refused=refused,
                           error=None if text == expected else f"stream mismatch on {prompt[:30]!r}: {text[:40]!r}")
        except openai.RateLimitError as err:
            refused += 1
            time.sleep(float(err.response.headers.get("retry-after", "1")))
        except Exception as err:  # anything else is a failure of the server under load
            return Outcome(False, time.perf_counter() - start, stream, refused=refused,
                           error=f"{type(err).__name__}: {err}"[:200])


def run_load(base_url: str, model: str, requests: int = 500, concurrency: int = 16, max_tokens: int = 24,
             stream_every: int = 2, disconnect_every: int = 7, server_pid: int | None = None,
             prompts=PROMPTS, deadline_seconds: float = 3600) -> Report:
    """`requests` chat requests from `concurrency` threads: every `stream_every`-th streams, every
    `disconnect_every`-th streaming one disconnects after 3 chunks. Stops by itself at the deadline."""
    import psutil

    expected = reference_outputs(base_url, model, prompts, max_tokens)  # also the warm-up
    process = psutil.Process(server_pid) if server_pid else None
    report = Report(requests, concurrency, 0.0, rss_after_warmup=process.memory_info().rss if process else None)
    stop_at = time.monotonic() + deadline_seconds
    lock = threading.Lock()

    def task(i: int) -> Outcome:
        if time.monotonic() > stop_at:
            return Outcome(False, 0.0, False, error="not sent: the load test's deadline passed")
        prompt = prompts[i % len(prompts)]
        stream = i % stream_every == 0
        disconnect = 3 if stream and (i // stream_every) % disconnect_every == 0 else None
        outcome = _one(base_url, model, prompt, expected[prompt], stream, disconnect, max_tokens)
        with lock:
            report.outcomes.append(outcome)
        return outcome

    done = threading.Event()

    def watch() -> None:  # samples the server's own count of admitted requests
        health = base_url.rsplit("/v1", 1)[0] + "/health"
        while not done.wait(0.2):
            try:
                with urllib.request.urlopen(health, timeout=5) as response:
                    report.max_in_flight = max(report.max_in_flight, json.load(response)["in_flight"])
            except OSError:
                pass

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    start = time.perf_counter()
    try:
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(task, range(requests)))
    finally:
        done.set()
        watcher.join()
    report.seconds = time.perf_counter() - start
    if process:
        report.rss_at_end = process.memory_info().rss
    return report
