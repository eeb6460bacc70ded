"""What clients and fuzzers send that is not a good request, against the app over a stub engine (no
model): every input gets a 4xx naming its problem, a server bug answers a 500 without dropping the
client's kept-alive connection, a 405 says which methods the route takes, and /openapi.json
documents every status each route answers."""

from __future__ import annotations

import http.client as httpclient
import json
import socket
import threading
import time
from types import SimpleNamespace

import pytest

fastapi = pytest.importorskip("fastapi")
from starlette.testclient import TestClient  # noqa: E402

from specdecode.server.app import create_app  # noqa: E402
from specdecode.server.request import MAX_DEPTH, RequestError, parse_request  # noqa: E402


class Tokenizer:
    """One token a character (ids below 128): enough for the server's checks."""

    def __len__(self) -> int:
        return 128

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) % 128 for c in text]

    def decode(self, ids) -> str:
        return "".join(chr(i) for i in ids)


class Engine:
    """Refuses every job with a bug of its own (`broken`) or with a 429, so nothing decodes."""

    def __init__(self, broken: bool = False) -> None:
        self.target = SimpleNamespace(tokenizer=Tokenizer(), max_positions=64)
        self.in_flight, self.drafts, self.default_draft, self.gamma, self.max_gamma = 0, ["lookup"], "lookup", "auto", 8
        self.broken = broken

    def submit(self, job) -> None:
        if self.broken:
            raise RuntimeError("a bug in the engine")
        raise RequestError(429, "busy", None, "queue_full")


@pytest.fixture
def http():
    with TestClient(create_app(Engine(), "m")) as client:
        yield client


def nested(depth: int) -> str:
    """JSON text of a 1 inside `depth` arrays (too deep for Python's own encoder to write)."""
    return "[" * depth + "1" + "]" * depth


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"])
def test_json_nested_past_the_limit_is_a_400_naming_the_limit_on_every_post_route(http, route):
    for where in ("top", "metadata", "specdecode"):
        body = nested(1000) if where == "top" else f'{{"model": "m", "prompt": "hi", "{where}": {{"x": {nested(1000)}}}}}'
        reply = http.post(route, content=body)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["code"] == "invalid_json" and f"at most {MAX_DEPTH}" in error["message"]
    # brackets inside strings are text, not nesting
    reply = http.post("/tokenize", json={"content": "[" * 5000})
    assert reply.status_code == 200 and reply.json()["count"] == 5000
    # as deep as the limit allows: parsed, then refused for what it is (not JSON nesting)
    reply = http.post(route, content=f'{{"model": "m", "metadata": {{"x": {nested(MAX_DEPTH - 2)}}}}}')
    assert reply.status_code == 400 and reply.json()["error"]["code"] != "invalid_json"


@pytest.mark.parametrize("route, body, param", [
    ("/v1/completions", '{"model": "m", "prompt": "hi \\ud800 x"}', "prompt"),
    ("/tokenize", '{"content": "a\\ud800"}', "content"),
    ("/v1/chat/completions", '{"model": "m", "messages": [{"role": "user", "content": "a\\udfff"}]}',
     "messages[0].content"),
    ("/v1/chat/completions", '{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", '
                             '"text": "\\ud83d"}]}]}', "messages[0].content[0].text"),
])
def test_a_lone_surrogate_is_a_400_naming_the_field(http, route, body, param):
    reply = http.post(route, content=body, headers={"content-type": "application/json"})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and "lone surrogate" in error["message"] and error["code"] == "invalid_value"


def test_a_surrogate_pair_is_one_character_and_passes(http):
    reply = http.post("/tokenize", content='{"content": "\\ud83d\\ude00"}')
    assert reply.status_code == 200 and reply.json()["count"] == 1


def test_a_405_names_the_methods_the_route_takes(http):
    reply = http.get("/v1/completions")
    assert reply.status_code == 405 and reply.headers["allow"] == "POST"
    assert reply.json()["error"]["code"] == "method_not_allowed"


def test_tokenize_needs_its_text_and_refuses_unknown_fields(http):
    assert http.post("/tokenize", json={}).json()["error"]["code"] == "missing_required_parameter"
    assert http.post("/tokenize", json={"content": "a", "extra": 1}).json()["error"]["param"] == "extra"
    assert http.post("/tokenize", json={"content": "a", "prompt": {}}).json()["error"]["param"] == "prompt"
    assert http.post("/detokenize", json={"tokens": [104.0, 105]}).json()["content"] == "hi"  # 104.0 is an integer
    assert http.post("/detokenize", json={"tokens": [1], "x": 0}).status_code == 400


def test_the_openapi_description_documents_every_status_each_route_answers(http):
    paths = http.get("/openapi.json").json()["paths"]
    generation = paths["/v1/completions"]["post"]["responses"]
    assert {"200", "400", "404", "413", "429", "500"} == set(generation)
    assert set(generation["200"]["content"]) == {"application/json", "text/event-stream"}
    assert generation["400"]["content"]["application/json"]["schema"]["required"] == ["error"]
    assert "text/plain" in paths["/metrics"]["get"]["responses"]["200"]["content"]
    assert not any("422" in op["responses"] for path in paths.values() for op in path.values())
    assert "401" not in generation  # no API key here: nothing answers 401
    with TestClient(create_app(Engine(), "m", api_key="k")) as keyed:
        described = keyed.get("/openapi.json", headers={"Authorization": "Bearer k"}).json()["paths"]
        assert "401" in described["/v1/completions"]["post"]["responses"]
        assert "401" not in described["/health"]["get"]["responses"]


def _serve(app):
    """The app under uvicorn on a free port of 127.0.0.1, in a thread: (port, server)."""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    return port, server


def test_a_server_bug_answers_500_and_the_kept_alive_connection_still_serves(caplog):
    import re

    port, server = _serve(create_app(Engine(broken=True), "m"))
    try:
        connection = httpclient.HTTPConnection("127.0.0.1", port, timeout=30)
        with caplog.at_level("ERROR"):
            connection.request("POST", "/v1/completions", body=json.dumps({"model": "m", "prompt": "hi"}),
                               headers={"Content-Type": "application/json"})
            reply = connection.getresponse()
            body = json.loads(reply.read())
        assert reply.status == 500 and reply.getheader("connection") != "close"
        rid = re.search(r"\((err-[0-9a-f]{16})\)", body["error"]["message"]).group(1)
        logged = [r for r in caplog.records if rid in r.getMessage()]
        assert logged and logged[0].exc_info is not None  # the log line carries the id and the traceback
        sock = connection.sock
        connection.request("GET", "/v1/models")  # the same connection, not a new one
        reply = connection.getresponse()
        assert reply.status == 200 and json.loads(reply.read())["data"][0]["id"] == "m"
        assert connection.sock is sock
    finally:
        server.should_exit = True


def test_the_repetition_penalty_reads_what_its_names_server_reads():
    """llama-server's repeat_penalty reads the last 64 tokens, vLLM's repetition_penalty all of them;
    repeat_last_n sets either's window, and a window below -1 is a 400 naming it."""
    def window(**fields):
        body = {"model": "m", "prompt": "hi", **fields}
        return parse_request(body, "completion").settings.params.repeat_last_n

    assert window(repeat_penalty=1.1) == 64 and window(repetition_penalty=1.1) == -1
    assert window(repeat_penalty=1.1, repeat_last_n=-1) == -1 and window(repetition_penalty=1.1, repeat_last_n=8) == 8
    for bad in (-2, 2**31, 1.5, "64"):
        with pytest.raises(RequestError) as refused:
            window(repeat_penalty=1.1, repeat_last_n=bad)
        assert refused.value.status == 400 and refused.value.param == "repeat_last_n"
