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


def test_the_table_says_where_speculation_did_not_pay_and_why():
    runs = [run("baseline", None, 1.0, 0.2), run("lookup", 4, 1.25, 0.2, target_calls=100, proposed=200, accepted=10,
                                                 beta_sum=30.0, beta_count=200, draft_seconds=0.1),
            run("llama.cpp", None, 2.0, None)]
    rows = [r for r in aggregate(runs) if r.task == "rag"]
    text = markdown(rows)
    assert "Where speculation did not pay" in text
    assert "- rag, lookup g=4, temperature 0: 0.80x; alpha 0.15 and 1.01 tokens a call" in text
    assert "llama.cpp, temperature" not in text  # an anchor is not speculation
    assert "did not pay" not in markdown([r for r in rows if r.method != "lookup g=4"])
