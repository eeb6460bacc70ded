"""`specdecode bench`, `alpha` and `profile` end to end on the default model (small budgets)."""

import json
import math

import pytest

from conftest import cli as run
from specdecode.formulas import hardware_speedup, speedup

pytestmark = pytest.mark.slow


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "q.jsonl"
    rows = [
        dict(question_id=1, category="summarization",
             turns=["Summarize: The bridge over the river closed on Monday for repairs. The bridge will reopen in "
                    "May, the city said, after the repairs to the bridge are finished."]),
        dict(question_id=2, category="qa", turns=["What is the capital of France?"]),
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def test_bench_writes_table_json_and_charts(prompts, tmp_path):
    out = tmp_path / "bench"
    result = run("bench", "--backend", "llama.cpp", "--prompts", str(prompts), "--gamma", "2", "--max-new-tokens", "12",
                 "--temperatures", "0", "1", "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    record = json.loads((out / "results.json").read_text())
    rows = {(r["task"], r["method"], r["temperature"]): r for r in record["rows"]}
    for temperature in (0.0, 1.0):
        for method in ("baseline", "lookup g=2", "llama.cpp", "llama.cpp-lookup g=10"):
            assert ("overall", method, temperature) in rows
        assert rows[("summarization", "baseline", temperature)]["speedup"] == 1.0
    lookup = rows[("summarization", "lookup g=2", 0.0)]
    assert lookup["alpha"] is not None and lookup["tokens_per_call"] >= 1.0
    assert lookup["predicted_speedup"] is not None and lookup["predicted_speedup_hw"] is not None
    assert lookup["decode_speedup"] is not None and rows[("qa", "baseline", 0.0)]["decode_speedup"] == 1.0
    assert rows[("summarization", "baseline", 0.0)]["identical"] == "1/1"
    assert len(record["runs"]) == 2 * 2 * 4
    # the predictions are the formulas applied to the row's own measured alpha and c
    ratios = record["meta"]["verify_ratios"]
    assert lookup["predicted_speedup"] == pytest.approx(speedup(lookup["alpha"], 2, lookup["cost_ratio"]))
    assert lookup["predicted_speedup_hw"] == pytest.approx(
        hardware_speedup(lookup["alpha"], 2, lookup["cost_ratio"], ratios))
    assert "| summarization | lookup g=2 | 0 |" in (out / "results.md").read_text()
    for png in ("speedup.png", "timeline.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_alpha_and_profile_commands(prompts):
    result = run("alpha", "--prompts", str(prompts), "--max-new-tokens", "8", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    record = json.loads(result.stdout)
    assert 0.0 <= record["alpha"] <= 1.0 and record["positions"] > 0 and record["prompts"] == 2
    result = run("profile", "--max-k", "4", "--context", "32", "--repeats", "3", "--refresh", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    record = json.loads(result.stdout)
    # what was measured depends on the host's speed: only its shape is asserted
    assert len(record["verify_ratios"]) == 5 and record["verify_ratios"][1] == 1.0
    assert math.isfinite(record["cost_ratio"]) and record["cost_ratio"] >= 0


def test_bench_refuses_bad_input(prompts, tmp_path):
    result = run("bench", "--prompts", str(prompts), "--categories", "poetry", "--out", str(tmp_path / "x"))
    assert result.returncode == 2 and "unknown categories" in result.stderr and "Traceback" not in result.stderr
    result = run("bench", "--prompts", str(prompts), "--gamma", "0", "--out", str(tmp_path / "x"))
    assert result.returncode == 2 and "--gamma" in result.stderr
    # --draft as generate spells it: specs that join the suite, and one draft model at most
    result = run("bench", "--prompts", str(prompts), "--draft", "suffix", "--draft", "a.gguf", "--draft", "b.gguf",
                 "--out", str(tmp_path / "x"))
    assert result.returncode == 2 and "at most one draft model, got a.gguf, b.gguf" in result.stderr
