"""The paper's formulas reproduce its own numbers (Leviathan et al. 2023, section 3)."""

import json

import pytest
import torch

from specdecode.formulas import (d_lk, expected_tokens, hardware_speedup, operations_increase, optimal_gamma,
                                 speedup, verify_curve)
from conftest import run_cli

# The paper's table for c = c_hat = 0: (alpha, gamma) -> (operations increase, speedup)
PAPER_TABLE = {
    (0.6, 2): (1.53, 1.96),
    (0.7, 3): (1.58, 2.53),
    (0.8, 2): (1.23, 2.44),
    (0.8, 5): (1.63, 3.69),
    (0.9, 2): (1.11, 2.71),
    (0.9, 10): (1.60, 6.86),
}


@pytest.mark.parametrize("alpha, gamma", PAPER_TABLE)
def test_paper_table(alpha, gamma):
    ops, speed = PAPER_TABLE[(alpha, gamma)]
    assert round(operations_increase(alpha, gamma, 0.0), 2) == ops
    assert round(speedup(alpha, gamma, 0.0), 2) == speed


def test_optimal_gamma_at_alpha_09_c_001_is_24():
    gamma, best = optimal_gamma(0.9, 0.01)
    assert gamma == 24 and round(best, 2) == 7.49


@pytest.mark.parametrize("alpha, c", [(0.3, 0.1), (0.5, 0.45), (0.9, 0.2), (0.21, 0.2)])
def test_corollary_alpha_above_c_gains_at_least_one_plus_alpha_over_one_plus_c(alpha, c):
    assert speedup(alpha, 1, c) == pytest.approx((1 + alpha) / (1 + c))
    assert optimal_gamma(alpha, c)[1] >= (1 + alpha) / (1 + c) - 1e-12 > 1.0


def test_no_gamma_helps_when_alpha_is_below_c():
    assert optimal_gamma(0.1, 0.5) == (0, 1.0)


def test_expected_tokens_limits():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.5, 1) == pytest.approx(1.5)


def test_hardware_speedup_reduces_to_the_paper_when_verification_is_free():
    flat = [0.0] + [1.0] * 20
    for alpha, gamma, c in [(0.6, 2, 0.05), (0.8, 7, 0.01), (0.3, 1, 0.0)]:
        assert hardware_speedup(alpha, gamma, c, flat) == pytest.approx(speedup(alpha, gamma, c))
    # verifying 3 tokens at 1.5x a step: E[tokens] / 1.5
    assert hardware_speedup(0.8, 2, 0.0, lambda k: 1.5) == pytest.approx(expected_tokens(0.8, 2) / 1.5)


def test_a_costly_verification_curve_lowers_the_optimal_gamma():
    linear = lambda k: 0.5 + 0.5 * k  # noqa: E731  (T(8)/T(1) = 4.5, llama.cpp-like)
    assert optimal_gamma(0.8, 0.02, verify_cost=linear)[0] < optimal_gamma(0.8, 0.02)[0]
    assert optimal_gamma(0.3, 0.0, verify_cost=lambda k: float(k)) == (0, 1.0)


def test_verify_curve_extends_linearly():
    curve = verify_curve([0.0, 1.0, 1.2, 1.5])
    assert curve(2) == 1.2 and curve(3) == 1.5 and curve(5) == pytest.approx(2.1)


def test_d_lk_and_acceptance():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.3, 0.5])
    assert d_lk(p, q).item() == pytest.approx(0.3)
    assert d_lk(p, p).item() == pytest.approx(0.0)


@pytest.mark.parametrize("call", [lambda: expected_tokens(1.2, 2), lambda: speedup(0.5, -1, 0.1),
                                  lambda: speedup(0.5, 2, -0.1), lambda: operations_increase(0.5, 2, -1)])
def test_invalid_inputs_are_refused(call):
    with pytest.raises(ValueError):
        call()


def test_analyze_command_prints_the_formulas_and_optimal_gamma(capsys):
    code, out, err = run_cli(capsys, "analyze", "--alpha", "0.9", "--cost-ratio", "0.01", "--gamma", "10")
    assert code == 0, err
    assert "optimal gamma: 24 (speedup 7.49x)" in out
    record = json.loads(run_cli(capsys, "analyze", "--alpha", "0.8", "--gamma", "5", "--json")[1])
    assert round(record["rows"][0]["speedup"], 2) == 3.69 and round(record["rows"][0]["operations_increase"], 2) == 1.63


def test_analyze_with_a_verification_curve_and_a_plot(capsys, tmp_path):
    out = tmp_path / "figures.png"
    code, stdout, _ = run_cli(capsys, "analyze", "--alpha", "0.7", "--cost-ratio", "0.05", "--verify-curve",
                              "1,1.5,2,2.5,3", "--plot", str(out), "--json")
    record = json.loads(stdout)
    assert record["optimal_gamma_hw"] < record["optimal_gamma"]
    assert out.stat().st_size > 20_000 and out.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("args, message", [(["--alpha", "1.5"], "--alpha"), (["--alpha", "0.5", "--cost-ratio", "-1"], "--cost"),
                                           (["--alpha", "0.5", "--verify-curve", "1,x"], "--verify-curve")])
def test_analyze_bad_input(capsys, args, message):
    code, _, err = run_cli(capsys, "analyze", *args)
    assert code == 2 and message in err and "Traceback" not in err
