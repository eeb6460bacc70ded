"""The native PyTorch Llama backend: its products' batch invariance, agreement with transformers,
exact rollback, greedy identity of speculative decoding, and losslessness on the real model."""

from contextlib import contextmanager

import pytest
import torch

from specdecode import (AdaptiveGamma, ModelDrafter, PromptLookupDrafter, SamplingParams, autoregressive_decode,
                        encode_prompt, speculative_decode)
from specdecode.drafters import SuffixDrafter
from specdecode.models.native import Int4Linear, Linear, Q8Linear, activation_dtype, bf16_supported, load_native, plan
from quantized import q4_grid
from stats import chi2_pvalue
from realmodel import COPY_PROMPT, GREEDY, lookup_and_plain_greedy, tokens_of

needs_bf16 = pytest.mark.skipif(not bf16_supported(), reason="this CPU has no bf16 units (AVX512-BF16 or AMX): "
                                "the native backend runs float32 here, and the bf16 kernels are not used")


@needs_bf16
def test_a_wide_product_gives_each_row_the_same_result_however_many_rows_share_it():
    """K = 1536 (SmolLM2's down projection): one oneDNN call over 1536 inputs sums in an order that
    depends on the row count; split into chunks of <= 1024 it does not."""
    gen = torch.Generator().manual_seed(0)
    weight = (torch.randn(576, 1536, generator=gen) * 0.05).bfloat16()
    split = Linear(weight)
    assert split.splits == [768, 768]
    whole = Linear(weight[:, :1024])  # within the limit: one call
    for _ in range(5):
        x = torch.randn(16, 1536, generator=gen).bfloat16()
        alone = torch.cat([split(x[i : i + 1]) for i in range(16)])
        for rows in (2, 5, 8, 16):
            assert torch.equal(split(x[:rows]), alone[:rows])
        assert torch.equal(whole(x[:8, :1024]), torch.cat([whole(x[i : i + 1, :1024]) for i in range(8)]))




def test_int4_products_hold_a_q4_grid_exactly_and_refuse_anything_else():
    gen = torch.Generator().manual_seed(0)
    weight = q4_grid(96, 1536, gen)
    linear = Int4Linear.quantize(weight, torch.float32)
    assert linear is not None and linear.out_features == 96
    torch.testing.assert_close(linear(torch.eye(1536)), weight.t(), rtol=0, atol=1e-6)  # x = I reads W back
    assert Int4Linear.quantize(torch.randn(96, 1536, generator=gen), torch.float32) is None  # not a 4-bit grid
    assert Int4Linear.quantize(weight[:, :1000], torch.float32) is None  # groups of 32 do not tile 1000 inputs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16] if bf16_supported() else [torch.float32])
def test_int4_product_rows_do_not_depend_on_how_many_rows_share_it(dtype):
    gen = torch.Generator().manual_seed(1)
    linear = Int4Linear.quantize(q4_grid(576, 1536, gen), dtype)
    x = torch.randn(16, 1536, generator=gen).to(dtype)
    alone = torch.cat([linear(x[i : i + 1]) for i in range(16)])
    for rows in range(2, 17):
        assert torch.equal(linear(x[:rows]), alone[:rows])


def tiny_llama(directory, grid: bool):
    """A 2-layer Llama directory; its block products 4-bit grids or plain random floats."""
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    with torch.random.fork_rng():  # the same model whatever ran before (a near-tie must not depend on test order)
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    if grid:
        gen = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "layers" in name and param.dim() == 2:
                    param.copy_(q4_grid(*param.shape, gen))
    model.save_pretrained(directory)
    vocab = {f"w{i}": i for i in range(100)}
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="w0"))).save_pretrained(
        directory)
    return directory


def test_auto_runs_4_bit_weights_as_4_bit_and_anything_else_in_bf16(tmp_path):
    grid, plain = tiny_llama(tmp_path / "grid", True), tiny_llama(tmp_path / "plain", False)
    wide = str(activation_dtype()).removeprefix("torch.")
    auto = load_native(grid, "auto")
    # 8-bit activations where the C kernels serve the shapes and have vector integer dot products
    integer = getattr(auto.kernels, "q4q8_vector", False)
    assert auto.dtype == ("w4a8" if integer else "int4") and load_native(plain, "auto").dtype == wide
    with pytest.raises(ValueError, match="plain has no products in 4-bit groups of 32"):
        load_native(plain, "int4")
    # the same model through 4-bit and float32 products: the same function of the tokens
    ids = torch.tensor([[5, 17, 3, 99, 42]])
    int4, full = load_native(grid, "int4"), load_native(grid, "float32")
    a, b = int4.forward(ids, int4.new_cache()), full.forward(ids, full.new_cache())
    assert (a - b).abs().max() < 0.05 * b.abs().max() and torch.equal(a.argmax(-1), b.argmax(-1))


@contextmanager
def forced_path(path: str):
    """$SPECDECODE_KERNELS set to `path` inside the block, restored after it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(plan.ENV, path)
        yield


def _variants():
    """(test id, kernel path, --dtype) of every configuration this host runs: both 4-bit precisions on
    each kernel path (8-bit activations where the path has vector integer dot products: the portable
    build's integer products give the same bits, tested in test_kernels), the float products on the
    best one, PyTorch's ops. The id names what runs: a host without bf16 units runs float32 under a
    float32 id."""
    c_paths = [p for p in plan.runnable_paths() if p != "torch"]
    best = c_paths[0] if c_paths else "torch"
    with forced_path(best):  # whatever $SPECDECODE_KERNELS says outside
        wide = str(activation_dtype()).removeprefix("torch.")
    return ([(f"{path}-int4", path, "int4") for path in c_paths]
            + [(f"{path}-w4a8", path, "w4a8") for path in c_paths if path != "portable"]
            + [(f"{best}-{wide}", best, "bfloat16"), ("torch-int4", "torch", "auto")])


VARIANTS = _variants()


def load_on_path(path: str, dtype: str):
    """The embedded target with the kernel path forced as $SPECDECODE_KERNELS forces it."""
    from specdecode.models.load import load_model

    with forced_path(path):
        model = load_model(None, backend="native", dtype=dtype)
    assert model.kernels.plan.path == path
    return model


@pytest.fixture(scope="module", params=VARIANTS, ids=[v[0] for v in VARIANTS])
def any_native(request):
    """The embedded target on each kernel path and precision this host runs."""
    name, path, dtype = request.param
    model = load_on_path(path, dtype)
    assert f"{path}-{model.dtype}" == name
    assert isinstance(model.head, Q8Linear) == (model.dtype in ("int4", "w4a8") and path != "torch")  # the Q8_0 head
    return model


@pytest.fixture(scope="module")
def native():
    """The embedded target as this host runs it by default (4-bit on the best path): what the
    decode-level tests run on (every other variant's forward is checked against single steps, which
    is what makes its speculative output equal its plain output)."""
    return load_on_path(plan.runnable_paths()[0], "auto")


@pytest.mark.slow
def test_float32_logits_agree_with_transformers():
    from specdecode.models.load import load_model

    native = load_model(None, backend="native", dtype="float32")
    hf = load_model(None, backend="hf", dtype="float32")
    assert native.vocab.fingerprint == hf.vocab.fingerprint and native.eos_token_ids == hf.eos_token_ids
    ids = torch.tensor([list(range(1000, 1300))])  # past one prefill chunk
    a = native.forward(ids, native.new_cache())
    b = hf.forward(ids, hf.new_cache())
    assert a.shape == b.shape == (1, 300, 49152)
    assert (a - b).abs().max() < 2e-3 and torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.slow
@pytest.mark.parametrize("context", [37, 300])
def test_a_forward_over_k_tokens_equals_k_single_steps_bit_for_bit(any_native, context):
    native = any_native
    if native.kernels.plan.path == "torch" and context == 300:
        pytest.skip("PyTorch's ops run ~20x slower than the C paths: checked at 37 cached positions only")
    gen = torch.Generator().manual_seed(context)
    prefix = torch.randint(0, 5000, (1, context), generator=gen)
    tokens = torch.randint(0, 5000, (1, 9), generator=gen)
    batched_cache, single_cache = native.new_cache(), native.new_cache()
    native.forward(prefix, batched_cache, num_logits=1)
    native.forward(prefix, single_cache, num_logits=1)
    singles = torch.cat([native.forward(tokens[:, i : i + 1], single_cache) for i in range(9)], dim=1)
    for k in (9, 5, 2):
        assert torch.equal(native.forward(tokens[:, :k], batched_cache), singles[:, :k])
        batched_cache.trim(k)
    assert len(batched_cache) == context and len(single_cache) == context + 9


@pytest.mark.slow
def test_the_decode_layers_in_one_c_call_equal_the_per_operation_loop_bit_for_bit(any_native):
    native = any_native
    fused = native.c_layers
    # every float32 model on the C kernels: its products are 4-bit, 8-bit or float32 ones decode_layers runs
    assert (fused is not None) == (native.compute_dtype == torch.float32 and native.kernels.plan.path != "torch")
    if fused is None:
        pytest.skip(f"{native!r} runs its layers one operation at a time")
    prefix, tokens = torch.tensor([list(range(2000, 2040))]), torch.tensor([[7, 70, 700, 7000]])
    results = []
    for pointers in (fused, None):
        native.c_layers, cache = pointers, native.new_cache()
        try:
            native.forward(prefix, cache, num_logits=1)
            results.append((native.forward(tokens, cache), cache.k[:, :, :44].clone(), cache.v[:, :, :44].clone()))
        finally:
            native.c_layers = fused
    assert all(torch.equal(a, b) for a, b in zip(*results))


@pytest.mark.slow
def test_a_draft_tree_gives_each_node_its_own_chains_logits_bit_for_bit(any_native):
    """A tree forward computes every node as at the end of the chain of its ancestors; keeping one
    root-to-leaf path leaves the cache as that chain would have."""
    native = any_native
    prefix = torch.tensor([list(range(3000, 3040))])
    tokens, parents = [11, 12, 13, 14, 15, 16, 17], [-1, 0, 0, 1, 1, 2, 3]  # 0 the context's newest token

    def path_to(node):
        return [node] if parents[node] < 0 else path_to(parents[node]) + [node]

    def chain(node):
        cache = native.new_cache()
        native.forward(prefix, cache, num_logits=1)
        return native.forward(torch.tensor([[tokens[i] for i in path_to(node)]]), cache)[0, -1], cache

    cache = native.new_cache()
    native.forward(prefix, cache, num_logits=1)
    tree = native.forward(torch.tensor([tokens]), cache, parents=parents)[0]
    assert tree.shape == (7, 49152) and len(cache) == 47
    for node in range(7):
        assert torch.equal(tree[node], chain(node)[0]), node
    cache.keep(40, [40 + i for i in path_to(6)])
    _, reference = chain(6)
    assert len(cache) == len(reference) == 44
    assert torch.equal(cache.k[:, :, :44], reference.k[:, :, :44]) and torch.equal(cache.v[:, :, :44], reference.v[:, :, :44])
    with pytest.raises(ValueError, match="must give each of its 2 tokens an earlier one"):
        native.forward(torch.tensor([[5, 6]]), cache, parents=[-1, 1])


@pytest.mark.slow
def test_rollback_is_exact_and_logits_come_only_where_asked(any_native):
    native = any_native
    cache = native.new_cache()
    assert native.forward(torch.tensor([[1, 2, 3, 4]]), cache, num_logits=1).shape == (1, 1, 49152)
    first = native.forward(torch.tensor([[1000, 2000, 3000]]), cache)
    cache.trim(3)
    assert torch.equal(first, native.forward(torch.tensor([[1000, 2000, 3000]]), cache)) and len(cache) == 7
    with pytest.raises(ValueError, match="cannot trim"):
        cache.trim(8)


@pytest.mark.slow
@pytest.mark.parametrize("prompt", [COPY_PROMPT, "Write a short story about a robot who learns to paint."])
def test_greedy_prompt_lookup_equals_plain_greedy(native, prompt):
    ids = encode_prompt(native.tokenizer, prompt)
    plain = tokens_of(autoregressive_decode(native, ids, params=GREEDY, max_new_tokens=64))
    for gamma in (4, AdaptiveGamma([0.0, 1.0, 1.02, 1.04, 1.06, 1.08, 1.1, 1.12, 1.14, 1.16])):
        for drafter in (PromptLookupDrafter(), SuffixDrafter()):  # chains, and trees verified in one call
            steps = list(speculative_decode(native, drafter, ids, gamma=gamma, params=GREEDY, max_new_tokens=64))
            assert tokens_of(steps) == plain and len(plain) > 10
            assert sum(len(s.proposed) for s in steps) > 0  # drafts were verified, not plain decoding twice


@pytest.mark.slow
@pytest.mark.statistical
def test_speculative_sampling_matches_the_real_target_over_whole_sequences(native):
    """The real model under top-k 2 at temperature 1 has 8 three-token continuations; their exact
    probabilities come from the target itself. Speculative samples with the shipped draft network
    (a real q) must follow them."""
    from specdecode.models.load import load_model
    from specdecode.models.default import trained_draft_path

    params = SamplingParams(temperature=1.0, top_k=2)
    prompt = list(range(2000, 2012))
    exact = {}

    def walk(seq, mass):
        if len(seq) == 3:
            exact[tuple(seq)] = mass
            return
        logits = native.forward(torch.tensor([prompt + seq]), native.new_cache(), num_logits=1)[0, -1]
        for token, p in enumerate(params.probs(logits).tolist()):
            if p > 0:
                walk(seq + [token], mass * p)

    walk([], 1.0)
    assert len(exact) == 8
    drafter = ModelDrafter(load_model(str(trained_draft_path())))
    gen = torch.Generator().manual_seed(0)
    outcomes = []
    for _ in range(200):
        steps = speculative_decode(native, drafter, prompt, gamma=2, params=params, max_new_tokens=3, generator=gen,
                                   eos_token_ids=[])
        outcomes.append(tuple(t for s in steps for t in s.tokens))
    assert chi2_pvalue(outcomes, exact) > 1e-3


@pytest.mark.slow
def test_lookup_drafts_are_accepted_on_a_copy_prompt(native):
    steps, plain = lookup_and_plain_greedy(native, gamma=4, max_new_tokens=32)
    assert tokens_of(steps) == plain
    assert sum(s.num_accepted for s in steps) > 0 and len(steps) < 32


@pytest.mark.slow
def test_logprobs_are_the_targets_own_and_the_same_with_and_without_speculation(native):
    """Each token's log-probability (and its top alternatives) comes from the target row that
    predicted it: with prompt lookup (drafted tokens among them) exactly as in plain decoding, and
    equal to one forward over the whole text. On the default path: the bookkeeping is the loop's,
    and every other path's rows are checked against single steps above."""
    from specdecode import PromptLookupDrafter, autoregressive_decode, speculative_decode
    from specdecode.sampling import SamplingParams

    greedy = SamplingParams(temperature=0)
    prompt = list(range(3000, 3012)) * 2
    plain = [lp for s in autoregressive_decode(native, prompt, params=greedy, max_new_tokens=20, logprobs=3)
             for lp in s.logprobs]
    steps = list(speculative_decode(native, PromptLookupDrafter(), prompt, gamma=4, params=greedy,
                                    max_new_tokens=20, logprobs=3))
    spec = [lp for s in steps for lp in s.logprobs]
    assert any(s.num_accepted for s in steps)  # drafted tokens are among them
    assert spec == plain  # token, log-probability and alternatives, bit for bit
    # greedy: the best token (bf16 logits can tie, and argmax and top-k may break a tie differently)
    assert all(lp.top[0][1] == lp.logprob and len(lp.top) == 3 for lp in spec)
    tokens = [lp.token for lp in spec]
    whole = torch.log_softmax(native.forward(torch.tensor([prompt + tokens]), native.new_cache())[0].double(), -1)
    expected = whole[len(prompt) - 1 : -1].gather(1, torch.tensor(tokens)[:, None])[:, 0]
    # one forward prefills in other numerics (oneDNN's bf16 products where activations are bf16: measured up
    # to 0.1 apart on avx512-int4); a row off by one position would be nats apart
    tolerance = 1e-3 if native.compute_dtype == torch.float32 else 0.2
    assert torch.allclose(torch.tensor([lp.logprob for lp in spec], dtype=torch.float64), expected, atol=tolerance)
