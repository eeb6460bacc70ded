"""The llama.cpp backend on the embedded GGUF (skipped where llama-cpp-python is not installed)."""

import pytest
import torch

pytest.importorskip("llama_cpp")

from specdecode import (AdaptiveGamma, ModelDrafter, PromptLookupDrafter, SamplingParams,  # noqa: E402
                        autoregressive_decode, encode_prompt, speculative_decode)
from specdecode.models.load import load_model  # noqa: E402
from specdecode.sampling import sample  # noqa: E402
from stats import chi2_pvalue  # noqa: E402
from realmodel import COPY_PROMPT, GREEDY, lookup_and_plain_greedy, tokens_of  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def target():
    return load_model(None, backend="llama.cpp", threads=2)


def test_same_vocabulary_as_the_transformers_tokenizer(target):
    from specdecode.models.files import gguf_tokenizer
    from specdecode.models.default import default_target_path
    from specdecode.models.base import Vocabulary

    hf_vocab = Vocabulary.from_tokens("x", gguf_tokenizer(default_target_path()).get_vocab())
    assert target.vocab.fingerprint == hf_vocab.fingerprint and target.vocab.size == 49152


def test_rollback_is_exact_and_logits_come_only_where_asked(target):
    ids = torch.tensor([encode_prompt(target.tokenizer, "Hello there")])
    cache = target.new_cache()
    assert target.forward(ids, cache, num_logits=1).shape == (1, 1, 49152)
    first = target.forward(torch.tensor([[1000, 2000, 3000]]), cache)
    cache.trim(3)
    again = target.forward(torch.tensor([[1000, 2000, 3000]]), cache)
    assert torch.equal(first, again) and len(cache) == ids.shape[1] + 3
    stale = cache
    target.new_cache()
    with pytest.raises(RuntimeError, match="replaced"):
        target.forward(torch.tensor([[5]]), stale)


@pytest.mark.parametrize("gamma", [2, 4])
def test_greedy_with_prompt_lookup_equals_plain_greedy(target, gamma):
    steps, expected = lookup_and_plain_greedy(target, gamma)
    assert tokens_of(steps) == expected and "committee" in target.tokenizer.decode(expected)
    assert sum(s.num_accepted for s in steps) > 3  # copying from the prompt was accepted


@pytest.mark.parametrize("context", [20, 600])  # 600: past the 512 cells where llama.cpp splits a single query
def test_one_forward_over_k_tokens_equals_k_single_steps_bit_for_bit(target, context):
    """What makes speculative greedy output equal plain greedy output on this backend."""
    ids = torch.tensor([[1000 + (7 * i) % 5000 for i in range(context)]])
    new = torch.tensor([[578, 4109, 2380, 288, 36484, 260, 4489, 1000, 2000, 3000, 4000, 5000]])
    batched_cache = target.new_cache()
    target.forward(ids, batched_cache, num_logits=1)
    batched = target.forward(new, batched_cache)  # [1, 12, V]
    single_cache = target.new_cache()
    target.forward(ids, single_cache, num_logits=1)
    singles = torch.cat([target.forward(new[:, i : i + 1], single_cache) for i in range(new.shape[1])], dim=1)
    assert torch.equal(batched, singles)


@pytest.mark.parametrize("prompt", ["Write a short story about a lighthouse keeper who finds a message in a bottle.",
                                    "Give me three tips for learning to play the guitar."])
def test_greedy_with_prompt_lookup_equals_plain_greedy_on_open_ended_prompts(target, prompt):
    """Little to copy here, so most verifications reject: every rejection path must keep the
    output on plain greedy's tokens (these drifted with batch-dependent attention numerics)."""
    ids = encode_prompt(target.tokenizer, prompt)
    expected = tokens_of(autoregressive_decode(target, ids, params=GREEDY, max_new_tokens=64))
    steps = list(speculative_decode(target, PromptLookupDrafter(), ids, gamma=4, params=GREEDY, max_new_tokens=64))
    assert tokens_of(steps) == expected
    assert sum(len(s.rejected) for s in steps) > 0


def test_greedy_with_adaptive_gamma_equals_plain_greedy(target):
    ids = encode_prompt(target.tokenizer, COPY_PROMPT)
    expected = tokens_of(autoregressive_decode(target, ids, params=GREEDY, max_new_tokens=40))
    # a curve on which drafting pays (this machine's own may keep speculation off: then nothing is tested)
    policy = AdaptiveGamma([0.0, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7])
    steps = list(speculative_decode(target, PromptLookupDrafter(), ids, gamma=policy, params=GREEDY, max_new_tokens=40))
    assert tokens_of(steps) == expected
    assert sum(s.num_accepted for s in steps) > 0 and len({len(s.proposed) for s in steps}) > 1


def test_llamacpp_draft_for_a_transformers_target_is_accepted():
    """Either backend can draft for the other when the vocabularies match."""
    hf_target = load_model(None, backend="hf", dtype="float32")
    draft = load_model(None, backend="llama.cpp", threads=2)
    ids = encode_prompt(hf_target.tokenizer, "Name three primary colours.")
    expected = tokens_of(autoregressive_decode(hf_target, ids, params=GREEDY, max_new_tokens=20))
    steps = list(speculative_decode(hf_target, ModelDrafter(draft), ids, gamma=3, params=GREEDY, max_new_tokens=20))
    assert tokens_of(steps) == expected
    assert sum(s.num_accepted for s in steps) / sum(len(s.proposed) for s in steps) > 0.5  # same model, quantised


def test_per_step_frequencies_match_the_target_on_the_real_model(target):
    """One verification step at temperature 1 with the real target's distributions: the emitted
    token follows p (the per-step losslessness test, on this backend's logits)."""
    ids = encode_prompt(target.tokenizer, "Write one word:")
    cache = target.new_cache()
    proposal = [13, 14, 15]
    logits = target.forward(torch.tensor([ids + proposal]), cache, num_logits=4)  # [1, 4, V]
    params = SamplingParams(temperature=1.0, top_k=8)
    target_probs = params.probs(logits)  # [1, 4, V]
    draft_probs = SamplingParams(temperature=1.5, top_k=8).probs(logits[:, :3])  # a flatter q over the same tokens
    from specdecode.verify import verify

    # Keep only the token ids either distribution gives mass to, so n copies fit in memory.
    support = ((target_probs.sum((0, 1)) > 0) | (draft_probs.sum((0, 1)) > 0)).nonzero().squeeze(1)
    target_probs, draft_probs = target_probs[..., support], draft_probs[..., support]  # [1, 4, K], [1, 3, K]

    n = 40_000
    gen = torch.Generator().manual_seed(0)
    draft_tokens = sample(draft_probs.expand(n, -1, -1), gen)  # [n, 3]
    verdict = verify(draft_tokens, draft_probs.expand(n, -1, -1), target_probs.expand(n, -1, -1), gen)
    first = verdict.tokens[:, 0].tolist()
    expected = {i: p for i, p in enumerate(target_probs[0, 0].tolist()) if p > 0}
    assert chi2_pvalue(first, expected) > 1e-3


def test_llama_cpp_runs_without_extra_buffer_types(target):
    """llama.cpp's extra weight-buffer types (its AMX buffer on AMX Xeons) crash on SmolLM2's first
    decode; every context specdecode opens has them off."""
    from specdecode.bench.runner import llamacpp_generate

    assert target.llm.model_params.use_extra_bufts is False
    contexts = {}
    llamacpp_generate(target, [1, 2, 3], GREEDY, max_new_tokens=2, seed=0, contexts=contexts)
    assert contexts and all(llm.model_params.use_extra_bufts is False for llm in contexts.values())


def test_first_decode_survives_on_an_amx_cpu():
    """On an AMX host a decode with extra buffer types kills the process (segfault), so it runs in a
    subprocess: the test fails there without the fix, instead of taking pytest down."""
    import subprocess
    import sys

    from specdecode.models.llamacpp import cpu_has_amx

    if not cpu_has_amx():
        pytest.skip("this CPU has no AMX (no amx_tile flag in /proc/cpuinfo): llama.cpp's AMX buffer, "
                    "whose crash this guards against, is not used here")
    code = ("from specdecode.models.default import default_target_path\n"
            "from specdecode.models.llamacpp import open_llama\n"
            "llm = open_llama(default_target_path(), n_threads=2, n_ctx=256, verbose=False)\n"
            "llm.eval([1, 2, 3, 4])\n"
            "print('decoded', llm.n_tokens)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "decoded 4" in result.stdout, (result.returncode, result.stderr[-2000:])
