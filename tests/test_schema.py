"""The server against its own OpenAPI description: schemathesis generates requests from
/openapi.json (every route; valid ones, and by its own mutations invalid ones) and runs every check
it has (`--checks all`: no 5xx, every status and content type documented, schema-valid requests
accepted and schema-violating ones refused, response bodies as described, 405s with Allow, ...);
none may fail. The server answers after them, and a good request still gets its text."""

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("schemathesis")

from test_server import MODEL, _start_server, _stop  # noqa: E402

pytestmark = pytest.mark.slow
SEED = 12345  # benchmarks/results/schemathesis.md records this seed and two more


@pytest.fixture(scope="module")
def server():
    base, process = _start_server("--model-name", MODEL, "--max-tokens", "4", "--max-batch", "2", "--max-queue", "8")
    yield base
    _stop(process)


def test_schemathesis_with_every_check_finds_nothing(server, tmp_path):
    """40 examples an operation, one fixed seed, every check: exit 0 and "No issues found" (a wider
    run with other seeds is recorded with the server's benchmarks)."""
    cli = Path(sys.executable).with_name("schemathesis")
    run = subprocess.run([str(cli), "run", server + "/openapi.json", "--checks", "all", "--seed", str(SEED),
                          "--max-examples", "40", "--request-timeout", "120"],
                         capture_output=True, text=True, timeout=900, cwd=tmp_path,
                         env={**os.environ, "NO_COLOR": "1"})
    assert run.returncode == 0 and "No issues found" in run.stdout, run.stdout[-6000:]


def test_the_server_described_every_route_and_still_serves(server):
    with urllib.request.urlopen(server + "/openapi.json", timeout=60) as response:
        paths = json.loads(response.read())["paths"]
    assert {"/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"} <= set(paths)
    assert "requestBody" in paths["/v1/completions"]["post"]
    body = json.dumps({"model": MODEL, "prompt": "Water boils at", "max_tokens": 2, "temperature": 0}).encode()
    request = urllib.request.Request(server + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200 and json.loads(response.read())["choices"][0]["text"]
