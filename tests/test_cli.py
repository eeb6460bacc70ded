"""`specdecode generate` end to end, as a user runs it."""

import json
import subprocess
import sys

import pytest

from conftest import cli, run_cli
from specdecode import defaults
from realmodel import COPY_PROMPT

QUESTION = "What is the capital of France?"


def run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "specdecode", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--temperature", "-1"], "temperature"),
        (["--top-p", "0"], "top_p"),
        (["--top-k", "-3"], "top_k"),
        (["--gamma", "-2"], "--gamma"),
        (["--gamma", "many"], "expected an integer or 'auto'"),
        (["--gamma", "auto", "--max-gamma", "0"], "--max-gamma"),
        (["--gamma", "99"], "--gamma 99 is above --max-gamma 8"),
        (["--lenience", "0"], "--lenience"),
        (["--max-new-tokens", "0"], "--max-new-tokens"),
        (["--target", "/no/such/model.gguf"], "does not exist"),
        (["--repeat-penalty", "1.1", "--repetition-penalty", "1.1"], "not allowed with argument"),
        (["--repeat-penalty", "1.1", "--repeat-last-n", "-2"], "repeat_last_n"),
    ],
)
def test_bad_input_gets_a_clear_error_and_no_traceback(capsys, args, message):
    code, _, err = run_cli(capsys, "generate", QUESTION, *args)
    assert code == 2
    assert message in err and "Traceback" not in err


def test_empty_prompt_is_refused():  # through `python -m specdecode`, as a user runs it
    result = run("generate", "   ")
    assert result.returncode == 2 and "prompt is empty" in result.stderr


@pytest.mark.slow
def test_generate_json_on_the_default_model():
    result = cli("generate", QUESTION, "--json", "--max-new-tokens", "24", "--dtype", "float32")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert "Paris" in record["text"]
    assert record["mode"] == "speculative" and record["draft"] == defaults.DRAFT
    assert record["new_tokens"] == len(record["tokens"]) and record["finish_reason"] == "eos"
    assert record["target_calls"] <= record["new_tokens"]
    assert record["tokens_per_call"] == pytest.approx(record["new_tokens"] / record["target_calls"])
    assert record["tokens_per_second"] > 0 and record["wall_seconds"] > 0


@pytest.mark.slow
def test_streamed_text_speculative_equals_baseline(tmp_path):
    prompt = COPY_PROMPT
    common = ["generate", prompt, "--max-new-tokens", "40", "--dtype", "float32", "--no-color"]
    spec, base = cli(*common), cli(*common, "--baseline")
    assert spec.returncode == 0 and base.returncode == 0, spec.stderr + base.stderr
    assert spec.stdout == base.stdout and "committee" in spec.stdout
    assert "target calls" in spec.stderr and "acceptance" in spec.stderr and "tokens/s" in spec.stderr
    assert "acceptance n/a" in base.stderr


@pytest.mark.slow
def test_suffix_drafting_from_the_command_line_equals_baseline_and_drafts():
    done = cli("generate", COPY_PROMPT, "--max-new-tokens", "40", "--json", "--gamma", "4", "--draft", "suffix",
               "--compare")  # --compare: plain decoding of the same prompt after it, in the same process
    assert done.returncode == 0, done.stderr
    suffix = json.loads(done.stdout)
    assert suffix["compare"]["identical"] is True and suffix["compare"]["plain_tokens"] == len(suffix["tokens"])
    assert suffix["accepted"] > 0


@pytest.mark.slow
def test_adaptive_gamma_output_equals_baseline():
    prompt = COPY_PROMPT
    common = ["generate", prompt, "--max-new-tokens", "40", "--dtype", "float32", "--json"]
    auto, base = cli(*common, "--gamma", "auto"), cli(*common, "--baseline")
    assert auto.returncode == 0 and base.returncode == 0, auto.stderr + base.stderr
    auto, base = json.loads(auto.stdout), json.loads(base.stdout)
    assert auto["tokens"] == base["tokens"]
    # Whether speculation pays is the policy's call from this machine's measured T(k)/T(1) (the library
    # tests pin a curve and check that it speculates); here: it ran and kept scoring the drafter.
    assert auto["gamma"] == "auto" and auto["beta_count"] > 0 and auto["target_calls"] <= base["target_calls"]


@pytest.mark.slow
def test_draft_sharing_no_token_with_the_target_is_refused_naming_both(tmp_path):
    """A draft with another vocabulary drafts through the tokens both share (tests/test_check.py);
    one that shares none is refused before any decoding."""
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {f"\u2603{i}\u2604": i for i in range(100)}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="\u26030\u2604")))
    config = LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    draft_dir = tmp_path / "other-vocab-draft"
    LlamaForCausalLM(config).save_pretrained(draft_dir)
    tokenizer.save_pretrained(draft_dir)
    result = cli("generate", QUESTION, "--draft", str(draft_dir))
    assert result.returncode == 2
    assert "target vocabulary SmolLM2-135M-Instruct" in result.stderr
    assert "draft vocabulary other-vocab-draft (100 tokens" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_ngram_fit_then_generate_with_it(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The capital of France is Paris.\nParis is the capital and largest city of France.\n" * 3)
    out = tmp_path / "bigram.npz"
    result = cli("ngram", "fit", "--corpus", str(corpus), "--order", "2", "--out", str(out))
    assert result.returncode == 0 and out.exists(), result.stderr
    assert "fitted a 2-gram" in result.stdout
    common = ["generate", QUESTION, "--max-new-tokens", "16", "--dtype", "float32", "--json"]
    spec = json.loads(cli(*common, "--draft", f"ngram:{out}", "--gamma", "3", "--compare").stdout)
    assert spec["compare"]["identical"] is True and spec["accepted"] > 0  # plain decoding gave the same tokens
    missing = cli(*common, "--draft", f"ngram:{tmp_path / 'none.npz'}")
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_each_repetition_penalty_option_reads_what_its_names_engine_reads():
    """--repeat-penalty is llama.cpp's (the last 64 tokens), --repetition-penalty vLLM's (all of them);
    --repeat-last-n sets either's window."""
    from specdecode.cli.loading import sampling_params
    from specdecode.cli.parser import build_parser

    def params(*options):
        return sampling_params(build_parser().parse_args(["generate", QUESTION, *options]))

    llama, vllm = params("--repeat-penalty", "1.1"), params("--repetition-penalty", "1.2")
    assert (llama.repetition_penalty, llama.repeat_last_n) == (1.1, defaults.REPEAT_LAST_N)
    assert (vllm.repetition_penalty, vllm.repeat_last_n) == (1.2, -1)
    assert params("--repeat-penalty", "1.1", "--repeat-last-n", "-1").repeat_last_n == -1
