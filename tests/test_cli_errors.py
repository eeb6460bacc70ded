"""What a new user meets first at the command line: every input they can get wrong is one sentence
naming the cause and what to do, before any model loads, never a traceback; Ctrl-C at any moment
ends with one line and exit 130; --help answers without importing PyTorch; `cache` lists and clears."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_cli

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    from specdecode.models.default import default_target_path

    root = tmp_path_factory.mktemp("bad")
    whole = Path(default_target_path()).read_bytes()
    (root / "text.gguf").write_text("not a model")
    (root / "half.gguf").write_bytes(whole[: len(whole) // 2])
    (root / "head.gguf").write_bytes(whole[:5000])
    (root / "config-only").mkdir()
    (root / "config-only" / "config.json").write_text('{"model_type": "llama"}')
    return root


@pytest.mark.parametrize("args, says", [
    (["--device", "cuda"], "has no CUDA"),  # this torch is the CPU build (CI never has a GPU)
    (["--device", "foo"], "--device must be cpu or cuda"),
    (["--target", "{root}/text.gguf"], "is not a GGUF file: a GGUF file starts with the bytes 'GGUF', this one with b'not "),
    (["--target", "{root}/half.gguf"], "is not a whole GGUF file: it is cut short: tensor"),
    (["--target", "{root}/head.gguf"], "is not a whole GGUF file: its header is cut short"),
    (["--target", "{root}/config-only"], "has a config.json but no weights"),
    (["--target", "{root}/config-only", "--backend", "hf"], "has a config.json but no weights"),
    (["--target", "{root}/half.gguf", "--backend", "llama.cpp"], "cut short"),
    (["--draft", "nonsense"], "no drafter has that name"),
    (["--target", "meta-llama/Llama-3.2-1B"], "looks like a Hugging Face hub id"),
    (["--draft", "Qwen/Qwen2.5-0.5B"], "looks like a Hugging Face hub id"),
])
def test_a_mistake_is_one_sentence_naming_it_before_any_loading(capsys, bad_files, args, says, monkeypatch):
    if "cuda" in args:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this torch has CUDA")
    from specdecode.models import load

    def loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the mistake was named")

    monkeypatch.setattr(load, "_load", loading)
    code, _, err = run_cli(capsys, "generate", QUESTION, *[a.format(root=bad_files) for a in args])
    assert code == 2 and says in err and "Traceback" not in err, err
    assert err.count("\n") == 1  # one line
    if "--draft" in args:
        assert "lookup, auto, pool, suffix, ngram:FILE.npz, trained" in err  # the drafter names it could have meant


def test_help_and_version_answer_without_importing_torch():
    code = ("import sys; from specdecode.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "generate" in result.stdout, result.stderr
    result = subprocess.run([sys.executable, "-m", "specdecode", "--version"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and result.stdout.startswith("specdecode ")


def test_every_option_of_generate_and_serve_says_its_default_or_has_none(capsys):
    import re

    for command, options in (("generate", ("--max-new-tokens", "--seed", "--max-gamma", "--temperature")),
                             ("serve", ("--host", "--port", "--max-gamma", "--max-batch", "--max-tokens"))):
        code, out, _ = run_cli(capsys, command, "--help")
        assert code == 0
        helps = {}  # option -> its help text, from the options' part of the help
        for entry in re.split(r"\n  (?=-)", out.split("options:", 1)[1]):
            if entry.strip():
                helps[entry.split()[0].rstrip(",")] = " ".join(entry.split())
        for option in options:
            assert "default" in helps[option], helps[option]


def test_ctrl_c_at_any_moment_ends_with_one_line_and_130(tmp_path):
    """SIGINT 1 and 3 s into a generate on a cold cache (imports, building the kernels, loading) or,
    on a host fast enough to be past those, into the generation of 4,000 tokens: exit 130, no
    traceback, a last line saying it was interrupted, whichever phase the signal met."""
    env = {**os.environ, "SPECDECODE_CACHE": str(tmp_path)}
    for delay in (1.0, 3.0):
        process = subprocess.Popen([sys.executable, "-m", "specdecode", "generate", "--max-new-tokens", "4000", QUESTION],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=120)
        last = err.strip().splitlines()[-1]
        # 130, or ended by the signal itself (CPython does that where an interrupt reaches its shutdown): a
        # shell's $? is 130 both ways
        assert process.returncode in (130, -signal.SIGINT), err[-2000:]
        assert "Traceback" not in err and (last == "specdecode: interrupted" or "finished: interrupted" in last), err


def test_cache_lists_entries_with_sizes_and_clears_one_models(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    (tmp_path / "tokenizers" / "smol-abc").mkdir(parents=True)
    (tmp_path / "tokenizers" / "smol-abc" / "tokenizer.json").write_bytes(b"x" * 2048)
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "gemma-1t.json").write_text("{}")
    code, out, _ = run_cli(capsys, "cache")
    assert code == 0 and "2.0 KB  tokenizers  smol-abc" in out and "in 2 entries" in out
    code, out, _ = run_cli(capsys, "cache", "clear", "--model", "smol")
    assert code == 0 and "cleared 1 entries" in out
    assert not (tmp_path / "tokenizers" / "smol-abc").exists() and (tmp_path / "profiles" / "gemma-1t.json").exists()
