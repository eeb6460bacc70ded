"""The server against its own OpenAPI description: schemathesis generates requests from
/openapi.json (every route, a bounded, derandomized run) and none may get a server error (5xx);
the server answers after them, and a good request still gets its text."""

import json
import urllib.request

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402

from test_server import MODEL, _start_server, _stop  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():
    base, process = _start_server("--model-name", MODEL, "--max-tokens", "4", "--max-batch", "2", "--max-queue", "8")
    yield base
    _stop(process)


@pytest.fixture(scope="module")
def api(server):
    return schemathesis.openapi.from_url(server + "/openapi.json")


def test_no_generated_request_gets_a_server_error(api, server):
    """60 requests an operation, generated from the schema (valid and, by schemathesis's own
    mutations, invalid ones), derandomized: each answered below 500."""
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 8
    for operation in operations:
        @given(case=operation.as_strategy())
        @settings(max_examples=60, derandomize=True, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def answered_below_500(case):
            response = case.call(base_url=server, timeout=120)
            assert response.status_code < 500, (operation.label, case.body, response.text[:500])

        answered_below_500()


def test_the_server_described_every_route_and_still_serves(server):
    with urllib.request.urlopen(server + "/openapi.json", timeout=60) as response:
        paths = json.loads(response.read())["paths"]
    assert {"/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"} <= set(paths)
    assert "requestBody" in paths["/v1/completions"]["post"]
    body = json.dumps({"model": MODEL, "prompt": "Water boils at", "max_tokens": 2, "temperature": 0}).encode()
    request = urllib.request.Request(server + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200 and json.loads(response.read())["choices"][0]["text"]
