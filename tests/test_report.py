"""The bench table's aggregation: speedups, the prefill-free decode speedup, and the cost model's forecast."""

import pytest

from specdecode.bench.report import aggregate, markdown
from specdecode.bench.runner import Run


def run(method, gamma, wall, prefill, tokens=101, **extra):
    return Run(prompt_id="1", category="rag", task="rag", method=method, gamma=gamma, temperature=0.0,
               prompt_tokens=500, new_tokens=tokens, wall_seconds=wall, prefill_seconds=prefill, **extra)


def test_decode_speedup_leaves_out_the_prefill_and_auto_rows_show_the_forecast():
    runs = [run("baseline", None, 1.5, 0.5),  # 100 tokens after the first in 1.0 s
            run("suffix", "auto", 1.0, 0.5, target_calls=40, forecast_tokens=90.0, forecast_steps=45.0)]
    rows = {r.method: r for r in aggregate(runs) if r.task == "rag"}
    assert rows["suffix g=auto"].speedup == pytest.approx(1.5)  # wall clock, prefill included
    assert rows["suffix g=auto"].decode_speedup == pytest.approx(2.0)  # 100 tokens in 0.5 s against 1.0 s
    assert rows["suffix g=auto"].predicted_speedup_hw == pytest.approx(2.0)  # 90 tokens for 45 steps
    assert rows["baseline"].decode_speedup == pytest.approx(1.0) and rows["baseline"].predicted_speedup_hw is None
    assert "| rag | suffix g=auto | 0 | 1 | 101 |" in markdown(list(rows.values()))


def test_runs_without_a_timed_prefill_have_no_decode_speedup():
    runs = [run("baseline", None, 1.5, 0.5), run("llama.cpp", None, 2.0, None)]
    rows = {r.method: r for r in aggregate(runs) if r.task == "rag"}
    assert rows["llama.cpp"].decode_speedup is None and rows["llama.cpp"].speedup == pytest.approx(0.75)
