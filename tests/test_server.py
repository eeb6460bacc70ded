"""`specdecode serve` on 127.0.0.1 with the embedded model, driven by the official openai client."""

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from conftest import cli as in_process
from specdecode import defaults

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow
MODEL = "smol"
QUESTION = "What is the capital of France?"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


WINDOW = 1024  # the shared server's context (--ctx-size): a prompt that fills it is quick to compute


def _start_server(*options: str, env: dict | None = None):
    """`specdecode serve` with these options on a free port, once /health answers: (base URL, process)."""
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "specdecode", "serve", "--port", str(port), *options],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(base + "/health", timeout=2)
            break
        except OSError:
            if process.poll() is not None:
                pytest.fail("the server exited: " + process.stdout.read()[-2000:])
            time.sleep(1)
    else:
        process.kill()
        pytest.fail("the server did not come up")
    return base, process


def _stop(process) -> None:
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture(scope="module")
def server():
    base, process = _start_server("--model-name", MODEL, "--max-batch", "2", "--max-queue", "2", "--max-tokens", "64",
                                  "--also-draft", "trained", "--max-body-bytes", "200000", "--ctx-size", str(WINDOW))
    yield base, process
    _stop(process)


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0)


def post(base: str, path: str, body, raw: bytes | None = None):
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), dict(err.headers)


def chat(content: str = QUESTION, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": 16,
            **extra}


def test_chat_greedy_equals_the_cli_and_carries_consistent_statistics(client):
    response = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                              temperature=0, max_tokens=16)
    cli = in_process("generate", QUESTION, "--max-new-tokens", "16", "--json")
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert response.choices[0].message.content == json.loads(cli.stdout)["text"]
    assert response.choices[0].finish_reason in ("stop", "length")
    usage = response.usage
    spec = usage.model_extra["speculative"]
    assert usage.completion_tokens == json.loads(cli.stdout)["tokens"].__len__()
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert 0 <= spec["accepted_tokens"] <= spec["draft_tokens"]
    assert sum(spec["accepted_per_position"]) == spec["accepted_tokens"]
    # every target call adds its accepted drafts plus one token of its own (unless an EOS cut the last)
    assert 0 <= spec["target_calls"] - (usage.completion_tokens - spec["accepted_tokens"]) <= 1
    assert spec["draft"] == defaults.DRAFT and spec["gamma"] == "auto"  # the server's default


def test_streamed_chat_and_completions_match_the_unstreamed_text(client):
    whole = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                           temperature=0, max_tokens=16).choices[0].message.content
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                                 temperature=0, max_tokens=16, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    prompt = "The bridge closed on Monday. The bridge"
    text = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=12).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=prompt, temperature=0, max_tokens=12, stream=True))
    assert streamed == text and text


def test_extension_fields_pick_draft_gamma_and_lenience(client):
    plain = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                           temperature=0, max_tokens=16)
    trained = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                             temperature=0, max_tokens=16,
                                             extra_body={"specdecode": {"draft": "trained", "gamma": 2}})
    spec = trained.usage.model_extra["speculative"]
    assert spec["draft"] == "trained" and spec["gamma"] == 2
    assert 0 < spec["draft_tokens"] <= 2 * spec["num_drafts"] and len(spec["accepted_per_position"]) <= 2
    assert trained.choices[0].message.content and plain.choices[0].message.content
    sampled = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                             temperature=0.8, top_p=0.9, seed=3, max_tokens=12,
                                             extra_body={"specdecode": {"top_k": 20, "lenience": 0.9}})
    again = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                           temperature=0.8, top_p=0.9, seed=3, max_tokens=12,
                                           extra_body={"specdecode": {"top_k": 20, "lenience": 0.9}})
    assert sampled.choices[0].message.content == again.choices[0].message.content  # seeded


def test_requests_batched_together_get_the_text_each_gets_alone(server, client):
    """Four requests at once on a batch of two with two places in the queue (different prompts and
    settings; one streams, one leaves early): each reply equals the same request sent alone, and
    /metrics saw batched forwards."""

    asks = [dict(content=QUESTION, temperature=0),
            dict(content="Name three colours of the rainbow.", temperature=0,
                 extra_body={"specdecode": {"draft": "trained", "gamma": 3}}),
            dict(content="Count from one to ten in words.", temperature=0.8, seed=5,
                 extra_body={"specdecode": {"gamma": 2}})]

    def ask(a, stream=False):
        a = dict(a)
        messages = [{"role": "user", "content": a.pop("content")}]
        if not stream:
            return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, **a
                                                  ).choices[0].message.content
        return "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=24, stream=True, **a) if c.choices)

    alone = [ask(a) for a in asks]
    before = _metrics(server[0]).get("specdecode_batch_size_sum", 0.0)
    with ThreadPoolExecutor(5) as pool:
        leaving = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                                 max_tokens=64, stream=True)
        next(iter(leaving))
        together = [pool.submit(ask, a, i == 1) for i, a in enumerate(asks)]
        leaving.close()
        assert [f.result() for f in together] == alone
    values = _metrics(server[0])
    assert values["specdecode_batch_size_sum"] > before
    assert values["specdecode_batch_rows_sum"] >= values["specdecode_batch_size_sum"]
    assert values['specdecode_batch_size_bucket{le="2.0"}'] == values["specdecode_batch_size_count"]  # --max-batch 2


BAD = [
    (None, b"{not json", 400, "invalid_json"),
    (None, b"[1, 2]", 400, "invalid_type"),
    (None, b'{"model": "smol", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}', 400, "invalid_json"),
    (chat(model="gpt-4"), None, 404, "model_not_found"),
    ({"messages": [{"role": "user", "content": "x"}]}, None, 400, "missing_required_parameter"),
    (chat(messages=[]), None, 400, "invalid_value"),
    (chat(messages="hello"), None, 400, "invalid_type"),
    (chat(messages=[{"role": "robot", "content": "x"}]), None, 400, "invalid_value"),
    (chat(messages=[{"role": "user", "content": 5}]), None, 400, "invalid_type"),
    (None, b'{"model": "smol", "messages": [{"role": "user", "content": "a\\ud800"}]}', 400, "invalid_value"),
    (None, b"[" * 1000 + b"]" * 1000, 400, "invalid_json"),
    (chat(temperature=3), None, 400, "invalid_value"),
    (chat(temperature="hot"), None, 400, "invalid_type"),
    (chat(top_p=0), None, 400, "invalid_value"),
    (chat(max_tokens=0), None, 400, "invalid_value"),
    (chat(max_tokens=65), None, 400, "invalid_value"),
    (chat(max_tokens=2.5), None, 400, "invalid_type"),
    (chat(n=2, stream=True), None, 400, "unsupported_value"),
    (chat(n=0), None, 400, "invalid_value"),
    (chat(stream="yes"), None, 400, "invalid_type"),
    (chat(stop=["a", "b", "c", "d", "e"]), None, 400, "invalid_value"),
    (chat(stop=[""]), None, 400, "invalid_value"),
    (chat(seed="x"), None, 400, "invalid_type"),
    (chat(metadata="x"), None, 400, "invalid_type"),
    (chat(stream_options={"include_usage": "yes"}, stream=True), None, 400, "invalid_type"),
    (chat(colour="blue"), None, 400, "unknown_parameter"),
    (chat(specdecode={"gamma": -1}), None, 400, "invalid_value"),
    (chat(specdecode={"gamma": 100}), None, 400, "invalid_value"),
    (chat(specdecode={"gamma": "fast"}), None, 400, "invalid_value"),
    (chat(specdecode={"lenience": 0}), None, 400, "invalid_value"),
    (chat(specdecode={"top_k": -1}), None, 400, "invalid_value"),
    (chat(specdecode={"draft": "nope"}), None, 400, "invalid_value"),
    (chat(specdecode={"speed": 1}), None, 400, "unknown_parameter"),
    (chat(specdecode=[1]), None, 400, "invalid_type"),
    (chat(content="word " * 9000), None, 400, "context_length_exceeded"),
    (chat(content="x" * 300_000), None, 413, "body_too_large"),
]


@pytest.mark.parametrize("body, raw, status, code", BAD)
def test_bad_input_gets_its_status_and_an_openai_error(server, body, raw, status, code):
    got, payload, _ = post(server[0], "/v1/chat/completions", body, raw)
    assert got == status, payload
    error = payload["error"]
    assert error["code"] == code and error["message"] and set(error) == {"message", "type", "param", "code"}
    if code == "context_length_exceeded":  # the prompt's tokens, max_tokens, their sum, the window
        prompt, max_tokens, total, window = [int(n) for n in re.findall(r"\d+", error["message"])]
        assert max_tokens == 16 and total == prompt + 16 and prompt > window == WINDOW
        assert error["param"] == "messages"  # the prompt alone is too long: lowering max_tokens cannot help


def test_completions_refuse_a_missing_prompt_and_unknown_routes_are_openai_errors(server):
    got, payload, _ = post(server[0], "/v1/completions", {"model": MODEL})
    assert got == 400 and payload["error"]["param"] == "prompt"
    got, payload, _ = post(server[0], "/v1/nothing", {})
    assert got == 404 and payload["error"]["code"] == "not_found"


def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list()] == [MODEL]
    with urllib.request.urlopen(server[0] + "/health") as response:
        health = json.load(response)
    assert health["status"] == "ok" and health["drafts"] == [defaults.DRAFT, "trained", "lookup"]
    assert post(server[0], "/v1/chat/completions", chat(temperature=-1))[0] == 400  # counted below
    # an answer that copies its prompt, at a fixed gamma: speculation must run and be accepted whatever ran
    # before this test and whatever the cost model would make of this host's timings
    client.chat.completions.create(model=MODEL, temperature=0, max_tokens=16, extra_body={"specdecode": {"gamma": 4}},
                                   messages=[{"role": "user", "content": "Repeat exactly: one two three four five six "
                                                                         "seven eight nine ten eleven twelve"}])
    with urllib.request.urlopen(server[0] + "/metrics") as response:
        text = response.read().decode()
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    assert values["specdecode_spec_decode_num_draft_tokens_total"] >= values["specdecode_spec_decode_num_accepted_tokens_total"]
    assert values["specdecode_generation_tokens_total"] >= 16
    assert values['specdecode_spec_decode_num_accepted_tokens_per_pos_total{position="0"}'] >= 1
    assert values["specdecode_time_to_first_token_seconds_count"] >= 1
    assert 'specdecode_requests_total{endpoint="/v1/chat/completions",status="400"}' in values


def test_a_full_queue_answers_429_and_a_client_that_leaves_frees_its_slot(server, client):
    # Two decode (--max-batch 2), two wait (--max-queue 2): the fifth is refused with Retry-After.
    streams = [client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                              temperature=0, max_tokens=64, stream=True) for _ in range(4)]
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=4)
    assert int(refused.value.response.headers["retry-after"]) >= 1
    assert refused.value.response.json()["error"]["code"] == "queue_full"
    assert "2 requests are waiting" in refused.value.response.json()["error"]["message"]
    for stream in streams:  # every client walks away after the first chunk
        next(iter(stream))
        stream.close()
    deadline = time.monotonic() + 300  # a bound on waiting, generous: a loaded host is slow, not broken
    while time.monotonic() < deadline:
        with urllib.request.urlopen(server[0] + "/health") as response:
            if json.load(response)["in_flight"] == 0:
                break
        time.sleep(0.2)
    else:
        pytest.fail("abandoned generations still hold the queue")
    assert client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                          temperature=0, max_tokens=4).choices[0].message.content


def test_small_load_keeps_every_response_its_own_and_the_server_up(server):
    from load_client import run_load

    base, process = server
    report = run_load(base + "/v1", MODEL, requests=24, concurrency=6, max_tokens=8, server_pid=process.pid,
                      deadline_seconds=600)
    summary = report.summary()
    assert summary["failures"] == 0, summary
    assert summary["disconnected"] >= 1 and summary["completed"] + summary["disconnected"] == 24
    assert report.max_in_flight <= 4  # --max-queue 2 plus the batch of 2
    assert process.poll() is None


# --- what OpenAI clients really send ---------------------------------------------------------------

def _metrics(base: str, key: str | None = None) -> dict[str, float]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with urllib.request.urlopen(urllib.request.Request(base + "/metrics", headers=headers)) as response:
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in response.read().decode().splitlines()
                if line and not line.startswith("#")}


def _requests(values: dict, endpoint: str, status: int) -> float:
    return values.get(f'specdecode_requests_total{{endpoint="{endpoint}",status="{status}"}}', 0.0)


def test_fields_sent_at_their_neutral_value_are_accepted_and_change_nothing(client):
    ask = dict(model=MODEL, messages=[{"role": "user", "content": QUESTION}], temperature=0, max_tokens=8)
    plain = client.chat.completions.create(**ask).choices[0].message.content
    neutral = client.chat.completions.create(
        **ask, presence_penalty=0, frequency_penalty=0, logprobs=False, top_logprobs=0, response_format={"type": "text"},
        tools=[], tool_choice="none", parallel_tool_calls=False, store=False, user="u-1", metadata={"team": "a"},
        service_tier="auto", n=1, logit_bias={}, stream_options=None)
    assert neutral.choices[0].message.content == plain
    ask = dict(model=MODEL, prompt="The bridge closed on Monday. The bridge", temperature=0, max_tokens=8)
    plain = client.completions.create(**ask).choices[0].text
    neutral = client.completions.create(**ask, presence_penalty=0.0, frequency_penalty=0, logprobs=None, echo=False,
                                        best_of=1, n=1, logit_bias={}, user="u-1", suffix="")
    assert neutral.choices[0].text == plain


@pytest.mark.parametrize("field, value", [("functions", [{"name": "f", "parameters": {"type": "object"}}]),
                                          ("store", True)])
def test_a_value_the_server_cannot_honour_is_refused_by_name(client, field, value):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=4,
                                       **{field: value})
    error = refused.value.response.json()["error"]
    assert error["param"] == field and error["code"] == "unsupported_value" and field in error["message"]


def test_metrics_label_routes_not_urls_count_a_cancelled_stream_as_499_and_read_the_queue_live(server, client):
    base = server[0]
    for path in ("/v1/nothing/1", "/v1/nothing/2", "/favicon.ico"):
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(base + path)
    values = _metrics(base)
    assert _requests(values, "unmatched", 404) >= 3
    assert not [k for k in values if "nothing" in k or "favicon" in k]

    route = "/v1/chat/completions"
    ok, left = _requests(values, route, 200), _requests(values, route, 499)
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                            temperature=0, max_tokens=64, stream=True)
    next(iter(stream))
    assert _metrics(base)["specdecode_requests_in_flight"] == 1  # the running generation, not the scrape
    stream.close()
    deadline = time.monotonic() + 300
    while _requests(values := _metrics(base), route, 499) == left and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _requests(values, route, 499) == left + 1 and _requests(values, route, 200) == ok

    for _ in client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                            temperature=0, max_tokens=4, stream=True):
        pass
    time.sleep(0.3)  # no request in between: the scrape reads the engine now, not as the last request left it
    assert _metrics(base)["specdecode_requests_in_flight"] == 0


def test_max_tokens_beyond_the_room_the_prompt_leaves_is_refused_and_an_omitted_one_is_capped(client):
    words = WINDOW - 6  # about the window the server was given; the numbers come from the server
    ask = dict(model=MODEL, temperature=0)
    counted = []
    for create, extra, name in [
        (client.completions.create, dict(prompt="word " * words, max_tokens=64), "max_tokens"),
        (client.completions.create, dict(prompt="word " * words, max_tokens=64, stream=True), "max_tokens"),
        (client.chat.completions.create, dict(messages=[{"role": "user", "content": "word " * (words - 40)}],
                                              max_tokens=64), "max_tokens"),
        (client.chat.completions.create, dict(messages=[{"role": "user", "content": "word " * (words - 40)}],
                                              max_completion_tokens=64, stream=True), "max_completion_tokens"),
    ]:
        with pytest.raises(openai.BadRequestError) as refused:
            create(**ask, **extra)
        error = refused.value.response.json()["error"]
        prompt, max_tokens, total, window = [int(n) for n in re.findall(r"\d+", error["message"])]
        assert error["code"] == "context_length_exceeded" and error["param"] == name and name in error["message"]
        assert max_tokens == 64 and total == prompt + 64 > window > prompt
        counted.append((prompt, window))
    tokens, window = counted[0]  # of "word " * words as a raw prompt
    room = 6
    reply = client.completions.create(**ask, prompt="word " * (words - (tokens - (window - room))))  # one token a word
    assert reply.usage.prompt_tokens == window - room  # no max_tokens: the default (64 here) would not fit
    assert 0 < reply.usage.completion_tokens <= room and reply.choices[0].finish_reason in ("length", "stop")


def test_a_reply_cut_inside_a_character_never_ends_in_a_replacement_character(client):
    prompt = "🎉🎉🎉 Party! 🎉🎉🎉"  # the model goes on with 🎉, three tokens each
    texts = []
    for max_tokens in (1, 2, 4):
        whole = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=max_tokens)
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model=MODEL, prompt=prompt, temperature=0, max_tokens=max_tokens, stream=True))
        assert whole.usage.completion_tokens == max_tokens and whole.choices[0].finish_reason == "length"
        assert streamed == whole.choices[0].text
        texts.append(whole.choices[0].text)
    assert texts == ["", "", "🎉"]  # whole characters only: the cut one is held back
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "Reply with only emojis: 😀🎉🍕"}], temperature=0,
               max_tokens=4)
    content = client.chat.completions.create(**ask).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**ask, stream=True)
                       if c.choices)
    assert content == streamed and content and "\ufffd" not in content


def test_a_stream_carries_usage_only_when_asked_in_a_last_chunk_without_choices(client):
    ask = dict(model=MODEL, messages=[{"role": "user", "content": QUESTION}], temperature=0, max_tokens=8, stream=True)
    plain = list(client.chat.completions.create(**ask))
    assert all(c.usage is None for c in plain) and plain[-1].choices[0].finish_reason
    chunks = list(client.chat.completions.create(**ask, stream_options={"include_usage": True}))
    assert all(c.usage is None and c.choices for c in chunks[:-1]) and chunks[-2].choices[0].finish_reason
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 8
    assert last.usage.model_extra["speculative"]["target_calls"] >= 1
    chunks = list(client.completions.create(model=MODEL, prompt="The bridge closed on Monday. The bridge",
                                            temperature=0, max_tokens=8, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.model_extra["speculative"]["draft_tokens"] >= 0
    assert all(c.usage is None for c in chunks[:-1])


def test_accepted_per_position_has_an_entry_per_draft_position_and_the_rates_agree(client):
    def spec(gamma, draft=defaults.DRAFT):
        return client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": QUESTION}], temperature=0, max_tokens=8,
            extra_body={"specdecode": {"gamma": gamma, "draft": draft}}).usage.model_extra["speculative"]

    wide = spec(16, "trained")  # 8 tokens cannot fill 16 positions: the rest are zeros
    assert len(wide["accepted_per_position"]) == 16 and sum(wide["accepted_per_position"]) == wide["accepted_tokens"]
    assert wide["draft_tokens"] and isinstance(wide["alpha"], float) and isinstance(wide["acceptance_rate"], float)
    depth = wide["acceptance_per_depth"]
    assert len(depth) == 16 and depth == [c / wide["num_drafts"] for c in wide["accepted_per_position"]]
    assert wide["num_tree_drafts"] == 0  # a draft model proposes chains
    assert len(spec("auto")["accepted_per_position"]) == 8  # the server's --max-gamma
    none = spec(0)
    assert none["accepted_per_position"] == [] and none["draft_tokens"] == 0
    assert none["alpha"] is None and none["acceptance_rate"] is None and none["acceptance_per_depth"] is None


def test_serve_help_documents_the_default_max_tokens(capsys):
    from conftest import run_cli

    code, out, _ = run_cli(capsys, "serve", "--help")
    assert code == 0 and "without max_tokens" in " ".join(out.split()) and "min(256" in out


@pytest.mark.parametrize("host, key, warns", [("0.0.0.0", None, True), ("0.0.0.0", "k", False),
                                               ("127.0.0.1", None, False), ("localhost", None, False)])
def test_a_public_host_without_an_api_key_warns(capsys, monkeypatch, host, key, warns):
    import specdecode.cli.serve as cli
    from conftest import run_cli

    def stop(args):
        raise ValueError("stopped before loading the model")

    monkeypatch.setattr(cli, "_load_target", stop)
    monkeypatch.delenv("SPECDECODE_API_KEY", raising=False)
    if key:
        monkeypatch.setenv("SPECDECODE_API_KEY", key)
    code, _, err = run_cli(capsys, "serve", "--host", host)
    assert code == 2 and "stopped before loading" in err
    assert ("without an API key" in err) == warns


KEY = "s3cret-key"


@pytest.fixture(scope="module")
def guarded():
    """A second server: the key from the environment, two model names, one request may wait."""
    base, process = _start_server("--model-name", MODEL, "--model-name", "alias", "--max-batch", "1", "--max-queue", "1",
                                  "--max-tokens", "64", env={**os.environ, "SPECDECODE_API_KEY": KEY})
    yield base
    _stop(process)


def test_an_api_key_guards_every_route_but_health(guarded):
    good = openai.OpenAI(base_url=guarded + "/v1", api_key=KEY, max_retries=0)
    bad = openai.OpenAI(base_url=guarded + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        bad.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=4)
    error = refused.value.response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key" and error["message"]
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    for path in ("/v1/models", "/v1/nothing", "/metrics"):  # no Authorization header at all
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(guarded + path)
        assert refused.value.code == 401 and json.load(refused.value)["error"]["code"] == "invalid_api_key"
    with urllib.request.urlopen(guarded + "/health") as response:
        assert json.load(response)["status"] == "ok"
    assert good.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                        max_tokens=4).choices[0].message.content
    assert _requests(_metrics(guarded, KEY), "/v1/chat/completions", 401) == 1


def test_every_model_name_is_served_and_the_first_is_the_primary(guarded):
    client = openai.OpenAI(base_url=guarded + "/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in client.models.list()] == [MODEL, "alias"]
    reply = client.chat.completions.create(model="alias", messages=[{"role": "user", "content": QUESTION}],
                                           temperature=0, max_tokens=4)
    assert reply.model == MODEL and reply.choices[0].message.content
    with pytest.raises(openai.NotFoundError) as refused:
        client.chat.completions.create(model="other", messages=[{"role": "user", "content": QUESTION}], max_tokens=4)
    assert "'alias'" in refused.value.response.json()["error"]["message"]


def test_the_429_message_counts_one_waiting_request_in_the_singular(guarded):
    client = openai.OpenAI(base_url=guarded + "/v1", api_key=KEY, max_retries=0)
    streams = [client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                              temperature=0, max_tokens=64, stream=True) for _ in range(2)]
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=4)
    assert "1 request is waiting" in refused.value.response.json()["error"]["message"]
    for stream in streams:
        stream.close()


def test_create_app_takes_the_key_aliases_and_an_open_metrics_route():
    from types import SimpleNamespace

    from starlette.testclient import TestClient

    from specdecode.server.app import create_app
    from test_server_input import Tokenizer

    engine = SimpleNamespace(target=SimpleNamespace(tokenizer=Tokenizer()), in_flight=0, drafts=[], on_finish=None)
    app = create_app(engine, "a", aliases=["b"], api_key=KEY, metrics_open=True)
    with TestClient(app) as http:
        assert http.get("/metrics").status_code == 200
        assert http.get("/v1/models").status_code == 401
        listed = http.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()
        assert [m["id"] for m in listed["data"]] == ["a", "b"]
    with TestClient(create_app(engine, "a", api_key=KEY)) as http:
        assert http.get("/metrics").status_code == 401
    with pytest.raises(ValueError):
        create_app(engine, "a", api_key="")


def test_developer_role_and_model_retrieval_as_newer_openai_clients_send_them(server, client):
    as_system = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=8, messages=[
        {"role": "system", "content": "Answer in one word."}, {"role": "user", "content": QUESTION}])
    as_developer = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=8, messages=[
        {"role": "developer", "content": "Answer in one word."}, {"role": "user", "content": QUESTION}])
    assert as_developer.choices[0].message.content == as_system.choices[0].message.content
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("other")
    assert missing.value.response.json()["error"]["code"] == "model_not_found"
    values = _metrics(server[0])
    assert _requests(values, "/v1/models/{model_id}", 200) >= 1 and _requests(values, "/v1/models/{model_id}", 404) >= 1


def test_a_temperature_below_float_range_decodes_as_its_limit_beside_others(server, client):
    """temperature 1e-40 once failed its whole batch (NaN probabilities): it is the greedy limit now,
    and the greedy requests decoding beside it keep their own output."""
    ask = lambda **extra: client.chat.completions.create(  # noqa: E731
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=12, **extra)
    alone = ask(temperature=0).choices[0].message.content
    with ThreadPoolExecutor(2) as pool:
        tiny, greedy = pool.map(lambda t: ask(temperature=t, seed=1), [1e-40, 0])
    assert greedy.choices[0].message.content == alone == tiny.choices[0].message.content


def test_completion_prompts_as_token_ids_and_tokenize_round_trips(server, client):
    """Evaluation tools send completion prompts as token ids: the same ids as text give the same reply."""
    base = server[0]
    text = "The capital of France is"
    status, ids, _ = post(base, "/tokenize", {"content": text})
    assert status == 200 and ids["count"] == len(ids["tokens"]) > 0
    status, back, _ = post(base, "/detokenize", {"tokens": ids["tokens"]})
    assert status == 200 and back["content"] == text
    as_text = client.completions.create(model=MODEL, prompt=text, max_tokens=8, temperature=0)
    as_ids = client.completions.create(model=MODEL, prompt=ids["tokens"], max_tokens=8, temperature=0)
    assert as_ids.choices[0].text == as_text.choices[0].text
    assert as_ids.usage.prompt_tokens == as_text.usage.prompt_tokens == len(ids["tokens"])
    for body, param in (({"model": MODEL, "prompt": [10**9]}, "prompt"), ({"model": MODEL, "prompt": [[1], []]}, "prompt[1]"),
                        ({"model": MODEL, "prompt": [1, "a"]}, "prompt")):
        status, error, _ = post(base, "/v1/completions", body)
        assert status == 400 and error["error"]["param"] == param, error
    assert post(base, "/detokenize", {"tokens": [-1]})[0] == 400
    assert post(base, "/tokenize", {"content": 5})[0] == 400


def test_prompt_rows_and_prefix_memory_reach_the_batch_and_a_bad_value_is_refused_by_name():
    from specdecode.cli.parser import build_parser
    from specdecode.cli.serve import serve_options
    from specdecode.server.engine import Engine
    from toy import ToyModel

    parse = build_parser().parse_args
    assert serve_options(parse(["serve", "--prompt-rows", "32"])).prompt_rows == 32
    with pytest.raises(ValueError, match="prompt.rows"):
        serve_options(parse(["serve", "--prompt-rows", "0"]))
    assert serve_options(parse(["serve", "--prefix-memory", "16"])).prefix_memory == 16
    assert serve_options(parse(["serve"])).prefix_memory == 1024
    with pytest.raises(ValueError, match="prefix.memory"):
        serve_options(parse(["serve", "--prefix-memory", "-1"]))
    engine = Engine(ToyModel(8, seed=1), {"lookup": "lookup"}, "lookup", prompt_rows=32)
    try:
        assert engine._batch.scheduler.prompt_rows == 32
    finally:
        engine.close()


def _library_logprobs(prompt_ids: list[int], max_tokens: int, top: int):
    """The library's greedy plain decoding of the embedded model with each token's log-probabilities."""
    from specdecode import SamplingParams, autoregressive_decode
    from specdecode.models.load import load_model

    target = load_model(None)
    return target, [lp for step in autoregressive_decode(target, prompt_ids, params=SamplingParams(temperature=0),
                                                         max_new_tokens=max_tokens, logprobs=top)
                    for lp in step.logprobs]


def test_logprobs_through_the_openai_client_equal_the_librarys_plain_decoding(client):
    """Chat `logprobs: true` with `top_logprobs`, and completions' `logprobs: k` on a token-id prompt
    (what evaluation tools send), streamed and not: the target's own log-probabilities of the emitted
    tokens, the same as plain decoding by the library (the server speculates with prompt lookup)."""
    from specdecode.prompts import encode_chat

    messages = [{"role": "user", "content": QUESTION}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=12,
                                          logprobs=True, top_logprobs=3)
    target, _ = _library_logprobs([1], 1, 0)
    _, expected = _library_logprobs(encode_chat(target.tokenizer, messages), 12, 3)
    content = chat.choices[0].logprobs.content
    assert [c.token for c in content] == [target.tokenizer.decode([e.token]) for e in expected]
    assert all(abs(c.logprob - e.logprob) < 1e-6 and len(c.top_logprobs) == 3 for c, e in zip(content, expected))
    assert "".join(c.token for c in content) == chat.choices[0].message.content
    streamed = [lp for chunk in client.chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                                                max_tokens=12, logprobs=True, top_logprobs=3,
                                                                stream=True)
                if chunk.choices and chunk.choices[0].logprobs for lp in chunk.choices[0].logprobs.content]
    assert [(c.token, c.logprob) for c in streamed] == [(c.token, c.logprob) for c in content]

    prompt = target.tokenizer.encode("The bridge closed on Monday. The bridge")
    completion = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=8, logprobs=0)
    _, expected = _library_logprobs(prompt, 8, 0)
    got = completion.choices[0].logprobs
    assert all(abs(a - e.logprob) < 1e-6 for a, e in zip(got.token_logprobs, expected)) and len(got.tokens) == 8
    assert got.text_offset[0] == 0 and got.top_logprobs == [{}] * 8
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, top_logprobs=2)
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, logprobs=21)


def test_echo_gives_the_prompts_log_probabilities_as_log_likelihood_evaluation_asks(client):
    """A completion with a token-id prompt, echo, logprobs 1 and one token (as lm-evaluation-harness's
    local-completions model sends for a log-likelihood): the prompt's text and its tokens'
    log-probabilities (the first has none), then the completion's; equal to one forward in this process."""
    from specdecode.models.load import load_model

    target = load_model(None)
    prompt = target.tokenizer.encode("The bridge closed on Monday. The bridge reopened on")
    response = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0, logprobs=1,
                                         echo=True)
    got = response.choices[0].logprobs
    assert response.choices[0].text.startswith(target.tokenizer.decode(prompt))
    assert len(got.tokens) == len(prompt) + 1 and got.token_logprobs[0] is None and got.top_logprobs[0] is None
    from specdecode.models.base import request_cache

    logits = target.forward(torch.tensor([prompt]), request_cache(target, len(prompt)))[0].double()
    expected = torch.log_softmax(logits, -1)[:-1].gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
    assert all(abs(a - e) < 1e-6 for a, e in zip(got.token_logprobs[1 : len(prompt)], expected.tolist()))
    assert got.text_offset == sorted(got.text_offset) and all(len(t) == 1 for t in got.top_logprobs[1:])
    with pytest.raises(openai.BadRequestError, match="echo"):
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, echo=True, stream=True)


def test_several_prompts_in_one_completions_request_get_a_choice_each_as_alone(client):
    """A list of prompts (strings or token-id lists, as OpenAI's API and evaluation tools send them):
    one choice per prompt, in order, each the text that prompt gets alone; token counts summed. More
    prompts than the server batches (--max-batch 2 here) are refused by name."""
    texts = ["The bridge closed on Monday. The bridge", "Water boils at"]
    alone = [client.completions.create(model=MODEL, prompt=p, temperature=0, max_tokens=6) for p in texts]
    together = client.completions.create(model=MODEL, prompt=texts, temperature=0, max_tokens=6)
    assert [c.index for c in together.choices] == [0, 1]
    assert [c.text for c in together.choices] == [a.choices[0].text for a in alone]
    assert together.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert together.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    assert len(together.usage.model_extra["speculative"]) == 2
    with pytest.raises(openai.BadRequestError, match="at most 2"):
        client.completions.create(model=MODEL, prompt=texts + ["A third"], max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="stream"):
        client.completions.create(model=MODEL, prompt=texts, max_tokens=2, stream=True)


def test_tokenizer_info_names_the_special_tokens_that_tokenize_maps_to_the_models_ids(server):
    base = server[0]
    with urllib.request.urlopen(base + "/tokenizer_info", timeout=60) as response:
        info = json.loads(response.read())
    assert info["chat_template"] and info["model_max_length"] > 0
    status, ids, _ = post(base, "/tokenize", {"prompt": info["eos_token"], "add_special_tokens": False})
    assert status == 200 and len(ids["tokens"]) == 1
    status, back, _ = post(base, "/detokenize", {"tokens": ids["tokens"]})
    assert status == 200 and back["prompt"] == info["eos_token"]


def _metric(base: str, name: str) -> float:
    """A sample of /metrics by its name with labels, as the exposition writes it (0 where absent)."""
    with urllib.request.urlopen(base + "/metrics") as response:
        lines = [line.rsplit(" ", 1) for line in response.read().decode().splitlines() if not line.startswith("#")]
    return next((float(value) for key, value in lines if key == name), 0.0)


def test_a_client_that_leaves_a_non_streamed_request_stops_it_and_max_tokens_reaches_the_window():
    """A raw socket that sends a 2,000-token request (past the old 1,024 cap: the default now allows
    what the context window holds) and closes, and a client that times out: each request is cancelled
    (the engine frees its slot before its next forward), counted as 499, and generates a small part
    of what it asked for, however fast the host."""
    base, process = _start_server("--model-name", MODEL, "--max-batch", "2")
    try:
        port = int(base.rsplit(":", 1)[1])
        left = 'specdecode_requests_total{endpoint="/v1/completions",status="499"}'
        before = _metric(base, "specdecode_generation_tokens_total")
        body = json.dumps({"model": MODEL, "prompt": "Count: 1, 2, 3,", "max_tokens": 2000, "temperature": 0,
                           "specdecode": {"gamma": 0}}).encode()
        with socket.create_connection(("127.0.0.1", port)) as raw:
            raw.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n" % len(body) + body)
            time.sleep(1.0)
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=1.0)
        with pytest.raises(openai.APITimeoutError):
            client.completions.create(model=MODEL, prompt="Count: 1, 2, 3,", max_tokens=2000, temperature=0,
                                      extra_body={"specdecode": {"gamma": 0}})
        def in_flight() -> int:
            with urllib.request.urlopen(base + "/health") as response:
                return json.load(response)["in_flight"]

        deadline = time.monotonic() + 120  # a bound on waiting, generous: the asserts below decide
        while (_metric(base, left) < 2 or in_flight()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _metric(base, left) == 2 and in_flight() == 0
        generated = _metric(base, "specdecode_generation_tokens_total") - before
        assert 0 < generated < 2000  # both stopped early: 4,000 tokens asked for
        reply = post(base, "/v1/completions", {"model": MODEL, "prompt": "Count: 1, 2, 3,", "max_tokens": 1500,
                                               "temperature": 0, "stop": ["10"]})
        assert reply[0] == 200 and reply[1]["choices"][0]["finish_reason"] == "stop"
    finally:
        _stop(process)


def test_sampling_controls_reshape_the_reply_and_speculation_keeps_it(server, client):
    """logit_bias, penalties and min_p as clients send them: the reply's first token banned never
    starts it, each control changes the greedy reply, and the reply is the same with speculation as
    with gamma 0 (plain decoding)."""
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "Repeat exactly: one two one two one two"}],
               temperature=0, max_tokens=24)
    plain = client.chat.completions.create(**ask).choices[0].message.content
    banned = post(server[0], "/tokenize", {"content": plain, "add_special": False})[1]["tokens"][0]
    for controls in ({"logit_bias": {str(banned): -100}}, {"presence_penalty": 1.5, "frequency_penalty": 0.5},
                     {"repetition_penalty": 1.5, "min_p": 0.05}, {"repeat_penalty": 1.5}):
        speculative, alone = (client.chat.completions.create(**ask, extra_body={**controls, "specdecode": {"gamma": g}})
                              .choices[0].message.content for g in ("auto", 0))
        assert speculative == alone and speculative != plain, controls
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**ask, logit_bias={"999999": 1})
    assert refused.value.response.json()["error"]["param"] == "logit_bias"


def test_n_choices_decode_together_each_with_its_own_seed_and_usage_counts_the_prompt_once(client):
    """n up to --max-batch (2 on this server): the choices decode together, choice i on seed + i.
    Plain decoding (gamma 0) draws one number a token, so each choice is the reply its seed gets
    alone; with speculation the draws depend on how many tokens each call verified, so a choice is
    another exact sample."""
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "Tell me a one-line joke."}], temperature=1.0,
               max_tokens=16, seed=7)
    plain = {"specdecode": {"gamma": 0}}
    reply = client.chat.completions.create(**ask, n=2, extra_body=plain)
    assert [c.index for c in reply.choices] == [0, 1]
    alone = [client.chat.completions.create(**{**ask, "seed": 7 + i}, extra_body=plain) for i in range(2)]
    assert [c.message.content for c in reply.choices] == [a.choices[0].message.content for a in alone]
    assert alone[0].choices[0].message.content != alone[1].choices[0].message.content  # two seed streams
    assert reply.usage.prompt_tokens == alone[0].usage.prompt_tokens  # the prompt counted once
    assert reply.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    speculative = client.chat.completions.create(**ask, n=2)
    assert len(speculative.choices) == 2 and all(c.message.content for c in speculative.choices)
    timings = alone[0].model_extra["timings"]
    assert timings["prompt_n"] == alone[0].usage.prompt_tokens
    assert timings["predicted_n"] == alone[0].usage.completion_tokens and timings["draft_n"] == 0


class City(__import__("pydantic").BaseModel):
    name: str
    country: str
    founded_year: int


def test_a_pydantic_model_through_openais_parse_comes_back_valid(client):
    """openai's chat.completions.parse sends the model's strict JSON schema as response_format; the
    reply must parse into it (the tokens the schema forces cost no call of their own)."""
    reply = client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": "Describe Paris."}],
                                          response_format=City, temperature=0, max_tokens=64)
    city = reply.choices[0].message.parsed
    assert isinstance(city, City) and city.name and reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens < 64


def test_json_object_streamed_and_a_regex_are_followed(server, client):
    question = 'What is 2 + 2? Answer in JSON as {"answer": number}.'
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                            response_format={"type": "json_object"}, temperature=0,
                                            max_tokens=64, stream=True)
    chunks = [chunk.choices[0] for chunk in stream if chunk.choices]
    text = "".join(choice.delta.content or "" for choice in chunks)
    assert chunks[-1].finish_reason == "stop" and isinstance(json.loads(text), dict), text
    status, body, _ = post(server[0], "/v1/completions", {"model": MODEL, "prompt": "My phone number is",
                                                          "max_tokens": 20, "specdecode": {"regex": r" \d{3}-\d{4}"}})
    assert status == 200 and re.fullmatch(r" \d{3}-\d{4}", body["choices"][0]["text"]), body
    # with log-probabilities: one per token of the reply, the target's own
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                           response_format={"type": "json_object"}, temperature=0, max_tokens=64,
                                           logprobs=True, top_logprobs=2)
    choice = reply.choices[0]
    assert "".join(t.token for t in choice.logprobs.content).startswith(choice.message.content)
    assert len(choice.logprobs.content) == reply.usage.completion_tokens


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"specdecode": {"grammar": "start: missing_rule"}}, "specdecode.grammar"),
])
def test_unusable_grammars_are_400s_naming_the_field(server, extra, param):
    status, body, _ = post(server[0], "/v1/chat/completions", chat(**extra))
    assert status == 400 and body["error"]["param"] == param, body


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city now.",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"},
                                                "unit": {"enum": ["celsius", "fahrenheit"]}},
                                                "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}}}


def test_a_required_or_named_tool_call_comes_back_as_tool_calls(client):
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "What is the weather in Oslo, in celsius?"}],
               tools=[WEATHER, TIME], temperature=0, max_tokens=64)
    for choice, names in (("required", {"get_weather", "get_time"}),
                          ({"type": "function", "function": {"name": "get_weather"}}, {"get_weather"})):
        reply = client.chat.completions.create(**ask, tool_choice=choice).choices[0]
        call = reply.message.tool_calls[0]
        assert reply.finish_reason == "tool_calls" and reply.message.content is None
        assert call.type == "function" and call.id.startswith("call_") and call.function.name in names
        arguments = json.loads(call.function.arguments)
        if call.function.name == "get_weather":
            assert set(arguments) == {"city", "unit"} and arguments["unit"] in ("celsius", "fahrenheit")
    # streamed: the call arrives as tool_calls deltas, as OpenAI streams them
    chunks = [c.choices[0] for c in client.chat.completions.create(**ask, tool_choice="required", stream=True)
              if c.choices]
    calls = [d for c in chunks for d in (c.delta.tool_calls or [])]
    assert chunks[-1].finish_reason == "tool_calls" and calls[0].function.name in {"get_weather", "get_time"}
    json.loads("".join(d.function.arguments or "" for d in calls))


def test_a_conversation_with_calls_and_results_continues_and_auto_may_answer_in_text(client):
    messages = [{"role": "user", "content": "What is the weather in Oslo?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "celsius"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21, "sky": "clear"}'}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], temperature=0,
                                           max_tokens=32).choices[0]
    if reply.message.tool_calls:  # auto: a call, held to the schema
        assert reply.finish_reason == "tool_calls"
        json.loads(reply.message.tool_calls[0].function.arguments)
    else:
        assert reply.message.content and reply.finish_reason in ("stop", "length")
    none = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], tool_choice="none",
                                          temperature=0, max_tokens=16).choices[0]
    assert none.message.tool_calls is None and none.message.content


@pytest.mark.parametrize("extra, param", [
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
])
def test_bad_tools_are_400s_naming_the_field(server, extra, param):
    status, body, _ = post(server[0], "/v1/chat/completions", chat(**extra))
    assert status == 400 and body["error"]["param"] == param, body


def test_langchain_binds_tools_and_gets_structured_output(server):
    """What agent frameworks send: langchain's bind_tools (a forced call) and with_structured_output
    (json_schema, and json_mode)."""
    chat_models = pytest.importorskip("langchain_openai")
    model = chat_models.ChatOpenAI(base_url=server[0] + "/v1", api_key="unused", model=MODEL, temperature=0,
                                   max_tokens=64, max_retries=0)
    ai = model.bind_tools([WEATHER], tool_choice="get_weather").invoke("What is the weather in Oslo, in celsius?")
    assert ai.tool_calls[0]["name"] == "get_weather" and set(ai.tool_calls[0]["args"]) == {"city", "unit"}
    city = model.with_structured_output(City, method="json_schema").invoke("Describe Paris.")
    assert isinstance(city, City) and city.name
    loose = model.with_structured_output(method="json_mode").invoke(
        'What is 2 + 2? Answer in JSON as {"answer": number}.')
    assert isinstance(loose, dict)


def test_auto_streams_text_as_text_and_a_call_as_a_call(client):
    """tool_choice auto, streamed: a reply that is text arrives as content deltas; one that is a call
    arrives as a tool_calls delta (its first characters decide)."""
    for content in ("Say hello to Ana.", "Call get_weather for Oslo in celsius."):
        chunks = [c.choices[0] for c in client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": content}], tools=[WEATHER], temperature=0,
            max_tokens=48, stream=True) if c.choices]
        text = "".join(c.delta.content or "" for c in chunks)
        calls = [d for c in chunks for d in (c.delta.tool_calls or [])]
        assert bool(calls) != bool(text.strip()), (text, calls)
        if calls:
            assert chunks[-1].finish_reason == "tool_calls" and json.loads(calls[0].function.arguments)
        else:
            assert chunks[-1].finish_reason in ("stop", "length")


def test_llama_servers_speculative_fields_cap_and_turn_off_the_draft_per_request(client, server):
    """speculative.n_max caps every call's draft (0: none), as an object or llama-server's flat keys;
    the greedy text stays the same; bad values are 400s naming the field."""
    ask = chat("Repeat exactly: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat.",
               max_tokens=32, specdecode={"gamma": 8})
    status, free, _ = post(server[0], "/v1/chat/completions", ask)
    status_off, off, _ = post(server[0], "/v1/chat/completions", {**ask, "speculative": {"n_max": 0}})
    status_two, two, _ = post(server[0], "/v1/chat/completions", {**ask, "speculative.n_max": 2, "speculative.n_min": 1})
    assert status == status_off == status_two == 200
    assert off["usage"]["speculative"]["draft_tokens"] == 0 and off["timings"]["draft_n"] == 0
    capped = two["usage"]["speculative"]
    assert 0 < capped["draft_tokens"] <= 2 * capped["num_drafts"] and len(capped["accepted_per_position"]) == 2
    assert free["usage"]["speculative"]["draft_tokens"] > 2 * free["usage"]["speculative"]["num_drafts"]
    texts = {r["choices"][0]["message"]["content"] for r in (free, off, two)}
    assert len(texts) == 1
    for body, param in (({"speculative": {"n_max": -1}}, "speculative.n_max"),
                        ({"speculative": {"p_min": 1.5}}, "speculative.p_min"),
                        ({"speculative": {"depth": 3}}, "speculative.depth"),
                        ({"speculative": 3}, "speculative")):
        status, error, _ = post(server[0], "/v1/chat/completions", {**ask, **body})
        assert status == 400 and error["error"]["param"] == param, (body, error)


def test_best_of_returns_the_choice_with_the_highest_mean_log_probability_and_counts_every_choice(client):
    ask = dict(model=MODEL, prompt="A short story about a fox:", temperature=1.0, max_tokens=12, seed=11,
               extra_body={"specdecode": {"gamma": 0}})
    both = client.completions.create(**ask, n=2, logprobs=0)
    means = [sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs) for c in both.choices]
    best = client.completions.create(**ask, best_of=2)
    assert len(best.choices) == 1 and best.choices[0].logprobs is None
    assert best.choices[0].text == both.choices[means.index(max(means))].text
    assert best.usage.completion_tokens == both.usage.completion_tokens  # every choice decoded counts
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(**ask, best_of=2, stream=True)
    assert refused.value.response.json()["error"]["param"] == "best_of"


def test_speculative_p_min_stops_a_draft_model_below_that_confidence(server):
    """p_min reaches the draft model of the request's draft (its min_confidence): a higher bar drafts
    fewer tokens, the greedy text the same."""
    ask = chat("Write two sentences about the sea.", max_tokens=32, specdecode={"draft": "trained", "gamma": 6})
    replies = [post(server[0], "/v1/chat/completions", {**ask, "speculative": {"p_min": p}})[1] for p in (0.0, 0.95)]
    drafted = [r["usage"]["speculative"]["draft_tokens"] for r in replies]
    assert drafted[1] < drafted[0], drafted
    assert replies[0]["choices"][0]["message"]["content"] == replies[1]["choices"][0]["message"]["content"]
