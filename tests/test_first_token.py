"""The greedy first token computed before PyTorch loads (models/native/first_token.py): the same
logits as the loaded model, bit for bit, and the CLI's answer unchanged by showing it early."""

import json

import numpy as np
import pytest
import torch

from conftest import run_cli
from specdecode.bench.random_model import quantize, write_llama
from specdecode.cli.generate import _unshown
from specdecode.models.default import default_target_path
from specdecode.models.native import first_token, load_native
from specdecode.prompts import encode_prompt
from specdecode.text import TextStep

PROMPTS = ["Hi", "Explain why the sky is blue, in one sentence. " * 30]  # the second: two prefill chunks


@pytest.fixture(scope="module")
def embedded():
    return load_native(default_target_path())


def served(model) -> None:
    """Skip where this kernel plan gives the model no early token (the torch and portable paths, AMX
    tiles: prompts not through the decode layers), saying why."""
    reason = first_token.refusal(model)
    if reason is not None:
        pytest.skip(f"no early first token on this kernel plan: {reason}")


def _same_first_logits(model, tmp_path, texts, threads=(None, 1)):
    served(model)
    assert first_token.save(model, tmp_path)
    snapshot = first_token.Snapshot(tmp_path)
    for text in texts:
        ids = encode_prompt(model.tokenizer, text)
        expected = model.forward(torch.tensor([ids]), model.new_cache(), num_logits=1)[0, -1]
        for threads_ in threads:
            if threads_:
                snapshot.meta["threads"] = threads_
            logits = snapshot.first_logits(ids)
            assert torch.equal(torch.from_numpy(logits), expected), (text[:20], threads_)
            assert first_token.greedy(logits) == int(expected.argmax())


def test_embedded_model_first_logits_bit_identical(tmp_path, embedded):
    _same_first_logits(embedded, tmp_path, PROMPTS)
    assert len(encode_prompt(embedded.tokenizer, PROMPTS[1])) > embedded.PREFILL_CHUNK


@pytest.mark.parametrize("architecture", ["qwen2", "qwen3"])
def test_random_q8_model_first_logits_bit_identical(tmp_path, architecture):
    """q, k, v biases (Qwen2), per-head q and k norms (Qwen3), Q8_0 products and a tied Q8_0 head."""
    path = quantize(write_llama(tmp_path / "m.gguf", architecture=architecture, seed=3), "Q8_0")
    _same_first_logits(load_native(path), tmp_path / "snapshot", PROMPTS[:1], threads=(None,))


def test_refused_where_its_forward_differs(tmp_path):
    """A Gemma 3 file (embedding scale, sliding window, softcap): no snapshot, said why."""
    model = load_native(quantize(write_llama(tmp_path / "g.gguf", architecture="gemma3"), "Q8_0"))
    assert first_token.refusal(model) is not None
    if model.row_invariant_prompts:
        assert "sliding window" in first_token.refusal(model)
    assert not first_token.save(model, tmp_path / "snapshot")
    assert not (tmp_path / "snapshot").exists()


def test_snapshot_invalid_once_its_backend_choice_changes(tmp_path, monkeypatch):
    monkeypatch.setattr(first_token, "cache_root", lambda: tmp_path / "cache")
    model_path = quantize(write_llama(tmp_path / "m.gguf", architecture="qwen3"), "Q8_0")
    choice = tmp_path / "choice.json"
    choice.write_text(json.dumps({"backend": "native"}))
    settings = dict(backend="auto", threads=None, ctx=4096, device=None)
    model = load_native(model_path)
    served(model)
    assert first_token.save(model, first_token.location(model_path, settings), choice)
    assert first_token.open_snapshot(model_path, settings) is not None
    assert first_token.open_snapshot(model_path, dict(settings, threads=1)) is None  # other settings, other key
    choice.write_text(json.dumps({"backend": "llama.cpp"}))  # measured again: llama.cpp won
    assert first_token.open_snapshot(model_path, settings) is None


def test_greedy_refuses_non_finite_logits():
    assert first_token.greedy(np.array([0.0, 2.0, 2.0], dtype=np.float32)) == 1  # ties: the lowest id
    assert first_token.greedy(np.array([0.0, np.nan], dtype=np.float32)) is None


def _piece(accepted: str, target: str) -> TextStep:
    return TextStep(step=None, accepted_text=accepted, rejected_text="", target_text=target, finish_reason=None)


def test_unshown_removes_what_was_shown_early():
    piece, rest = _unshown(_piece("", "Hello"), "Hello")
    assert (piece.accepted_text, piece.target_text, rest) == ("", "", "")
    piece, rest = _unshown(_piece("He", "llo world"), "Hello")  # the early text spans accepted and target
    assert (piece.accepted_text, piece.target_text, rest) == ("", " world", "")
    piece, rest = _unshown(_piece("", "He"), "Hello")  # the rest comes in the next piece
    assert (piece.target_text, rest) == ("", "llo")
    piece, rest = _unshown(_piece("", "Goodbye"), "Hello")  # not the start of the answer: all of it, anew
    assert (piece.accepted_text, piece.target_text, rest) == ("\n", "Goodbye", "")


def test_cli_answer_same_with_the_early_token(tmp_path, monkeypatch, capsys, embedded):
    """The first run saves the snapshot, the second shows its first token early (from it, before
    the model loads); the answers are the same, and a sampled run does not use it."""
    import specdecode.cli.generate as generate

    served(embedded)
    monkeypatch.setattr(first_token, "cache_root", lambda: tmp_path)
    early = []
    original = generate.early_token
    monkeypatch.setattr(generate, "early_token", lambda args, out: early.append(original(args, out)) or early[-1])
    args = ("generate", "--backend", "native", "--max-new-tokens", "12", "Name a colour.")
    code, first, _ = run_cli(capsys, *args)
    assert code == 0 and early == [""] and list((tmp_path / "first-token").iterdir())
    code, second, _ = run_cli(capsys, *args)
    assert code == 0 and early[1] and first.startswith(early[1])
    assert second == first
    code, _, _ = run_cli(capsys, *args, "--temperature", "0.5", "--seed", "1")
    assert code == 0 and early[2] == ""
