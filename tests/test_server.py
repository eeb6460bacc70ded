"""`specdecode serve` on 127.0.0.1 with the embedded model, driven by the official openai client."""

import json
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow
MODEL = "smol"
QUESTION = "What is the capital of France?"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "specdecode", "serve", "--port", str(port), "--model-name", MODEL, "--max-queue", "2",
         "--max-tokens", "64", "--also-draft", "trained", "--max-body-bytes", "200000"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
    yield base, process
    process.terminate()
    process.wait(timeout=30)


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
    cli = subprocess.run([sys.executable, "-m", "specdecode", "generate", QUESTION, "--max-new-tokens", "16", "--json"],
                         capture_output=True, text=True, timeout=600)
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
    assert spec["draft"] == "lookup" and spec["gamma"] == "auto"  # the server's default


def test_streamed_chat_and_completions_match_the_unstreamed_text(client):
    whole = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                           temperature=0, max_tokens=16).choices[0].message.content
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                                 temperature=0, max_tokens=16, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
    last = chunks[-1]
    assert last.choices[0].finish_reason in ("stop", "length")
    assert last.usage.model_extra["speculative"]["target_calls"] >= 1
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
    (chat(messages=[{"role": "user", "content": "  "}]), None, 400, "invalid_value"),
    (chat(temperature=3), None, 400, "invalid_value"),
    (chat(temperature="hot"), None, 400, "invalid_type"),
    (chat(top_p=0), None, 400, "invalid_value"),
    (chat(max_tokens=0), None, 400, "invalid_value"),
    (chat(max_tokens=65), None, 400, "invalid_value"),
    (chat(max_tokens=2.5), None, 400, "invalid_type"),
    (chat(n=2), None, 400, "unsupported_value"),
    (chat(stream="yes"), None, 400, "invalid_type"),
    (chat(stop=["a", "b", "c", "d", "e"]), None, 400, "invalid_value"),
    (chat(stop=[""]), None, 400, "invalid_value"),
    (chat(seed="x"), None, 400, "invalid_type"),
    (chat(logprobs=True), None, 400, "unsupported_parameter"),
    (chat(frequency_penalty=0.5), None, 400, "unsupported_parameter"),
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
    if code == "context_length_exceeded":  # names both numbers: the prompt's tokens, then the window
        numbers = [int(n) for n in re.findall(r"\d+", error["message"])]
        assert len(numbers) == 2 and numbers[0] > numbers[1] >= 2048


def test_completions_refuse_a_missing_prompt_and_unknown_routes_are_openai_errors(server):
    got, payload, _ = post(server[0], "/v1/completions", {"model": MODEL})
    assert got == 400 and payload["error"]["param"] == "prompt"
    got, payload, _ = post(server[0], "/v1/nothing", {})
    assert got == 404 and payload["error"]["code"] == "not_found"


def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list()] == [MODEL]
    with urllib.request.urlopen(server[0] + "/health") as response:
        health = json.load(response)
    assert health["status"] == "ok" and health["drafts"] == ["lookup", "trained"]
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}], temperature=0,
                                   max_tokens=8)
    with urllib.request.urlopen(server[0] + "/metrics") as response:
        text = response.read().decode()
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    assert values["specdecode_spec_decode_num_draft_tokens_total"] >= values["specdecode_spec_decode_num_accepted_tokens_total"]
    assert values["specdecode_generation_tokens_total"] >= 8
    assert values['specdecode_spec_decode_num_accepted_tokens_per_pos_total{position="0"}'] >= 1
    assert values["specdecode_time_to_first_token_seconds_count"] >= 1
    assert 'specdecode_requests_total{endpoint="/v1/chat/completions",status="400"}' in values


def test_a_full_queue_answers_429_and_a_client_that_leaves_frees_its_slot(server, client):
    # One runs, two wait (--max-queue 2): the fourth is refused with Retry-After.
    streams = [client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                              temperature=0, max_tokens=64, stream=True) for _ in range(3)]
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=4)
    assert int(refused.value.response.headers["retry-after"]) >= 1
    assert refused.value.response.json()["error"]["code"] == "queue_full"
    for stream in streams:  # every client walks away after the first chunk
        next(iter(stream))
        stream.close()
    deadline = time.monotonic() + 60
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
    from loadtest import run_load

    base, process = server
    report = run_load(base + "/v1", MODEL, requests=24, concurrency=6, max_tokens=8, server_pid=process.pid,
                      deadline_seconds=600)
    summary = report.summary()
    assert summary["failures"] == 0, summary
    assert summary["disconnected"] >= 1 and summary["completed"] + summary["disconnected"] == 24
    assert report.max_in_flight <= 3  # --max-queue 2 plus the running one
    assert process.poll() is None
