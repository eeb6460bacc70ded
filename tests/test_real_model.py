"""Integration on the embedded default target, SmolLM2-135M-Instruct (fp32: exact greedy identity
needs it; in bf16 a batched forward can flip near-ties, see README)."""

import pytest
import torch

from specdecode import (ModelDrafter, PromptLookupDrafter, autoregressive_decode, encode_prompt,
                        speculative_decode)
from specdecode.models.hf import HFModel
from realmodel import GREEDY, lookup_and_plain_greedy, tokens_of

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def target():
    from specdecode.models.default import load_default_target

    return load_default_target(dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def tiny_draft(target):
    """A 2-layer random Llama with the target's tokenizer: cheap, same vocabulary, mostly wrong."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=target.model.config.vocab_size, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048)
    return HFModel(LlamaForCausalLM(config), target.tokenizer, name="tiny-random")


def test_default_model_answers_a_simple_question(target):
    ids = encode_prompt(target.tokenizer, "What is the capital of France?")
    out = tokens_of(autoregressive_decode(target, ids, params=GREEDY, max_new_tokens=20))
    assert "Paris" in target.tokenizer.decode(out)
    assert out[-1] in target.eos_token_ids


@pytest.mark.parametrize("gamma", [3, 6])
def test_greedy_with_prompt_lookup_equals_plain_greedy(target, gamma):
    steps, expected = lookup_and_plain_greedy(target, gamma)
    assert tokens_of(steps) == expected
    assert sum(s.num_accepted for s in steps) > 5  # copying from the prompt really paid off
    assert len(steps) < len(expected)


def test_greedy_with_a_draft_model_equals_plain_greedy(target, tiny_draft):
    ids = encode_prompt(target.tokenizer, "Name three primary colours.")
    expected = tokens_of(autoregressive_decode(target, ids, params=GREEDY, max_new_tokens=24))
    steps = list(speculative_decode(target, ModelDrafter(tiny_draft), ids, gamma=3, params=GREEDY,
                                    max_new_tokens=24))
    assert tokens_of(steps) == expected
    assert steps[1].proposed and all(len(s.proposed) <= 3 for s in steps)  # steps[0]: the prefill, alone


def test_hf_cache_trim_rolls_back_exactly(target):
    ids = torch.tensor([encode_prompt(target.tokenizer, "Hello there")])
    cache = target.new_cache()
    target.forward(ids, cache)
    length = len(cache)
    first = target.forward(torch.tensor([[1000, 2000, 3000]]), cache)
    cache.trim(3)
    assert len(cache) == length
    again = target.forward(torch.tensor([[1000, 2000, 3000]]), cache)
    assert torch.allclose(first, again, atol=1e-5)
    with pytest.raises(ValueError, match="cannot trim"):
        cache.trim(len(cache) + 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_greedy_on_cuda_equals_plain_greedy():
    from specdecode.models.default import load_default_target

    cuda_target = load_default_target(dtype="float32", device="cuda")
    steps, expected = lookup_and_plain_greedy(cuda_target, gamma=4)
    assert tokens_of(steps) == expected and sum(s.num_accepted for s in steps) > 0


@pytest.fixture(scope="module")
def trained_draft():
    from specdecode.models.default import trained_draft_path
    from specdecode.models.load import load_model

    return load_model(str(trained_draft_path()), dtype="float32")


def test_the_shipped_draft_has_the_target_vocabulary_and_a_small_output_head(target, trained_draft):
    from specdecode.models.base import check_same_vocab

    check_same_vocab(target.vocab, trained_draft.vocab)
    assert trained_draft.eos_token_ids == target.eos_token_ids
    kept = trained_draft.net.kept_ids
    assert len(kept) < target.vocab.size and set(target.eos_token_ids) <= set(kept.tolist())


@pytest.mark.parametrize("drafter", ["trained", "lookup+trained"])
def test_greedy_with_the_trained_draft_equals_plain_greedy(target, trained_draft, drafter):
    from specdecode import LookupThenModelDrafter

    # A prompt like those the draft was trained on (Spec-Bench alpha is lower, see README).
    ids = encode_prompt(target.tokenizer, "Write a short article about volcanoes.")
    expected = tokens_of(autoregressive_decode(target, ids, params=GREEDY, max_new_tokens=40))
    d = ModelDrafter(trained_draft)
    steps = list(speculative_decode(target, d if drafter == "trained" else LookupThenModelDrafter(d), ids, gamma=4,
                                    params=GREEDY, max_new_tokens=40))
    assert tokens_of(steps) == expected
    # The trained weights, not a random network (which is almost never accepted): drafts pay off.
    assert sum(s.num_accepted for s in steps) >= 0.1 * sum(len(s.proposed) for s in steps)
    assert len(steps) <= 0.85 * len(expected)


def test_a_sliding_window_cache_rolls_back_past_its_window(target):
    """Gemma 3's sliding-window layers (window 4 here) must undo rejected drafts after the window is
    full: greedy speculative output equals plain greedy output on a tiny random Gemma 3 (float32)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=target.model.config.vocab_size, hidden_size=64, intermediate_size=128,
                              num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                              sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                              max_position_embeddings=256)
    model = HFModel(Gemma3ForCausalLM(config).float(), target.tokenizer, "tiny-gemma3")
    prompt = [5, 6, 7, 8, 9, 10, 11, 12] * 3  # repeated: prompt lookup proposes, some get rejected
    plain = tokens_of(autoregressive_decode(model, prompt, params=GREEDY, max_new_tokens=24))
    steps = list(speculative_decode(model, PromptLookupDrafter(), prompt, gamma=3, params=GREEDY, max_new_tokens=24))
    assert tokens_of(steps) == plain
    assert any(s.num_accepted < len(s.proposed) for s in steps)  # rolled back past a full window
