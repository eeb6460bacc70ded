"""`specdecode serve --ray`: option checks, the conversation key, the summed metrics, and a Ray cluster
started here (127.0.0.1 only, 2 CPUs) with 2 replicas of 1 thread of the embedded model behind one
endpoint, checked against the in-process server (create_app) on the same options."""

import json
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from conftest import run_cli

MODEL = "smol"
SERVE = ["serve", "--model-name", MODEL, "--max-tokens", "200", "--draft", "suffix", "--also-draft", "lookup",
         "--max-body-bytes", "200000", "--threads", "1"]
LONG = "Count from one to one hundred in words, separated by commas."


def scrape_metrics(base: str) -> dict[str, float]:
    """GET /metrics as {sample name with labels: value}."""
    with urllib.request.urlopen(base + "/metrics", timeout=120) as response:
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in response.read().decode().splitlines()
                if line and not line.startswith("#")}


@pytest.fixture
def on_ray():
    pytest.importorskip("ray", reason="Ray Serve is not installed: pip install 'specdecode[ray]'")
    from specdecode.server import ray as on_ray

    return on_ray


def test_ray_without_ray_installed_says_which_extra_to_install(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if it were not installed
    monkeypatch.delitem(sys.modules, "specdecode.server.ray", raising=False)
    code, out, err = run_cli(capsys, "serve", "--ray", "--replicas", "2")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        "specdecode: error: --ray needs Ray Serve, which is not installed: pip install 'specdecode[ray]'"]


def test_ray_options_are_checked_before_anything_starts(capsys, on_ray):
    cases = [(["--replicas", "2"], "--replicas, --min-replicas, --max-replicas and --address need --ray"),
             (["--ray", "--replicas", "0"], "--replicas must be >= 1 (an integer), got 0"),
             (["--ray", "--threads", "0"], "--threads must be >= 1 (an integer), got 0"),
             (["--ray", "--min-replicas", "3", "--max-replicas", "2"], "--min-replicas 3 is above --max-replicas 2"),
             (["--ray", "--replicas", "5", "--max-replicas", "2"], "--replicas 5 is outside --min-replicas 1 .. "
                                                                   "--max-replicas 2")]
    for options, message in cases:
        code, _, err = run_cli(capsys, "serve", *options)
        assert code == 2 and err.strip() == f"specdecode: error: {message}", (options, err)


def test_replica_options_fixed_or_autoscaling(on_ray):
    from specdecode.cli import build_parser
    from specdecode.cli.serve import ray_options

    fixed = on_ray.replica_options(ray_options(build_parser().parse_args(["serve", "--ray", "--replicas", "3",
                                                                          "--threads", "2"])))
    assert fixed["num_replicas"] == 3 and fixed["ray_actor_options"] == {"num_cpus": 2}
    assert "autoscaling_config" not in fixed and fixed["max_ongoing_requests"] > 16 + 1  # the engine answers 429
    scaled = on_ray.replica_options(ray_options(build_parser().parse_args(["serve", "--ray", "--min-replicas", "1",
                                                                           "--max-replicas", "4", "--replicas", "2"])))
    config = scaled["autoscaling_config"]
    assert "num_replicas" not in scaled and scaled["ray_actor_options"] == {"num_cpus": 1}
    assert (config.min_replicas, config.max_replicas, config.initial_replicas) == (1, 4, 2)


def test_serve_run_takes_every_option_of_specdecode_serve_as_a_key(on_ray):
    """`serve run specdecode.server.ray:app_builder KEY=VALUE`: each option `specdecode serve` takes is
    a key, read as the command line reads it; anything else is refused whole."""
    import argparse

    from specdecode.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    serve = commands.choices["serve"]
    taking = {a.dest for a in serve._actions if a.option_strings and a.nargs != 0}
    flags = {a.dest for a in serve._actions if a.option_strings and a.nargs == 0} - {"help"}
    assert taking <= set(on_ray.VALUES) and flags <= on_ray.FLAGS | {"ray"}, (taking - set(on_ray.VALUES), flags)
    options = on_ray.options_from_config({"ctx_size": "512", "prefix_memory": "64", "max_batch": "4",
                                          "metrics_open": "true", "also_draft": "pool", "replicas": "2"})
    assert (options.serve.ctx_size, options.serve.prefix_memory, options.serve.max_batch) == (512, 64, 4)
    assert options.serve.metrics_open and options.serve.also_drafts == ("pool",) and options.replicas == 2
    with pytest.raises(ValueError, match="not `specdecode serve`'s: --ctx-size x"):
        on_ray.options_from_config({"ctx_size": "x"})


def test_the_conversation_key_follows_the_first_user_message_or_the_user_field(on_ray):
    key = on_ray.route_key

    def chat(messages, **extra):
        return json.dumps({"model": MODEL, "messages": messages, **extra}).encode()

    first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    later = first + [{"role": "assistant", "content": "Red."}, {"role": "user", "content": "Another one."}]
    assert key(chat(first), "suffix") == key(chat(later), "suffix") is not None
    assert key(chat(first), "suffix") != key(chat([{"role": "user", "content": "Name a fruit."}]), "suffix")
    assert key(chat(first, user="ann"), "suffix") == key(chat(later[1:], user="ann"), "suffix") == "user:ann"
    # only a drafter that remembers across requests asks for the same replica
    assert key(chat(first), "lookup") is None
    assert key(chat(first, specdecode={"draft": "lookup"}), "suffix") is None
    assert key(chat(first, specdecode={"draft": "suffix"}), "lookup") is not None
    prompt = json.dumps({"model": MODEL, "prompt": "x" * 300 + "tail"}).encode()
    assert key(prompt, "suffix") == "prompt:" + "x" * 256
    assert key(b"{not json", "suffix") is None and key(b"[1]", "suffix") is None


def test_expositions_sum_by_name_and_labels(on_ray):
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    def exposition(requests: dict, tokens: float, latencies: list, in_flight: int) -> str:
        registry = CollectorRegistry()
        counter = Counter("specdecode_requests", "requests", ["endpoint", "status"], registry=registry)
        for (endpoint, status), n in requests.items():
            counter.labels(endpoint=endpoint, status=status).inc(n)
        Counter("specdecode_generation_tokens", "tokens", registry=registry).inc(tokens)
        histogram = Histogram("specdecode_latency_seconds", "latency", buckets=(1, 10), registry=registry)
        for value in latencies:
            histogram.observe(value)
        Gauge("specdecode_requests_in_flight", "in flight", registry=registry).set(in_flight)
        return generate_latest(registry).decode()

    a = exposition({("/v1/chat/completions", "200"): 3, ("/health", "200"): 1}, 30, [0.5, 5], 1)
    b = exposition({("/v1/chat/completions", "200"): 2, ("/v1/chat/completions", "400"): 1}, 12, [20], 2)
    both = exposition({("/v1/chat/completions", "200"): 5, ("/health", "200"): 1, ("/v1/chat/completions", "400"): 1},
                      42, [0.5, 5, 20], 3)

    def samples(text: str) -> dict:
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line and not line.startswith("#")}

    assert on_ray.sum_expositions([a]).decode() == a  # one replica: the same text
    assert samples(on_ray.sum_expositions([a, b]).decode()) == samples(both)
    assert "# TYPE specdecode_requests_total counter" in on_ray.sum_expositions([a, b]).decode()

    # Across restarts: replica "y" answers, then stays silent, then is gone and "z" replaces it. Every
    # counter summed over the replicas only grows; a gone or silent replica's gauge leaves the sum.
    totals, seen = on_ray.Totals(), []
    for answered, alive in (({"x": a, "y": b}, ["x", "y"]), ({"x": a}, ["x", "y"]), ({"x": a}, ["x", "z"]),
                            ({"x": a, "z": b}, ["x", "z"])):
        seen.append(samples(totals.exposition(answered, alive).decode()))
    chat_ok = 'specdecode_requests_total{endpoint="/v1/chat/completions",status="200"}'
    assert [s[chat_ok] for s in seen] == [5, 5, 5, 7]  # y's 2 requests stay counted after it is gone
    assert [s["specdecode_requests_in_flight"] for s in seen] == [3, 1, 1, 3]
    for earlier, later in zip(seen, seen[1:]):
        assert all(later[k] >= v for k, v in earlier.items() if not k.startswith("specdecode_requests_in_flight"))
    totals.unavailable += 2
    assert samples(totals.exposition({"x": a}, ["x", "z"]).decode())["specdecode_ingress_unavailable_total"] == 2


# --- a local Ray cluster --------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base: str, path: str, body=None, raw: bytes | None = None, method: str | None = None):
    """(status, parsed body, headers: case-insensitive) of one request."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read()), response.headers
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), err.headers


def chat(content: str, max_tokens: int = 12, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "temperature": 0,
            "max_tokens": max_tokens, **extra}


def events(response) -> list:
    """A server-sent-event stream's data lines, parsed ([DONE] kept as is)."""
    out = []
    for line in response:
        line = line.decode().strip()
        if line.startswith("data: "):
            out.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
    return out


def stream(base: str, body: dict):
    request = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps({**body, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(request, timeout=120)


def streamed_text(items: list) -> str:
    return "".join(i["choices"][0]["delta"].get("content", "") for i in items if isinstance(i, dict) and i.get("choices"))


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray", reason="Ray Serve is not installed: pip install 'specdecode[ray]'")
    import torch
    import uvicorn
    from ray import serve

    from specdecode.cli import build_parser
    from specdecode.cli.serve import ray_options, serve_options
    from specdecode.server.build import build_app
    from specdecode.server.ray import APP, build

    threads = torch.get_num_threads()
    # Ray Serve gives a starting proxy 5 s and a health check 10 s by default: a host slowed by other work
    # (or a slower CPU) can take longer to start a worker process, and its proxy is then killed. The
    # controller reads these when it starts, from the environment the cluster inherits.
    timeouts = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "120", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "120"}
    saved = {name: os.environ.get(name) for name in timeouts}
    os.environ.update(timeouts)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    try:
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build(ray_options(build_parser().parse_args([*SERVE, "--ray", "--replicas", "2"]))), name=APP,
                  route_prefix="/")
        app = build_app(serve_options(build_parser().parse_args(SERVE))).app  # the same options, in this process
        local = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=_free_port(), log_level="warning"))
        thread = threading.Thread(target=local.run, daemon=True)
        thread.start()
        while not local.started:
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{local.config.port}", ray
        local.should_exit = True
        thread.join(timeout=30)
        app.state.engine.close()
    finally:
        serve.shutdown()
        ray.shutdown()
        torch.set_num_threads(threads)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def replica_ids(ray) -> list[str]:
    """The replicas' ids, from their actors' names (SERVE_REPLICA::app#Replica#ID)."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    return sorted(n.rsplit("#", 1)[1] for n in names if n.startswith("SERVE_REPLICA::specdecode#Replica#"))


def lands_on(replica: str, replicas: list[str]) -> str:
    """A first user message whose conversation the router sends to `replica`."""
    from specdecode.server.ray import rank, route_key

    for i in range(1000):
        content = f"Say the word number {i} of a short poem."
        key = route_key(json.dumps(chat(content)).encode(), "suffix")
        if max(replicas, key=lambda r: rank(key, r)) == replica:
            return content
    raise AssertionError("no message lands on " + replica)


def lands_on_user(user: str, replicas: list[str]) -> str:
    """The replica the router sends the `user` field's requests to."""
    from specdecode.server.ray import rank

    return max(replicas, key=lambda r: rank("user:" + user, r))


@pytest.mark.slow
def test_greedy_output_and_errors_through_ray_equal_the_in_process_server(cluster):
    ray_base, local_base, _ = cluster
    completion = {"model": MODEL, "prompt": "The bridge closed on Monday. The bridge", "temperature": 0,
                  "max_tokens": 12}
    for path, body in [("/v1/chat/completions", chat("What is the capital of France?", 16)),
                       ("/v1/chat/completions", chat("Name three primary colours.", specdecode={"draft": "lookup"})),
                       ("/v1/completions", completion)]:
        (status, got, headers), (_, want, _) = call(ray_base, path, body), call(local_base, path, body)
        assert status == 200 and headers["x-specdecode-replica"]
        assert got["choices"] == want["choices"]
        assert got["choices"][0].get("text") or got["choices"][0]["message"]["content"]
        assert {k: got["usage"][k] for k in ("prompt_tokens", "completion_tokens")} == \
               {k: want["usage"][k] for k in ("prompt_tokens", "completion_tokens")}
        assert got["usage"]["speculative"]["draft"] == want["usage"]["speculative"]["draft"]
    # bad input: the same status and the same OpenAI error body
    bad = [("/v1/chat/completions", None, b"{not json"),
           ("/v1/chat/completions", chat("x", model="gpt-4"), None),
           ("/v1/chat/completions", chat("x", temperature=3), None),
           ("/v1/chat/completions", chat("x", specdecode={"draft": "nope"}), None),
           ("/v1/chat/completions", chat("word " * 9000), None),
           ("/v1/chat/completions", chat("x" * 300_000), None),
           ("/v1/completions", {"model": MODEL}, None),
           ("/v1/nothing", {}, None)]
    for path, body, raw in bad:
        got, want = call(ray_base, path, body, raw), call(local_base, path, body, raw)
        assert got[0] == want[0] >= 400 and got[1] == want[1] and set(got[1]["error"]) == {
            "message", "type", "param", "code"}, (path, got[:2], want[:2])
    assert call(ray_base, "/v1/chat/completions", method="GET")[:2] == call(local_base, "/v1/chat/completions",
                                                                             method="GET")[:2]


@pytest.mark.slow
def test_streams_through_ray_carry_the_same_text(cluster):
    ray_base, local_base, _ = cluster
    body = chat("Write the numbers from one to ten in words.", 24)
    with stream(ray_base, body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        got = events(response)
    with stream(local_base, body) as response:
        want = events(response)
    assert got[-1] == want[-1] == "[DONE]"
    assert streamed_text(got) == streamed_text(want) == call(ray_base, "/v1/chat/completions", body)[1][
        "choices"][0]["message"]["content"]
    finish = [i["choices"][0]["finish_reason"] for i in got if isinstance(i, dict) and i.get("choices")]
    assert finish[-1] in ("stop", "length") and not any(finish[:-1])


@pytest.mark.slow
def test_conversations_stay_on_their_replica_and_metrics_sum_over_replicas(cluster):
    ray_base, _, ray = cluster
    replicas = replica_ids(ray)
    assert len(replicas) == 2
    status, health, _ = call(ray_base, "/health")
    assert status == 200 and health["replicas"] == 2 and health["drafts"] == ["suffix", "lookup"]

    def scrape() -> dict:
        with urllib.request.urlopen(ray_base + "/metrics") as response:
            return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in response.read().decode().splitlines()
                    if line and not line.startswith("#")}

    before = scrape()
    tokens, served = 0, []
    for replica in replicas:
        first = lands_on(replica, replicas)
        status, one, headers = call(ray_base, "/v1/chat/completions", chat(first, 8))
        assert status == 200 and headers["x-specdecode-replica"] == replica
        turn = chat(first, 8)
        turn["messages"] += [{"role": "assistant", "content": one["choices"][0]["message"]["content"]},
                             {"role": "user", "content": "And the next word?"}]
        status, two, headers = call(ray_base, "/v1/chat/completions", turn)
        assert status == 200 and headers["x-specdecode-replica"] == replica  # the earlier turn's replica
        tokens += one["usage"]["completion_tokens"] + two["usage"]["completion_tokens"]
        served += [replica, replica]
    after = scrape()
    chat_ok = 'specdecode_requests_total{endpoint="/v1/chat/completions",status="200"}'
    assert after[chat_ok] - before.get(chat_ok, 0) == 4  # two replicas' counters, added up
    assert after["specdecode_generation_tokens_total"] - before["specdecode_generation_tokens_total"] == tokens
    assert after["specdecode_request_latency_seconds_count"] - before["specdecode_request_latency_seconds_count"] == 4
    assert after["specdecode_spec_decode_num_draft_tokens_total"] >= after["specdecode_spec_decode_num_accepted_tokens_total"]


@pytest.mark.slow
def test_a_killed_replica_fails_its_requests_with_503_and_is_replaced(cluster):
    ray_base, _, ray = cluster
    replicas = replica_ids(ray)
    doomed, survivor = replicas
    user = next(f"user{i}" for i in range(1000) if lands_on_user(f"user{i}", replicas) == doomed)
    topics = ["Rome", "Greece", "Egypt", "China", "Persia", "Carthage"]
    results = {}

    def ask(topic: str) -> None:
        results[topic] = call(ray_base, "/v1/chat/completions",
                              chat(f"Write a long essay about the history of {topic}.", 200, user=user))

    # six long requests queue on the doomed replica (one runs at a time), then a stream waits behind them
    threads = [threading.Thread(target=ask, args=(topic,)) for topic in topics]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 300  # bounds on waiting, generous: a loaded host is slow, not broken
    while call(ray_base, "/health")[1]["in_flight"] < 3:
        assert time.monotonic() < deadline, "the requests never queued on the replica"
        time.sleep(0.05)
    response = stream(ray_base, chat("Name three primary colours.", 8, user=user))
    assert response.headers["x-specdecode-replica"] == doomed
    response.readline()  # the first event: the stream is open, its generation waits in the queue
    before = scrape_metrics(ray_base)  # the doomed replica's counters, as the ingress last sees them
    ray.kill(ray.get_actor(f"SERVE_REPLICA::specdecode#Replica#{doomed}", namespace="serve"))
    with response:
        rest = events(response)  # ends, never hangs: an error event, then [DONE]
    assert rest[-1] == "[DONE]" and rest[-2]["error"]["code"] == "replica_unavailable", rest[-3:]
    for thread in threads:
        thread.join(timeout=60)
    assert {status for status, _, _ in results.values()} <= {200, 503} and len(results) == len(topics)
    refused = [(body, headers) for status, body, headers in results.values() if status == 503]
    assert refused, "no request was in flight on the killed replica"
    for body, headers in refused:  # OpenAI's error body, with a hint to retry
        assert body["error"]["code"] == "replica_unavailable" and headers["Retry-After"] == "1"
        assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"]
    # the next requests succeed: the conversation moves to the other replica
    status, moved, headers = call(ray_base, "/v1/chat/completions", chat("Name three primary colours.", 8, user=user))
    assert status == 200 and headers["x-specdecode-replica"] == survivor
    # Ray Serve starts a new replica (loading the model: minutes on a loaded host), which then serves its share
    deadline = time.monotonic() + 900
    while len(fresh := replica_ids(ray)) < 2 or doomed in fresh or call(ray_base, "/health")[1].get("replicas") != 2:
        assert time.monotonic() < deadline, f"no new replica: {fresh}"
        time.sleep(1)
    new = next(r for r in fresh if r != survivor)
    status, body, headers = call(ray_base, "/v1/chat/completions", chat(lands_on(new, fresh), 8))
    assert status == 200 and headers["x-specdecode-replica"] == new
    # no summed counter went down across the kill (the killed replica's stay in the sum), and the
    # ingress counted the 503s it answered (the refused requests and the broken stream)
    after = scrape_metrics(ray_base)
    counters = [k for k in before if k.endswith(("_total", "_count", "_sum")) or "_bucket{" in k]
    assert counters and all(after.get(k, 0) >= before[k] for k in counters), \
        [(k, before[k], after.get(k)) for k in counters if after.get(k, 0) < before[k]]
    assert after["specdecode_ingress_unavailable_total"] >= len(refused) + 1
