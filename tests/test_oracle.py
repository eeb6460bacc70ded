"""`specdecode check --against llama.cpp`: the native path against llama.cpp on the user's own file."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli
from specdecode.bench.random_model import llama3_factors
from test_reading import HEAD

pytest.importorskip("llama_cpp")
# a file with Llama 3's 128,256-token vocabulary: its tokenizer and head take a few seconds a load
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llama3_file(tmp_path_factory):
    """A small Llama with Llama 3's vocabulary size (128,256: its head and table at full width),
    RoPE base and frequency factors (for an original context of 64 positions, so that the factor-32
    pairs turn within the positions compared), Q4_0."""
    from specdecode.bench.random_model import LLAMA3_THETA, quantize, write_llama

    root = tmp_path_factory.mktemp("oracle")
    factors = llama3_factors(HEAD, LLAMA3_THETA, factor=32.0, context=64)
    return quantize(write_llama(root / "llama3.gguf", context=512, vocab=128256, theta=LLAMA3_THETA,
                                tensors={"rope_freqs.weight": factors}), "Q4_0")


def test_a_file_the_native_path_computes_as_llama_cpp_does_agrees_directly_and_from_the_dequantised_copy(
        capsys, llama3_file):
    """One `--reference` run: the direct comparison on the file, and each engine measured from the
    copy llama.cpp dequantises to F16."""
    code, out, _ = run_cli(capsys, "check", "--against", "llama.cpp", "--target", str(llama3_file), "--json",
                           "--reference")
    record = json.loads(out)
    assert code == 0 and record["agrees"] and record["mean_kl"] < 0.02 and record["agreement"] >= 0.8
    assert record["positions"] > 150 and record["token_mismatches"] == [] and record["chat"] == "identical"
    ref = record["reference"]
    assert ref["mean_kl"] < 0.02 and ref["agreement"] >= 0.8
    # both quantised runs are off the exact one by a 4-bit file's rounding: more than F16's, not a wrong model's
    assert 0 < ref["ours_from_exact"] < 0.05 and 0 < ref["theirs_from_exact"] < 0.05


def test_a_chat_prompt_rendered_otherwise_than_llama_cpp_renders_it_disagrees(capsys, llama3_file, monkeypatch):
    from specdecode.models.tokenizer import Tokenizer

    render = Tokenizer.apply_chat_template
    monkeypatch.setattr(Tokenizer, "apply_chat_template",  # one newline left out before the assistant's turns
                        lambda self, *a, **k: render(self, *a, **k).replace("\n<|im_start|>assistant",
                                                                            "<|im_start|>assistant"))
    code, out, _ = run_cli(capsys, "check", "--against", "llama.cpp", "--target", str(llama3_file))
    assert code == 1 and "chat template: differs" in out and "verdict: DISAGREES" in out, out


def test_a_native_path_that_computes_otherwise_disagrees_and_exits_1(capsys, llama3_file, monkeypatch):
    """The same file with the native path's RoPE factors left out (what it computed before it read
    them): the check must see it."""
    from specdecode.models.native.model import NativeLlama

    table = NativeLlama._rope_table
    monkeypatch.setattr(NativeLlama, "_rope_table", lambda self, theta, scale=1.0, factors=(): table(self, theta, scale))
    code, out, _ = run_cli(capsys, "check", "--against", "llama.cpp", "--target", str(llama3_file))
    assert code == 1 and "verdict: DISAGREES" in out, out
    # past the thresholds, the dequantised copy is run too: the native path disagrees there as well
    assert "BEYOND the thresholds" in out, out


def test_a_deep_file_past_the_thresholds_agrees_only_when_no_further_from_exact_than_llama_cpp():
    from specdecode.analysis.oracle import MARGIN, Agreement, Reference

    right = Agreement(200, 0.001, 0.01, 0.99)
    # the 16-layer Q4_K_M case: 0.05 apart, the native path 0.016 from exact and llama.cpp 0.030
    assert Reference(right, 0.016, 0.030).agrees
    assert not Reference(right, MARGIN * 0.030 + 0.001, 0.030).agrees  # further from exact than llama.cpp
    assert Reference(right, 0.015, 0.001).agrees  # within the thresholds of exact whatever llama.cpp does
    wrong = Agreement(200, 1.1, 4.0, 0.3)  # the architecture computed otherwise: no quantised run saves it
    assert not Reference(wrong, 0.001, 0.030).agrees


@pytest.mark.slow
def test_the_embedded_model_agrees(capsys):
    code, out, _ = run_cli(capsys, "check", "--against", "llama.cpp")
    assert code == 0 and "verdict: agrees" in out and "tokenisation: identical ids" in out, out
    assert "chat template: identical" in out, out
