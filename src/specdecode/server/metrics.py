"""Prometheus metrics, named like vLLM's speculative-decoding metrics (prometheus-client adds
`_total` to counters): num_drafts, num_draft_tokens, num_accepted_tokens and
num_accepted_tokens_per_pos{position}, plus latency, time to first token and tokens/s."""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

from ..stats import Stats

PREFIX = "specdecode"
disable_created_metrics()  # no *_created series beside every counter
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
RATE_BUCKETS = (1, 2, 5, 10, 20, 40, 60, 80, 100, 150, 200, 300, 500)
UNMATCHED = "unmatched"  # the endpoint label of every URL no route serves: one series, however many URLs
CLIENT_LEFT = 499  # the status label of a response the client walked away from (nginx's code)


class Metrics:
    """in_flight: the engine's count of requests waiting or running, read at each scrape."""

    def __init__(self, in_flight: Callable[[], int] = lambda: 0) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(f"{PREFIX}_requests", "HTTP requests by route and status (499: the client left)",
                                ["endpoint", "status"], registry=r)
        self.num_drafts = Counter(f"{PREFIX}_spec_decode_num_drafts", "target calls that verified a proposal",
                                  registry=r)
        self.num_tree_drafts = Counter(f"{PREFIX}_spec_decode_num_tree_drafts",
                                       "proposals that were trees (their nodes count as draft tokens)", registry=r)
        self.num_draft_tokens = Counter(f"{PREFIX}_spec_decode_num_draft_tokens", "draft tokens proposed",
                                        registry=r)
        self.num_accepted_tokens = Counter(f"{PREFIX}_spec_decode_num_accepted_tokens", "draft tokens accepted",
                                           registry=r)
        self.accepted_per_pos = Counter(f"{PREFIX}_spec_decode_num_accepted_tokens_per_pos",
                                        "draft tokens accepted at each draft position", ["position"], registry=r)
        self.target_calls = Counter(f"{PREFIX}_target_calls", "target model forward calls", registry=r)
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "prompt tokens processed", registry=r)
        self.generation_tokens = Counter(f"{PREFIX}_generation_tokens", "tokens generated", registry=r)
        self.latency = Histogram(f"{PREFIX}_request_latency_seconds", "from arrival to the last token",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram(f"{PREFIX}_time_to_first_token_seconds", "from arrival to the first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tokens_per_second = Histogram(f"{PREFIX}_request_tokens_per_second",
                                           "generated tokens / generation time, per request",
                                           buckets=RATE_BUCKETS, registry=r)
        self.batch_size = Histogram(f"{PREFIX}_batch_size", "requests sharing each batched decode forward",
                                    buckets=BATCH_BUCKETS, registry=r)
        self.batch_rows = Histogram(f"{PREFIX}_batch_rows", "rows (tokens) of each batched decode forward, drafts included",
                                    buckets=BATCH_BUCKETS, registry=r)
        self.queue = Gauge(f"{PREFIX}_requests_in_flight", "generation requests waiting or running", registry=r)
        self.queue.set_function(in_flight)

    def finished(self, prompt_tokens: int, stats: Stats, latency: float, ttft: float | None) -> None:
        self.num_drafts.inc(stats.drafts)
        self.num_tree_drafts.inc(stats.tree_drafts)
        self.num_draft_tokens.inc(stats.proposed)
        self.num_accepted_tokens.inc(stats.accepted)
        for position, count in enumerate(stats.accepted_per_position):
            self.accepted_per_pos.labels(position=str(position)).inc(count)
        self.target_calls.inc(stats.target_calls)
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(stats.new_tokens)
        self.latency.observe(latency)
        if ttft is not None:
            self.ttft.observe(ttft)
        if stats.new_tokens and stats.wall_seconds > 0:
            self.tokens_per_second.observe(stats.tokens_per_second)

    def step(self, requests: int, rows: int) -> None:
        """One batched decode forward: how many requests shared it, over how many rows."""
        self.batch_size.observe(requests)
        self.batch_rows.observe(rows)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
