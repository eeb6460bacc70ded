"""Several requests' decode calls in one ragged forward (`forward_batch`): each call's logits and
cache bit-identical to the same call alone, whatever the batch's order; chunked prompts with
prefill=True; per-request cache sizes; the refusals; the protocol's fallback for other targets."""

from functools import lru_cache

import pytest
import torch

from specdecode.models.base import ForwardCall, forward_batch
from specdecode.models.native import plan
import test_native
from toy import ToyModel


def _installed() -> bool:
    from specdecode.models.default import default_target_path

    try:
        default_target_path()
    except FileNotFoundError:
        return False
    return True


needs_model = pytest.mark.skipif(not _installed(), reason="the embedded SmolLM2 target is not installed")


load_on_path = lru_cache(maxsize=None)(test_native.load_on_path)  # loaded once for the module's tests


def _variants():
    """(id, kernel path, --dtype): the default (the decode layers in one C call where the host's
    default is 4-bit), the same C call with float32 activations (int4 off AVX512-BF16), the
    per-operation Python loop (bfloat16: bf16 products, or float32 ones without bf16 units), and
    that loop in PyTorch's ops (no C library: PyTorch's 4-bit product)."""
    paths = [p for p in plan.runnable_paths() if p != "torch"]
    best = paths[0] if paths else "torch"
    variants = [("default", best, "auto"), ("loop", best, "bfloat16")]
    q4f = [p for p in paths if p in ("avx2", "portable")]
    if q4f:
        variants.append(("q4f", q4f[0], "int4"))
    return variants + [("torch", "torch", "auto")]


VARIANTS = _variants()


@pytest.fixture(scope="module", params=VARIANTS, ids=[v[0] for v in VARIANTS])
def model(request):
    name, path, dtype = request.param
    model = load_on_path(path, dtype)
    if name == "loop":  # float32 products run in the one C call too: the loop is what is tested here
        model.c_layers = None
    if name == "torch":
        assert model.c_layers is None
    if name == "q4f":
        assert model.c_layers is not None and model.dtype == "int4"
    return model


@pytest.fixture(scope="module")
def default_model():
    paths = [p for p in plan.runnable_paths() if p != "torch"]
    return load_on_path(paths[0] if paths else "torch", "auto")


def copy_cache(model, cache):
    other = model.new_cache(cache.positions)
    other.k.copy_(cache.k)
    other.v.copy_(cache.v)
    other.length = cache.length
    return other


def same_cache(a, b) -> bool:
    n = a.length
    return b.length == n and torch.equal(a.k[:, :, :n], b.k[:, :, :n]) and torch.equal(a.v[:, :, :n], b.v[:, :, :n])


TREE = [-1, 0, 0, 1, 1, 2, 3]  # 7 nodes under the context's newest token


def requests(model):
    """Four prefilled requests (prompts of 30, 57, 12 and 80 tokens, caches of their own sizes) and
    their decode calls: one token, five with all their logits, a draft tree, three with two logits."""
    gen = torch.Generator().manual_seed(0)
    calls = []
    for prompt, size, (T, k, parents) in zip((30, 57, 12, 80), (40, 64, 160, 90),
                                             ((1, 1, None), (5, 5, None), (7, 7, TREE), (3, 2, None))):
        cache = model.new_cache(size)
        model.forward(torch.randint(0, 5000, (1, prompt), generator=gen), cache, num_logits=1)
        calls.append(ForwardCall(torch.randint(0, 5000, (1, T), generator=gen), cache, k, parents))
    return calls


def alone(model, calls):
    """Each call run by itself with `forward`, on a copy of its cache: (logits, cache) per call."""
    results = []
    for c in calls:
        cache = copy_cache(model, c.cache)
        results.append((model.forward(c.tokens, cache, num_logits=c.num_logits, parents=c.parents), cache))
    return results


def on_copies(model, calls):
    return [ForwardCall(c.tokens, copy_cache(model, c.cache), c.num_logits, c.parents) for c in calls]


@pytest.mark.slow
@needs_model
def test_a_ragged_batch_gives_each_call_its_logits_and_cache_as_alone_bit_for_bit(model):
    calls = requests(model)
    reference = alone(model, calls)
    logits = model.forward_batch(calls)
    assert [tuple(x.shape) for x in logits] == [(1, 1, 49152), (1, 5, 49152), (1, 7, 49152), (1, 2, 49152)]
    for i, (c, x, (y, cache)) in enumerate(zip(calls, logits, reference)):
        assert torch.equal(x, y), i
        assert same_cache(c.cache, cache), i
    # keeping one root-to-leaf path of the tree leaves the same cache as alone
    tree, (_, tree_alone) = calls[2].cache, reference[2]
    for cache in (tree, tree_alone):
        cache.keep(12, [12, 13, 15])
    assert same_cache(tree, tree_alone) and len(tree) == 15


@pytest.mark.slow
@needs_model
def test_the_order_of_the_calls_changes_no_calls_logits(model):
    calls = requests(model)
    reference = alone(model, calls)
    for order in ([3, 2, 1, 0], [2, 0, 3, 1]):
        shuffled = on_copies(model, [calls[i] for i in order])
        logits = model.forward_batch(shuffled)
        for i, x, c in zip(order, logits, shuffled):
            assert torch.equal(x, reference[i][0]), (order, i)
            assert same_cache(c.cache, reference[i][1]), (order, i)


@pytest.mark.slow
@needs_model
def test_one_call_is_forward_a_prefill_included(default_model):
    model = default_model
    prompt = torch.arange(1000, 1040)[None]
    a, b = model.new_cache(), model.new_cache()
    batched = forward_batch(model, [ForwardCall(prompt, a, 1)])[0]
    assert torch.equal(batched, model.forward(prompt, b, num_logits=1)) and same_cache(a, b)


@pytest.mark.slow
@needs_model
def test_a_prompt_prefilled_in_chunks_equals_one_prefill_bit_for_bit(default_model):
    model = default_model
    C = model.PREFILL_CHUNK
    prompt = torch.randint(0, 5000, (1, 2 * C + 40), generator=torch.Generator().manual_seed(3))
    whole = model.new_cache()
    expected = model.forward(prompt, whole, num_logits=1, prefill=True)
    pieces = model.new_cache(2 * C + 48)  # sized to the prompt and a few tokens
    for start in range(0, prompt.shape[1], C):
        logits = model.forward(prompt[:, start : start + C], pieces, num_logits=1, prefill=True)
    assert torch.equal(logits, expected) and same_cache(pieces, whole)
    # what prefill=True changes: without it a piece after the first is computed as decode steps
    decoded = model.new_cache()
    model.forward(prompt[:, :C], decoded, num_logits=1, prefill=True)
    model.forward(prompt[:, C:], decoded, num_logits=1, prefill=False)
    assert not torch.equal(decoded.k[:, :, C : 2 * C + 40], whole.k[:, :, C : 2 * C + 40])
    with pytest.raises(ValueError, match="prefill=True takes a chain"):
        model.forward(torch.tensor([[5, 6]]), pieces, parents=[-1, 0], prefill=True)


@pytest.mark.slow
@needs_model
def test_a_prompt_joins_a_batch_in_pieces_of_any_size_where_prompts_are_row_invariant(default_model):
    """With row-invariant prompts (vector integer dot products, no AMX) a prompt goes through the
    decode path: fed in uneven pieces beside another request's decode rows it leaves the cache and
    logits of one call over the whole prompt."""
    model = default_model
    if not model.row_invariant_prompts:
        pytest.skip(f"prompts take the prefill products on this path: {model.kernel_plan}")
    prompt = torch.randint(0, 5000, (1, 90), generator=torch.Generator().manual_seed(4))
    whole = model.new_cache()
    expected = model.forward(prompt, whole, num_logits=1)
    other = model.new_cache(200)
    model.forward(torch.arange(300, 340)[None], other, num_logits=1)
    pieces, start = model.new_cache(100), 0
    for size in (7, 50, 1, 32):
        logits, _ = model.forward_batch([ForwardCall(prompt[:, start : start + size], pieces, 1),
                                         ForwardCall(torch.tensor([[start + 1]]), other, 1)])
        start += size
    assert torch.equal(logits, expected) and same_cache(pieces, whole)


@pytest.mark.slow
@needs_model
def test_refusals_name_the_call_and_change_no_cache(default_model):
    model = default_model
    full = model.new_cache(20)
    model.forward(torch.arange(100, 118)[None], full, num_logits=1)
    other = model.new_cache(64)
    model.forward(torch.arange(200, 210)[None], other, num_logits=1)
    one = torch.tensor([[7]])
    if not model.row_invariant_prompts:
        with pytest.raises(ValueError, match="call 1's cache is empty"):
            model.forward_batch([ForwardCall(one, other, 1), ForwardCall(one, model.new_cache(8), 1)])
    with pytest.raises(ValueError, match="calls 0 and 2 share one cache"):
        model.forward_batch([ForwardCall(one, other, 1), ForwardCall(one, full, 1), ForwardCall(one, other, 1)])
    with pytest.raises(ValueError, match="call 1: 18 cached \\+ 3 new positions exceed the cache's 20 positions"):
        model.forward_batch([ForwardCall(one, other, 1), ForwardCall(torch.tensor([[1, 2, 3]]), full, 3)])
    with pytest.raises(ValueError, match="call 0: a draft tree's parents"):
        model.forward_batch([ForwardCall(torch.tensor([[1, 2]]), other, 2, [-1, 1]), ForwardCall(one, full, 1)])
    assert len(full) == 18 and len(other) == 10
    with pytest.raises(ValueError, match="18 cached \\+ 3 new positions exceed the cache's 20 positions"):
        model.forward(torch.tensor([[1, 2, 3]]), full)
    assert model.forward(torch.tensor([[1, 2]]), full).shape == (1, 2, 49152) and len(full) == 20  # fits exactly
    with pytest.raises(ValueError, match=f"1 to {model.max_positions} positions"):
        model.new_cache(model.max_positions + 1)
    per_position = 2 * model.layers * model.kv_heads * model.head_dim * full.k.element_size()
    assert full.nbytes == 20 * per_position and model.new_cache().nbytes == model.max_positions * per_position


class ChainsOnly:
    """A target whose forward takes no `parents` (as the hf and llama.cpp backends)."""

    def __init__(self, model: ToyModel) -> None:
        self.model = model

    def new_cache(self):
        return self.model.new_cache()

    def forward(self, tokens, cache, num_logits=None):
        return self.model.forward(tokens, cache, num_logits=num_logits)


@pytest.mark.parametrize("target", [ToyModel(vocab_size=5), ChainsOnly(ToyModel(vocab_size=5))],
                         ids=["trees", "chains-only"])
def test_the_fallback_runs_one_forward_per_call(target):
    assert not hasattr(target, "forward_batch")
    trees = isinstance(target, ToyModel)

    def fresh():
        caches = [target.new_cache() for _ in range(3)]
        for i, cache in enumerate(caches):
            target.forward(torch.tensor([[i % 5, 1, 2, 3][: i + 2]]), cache)
        return [ForwardCall(torch.tensor([[4]]), caches[0], 1),
                ForwardCall(torch.tensor([[1, 2, 3]]), caches[1], 2),
                ForwardCall(torch.tensor([[3, 2, 1]]), caches[2], 3, [-1, 0, 0] if trees else None)]

    calls, reference = fresh(), fresh()
    logits = forward_batch(target, calls)
    for c, r, x in zip(calls, reference, logits):
        kwargs = {} if r.parents is None else {"parents": r.parents}
        assert torch.equal(x, target.forward(r.tokens, r.cache, num_logits=r.num_logits, **kwargs))
        assert len(c.cache) == len(r.cache)


@pytest.mark.slow
@needs_model
def test_a_batch_on_the_real_target_gives_each_request_its_output_alone(default_model):
    """Chat prompts sharing the template's system turn (the last repeats the first), greedy and seeded
    sampled at a fixed gamma, greedy at a planned one, in a batch of 4 with prompt pieces and
    reused prefixes: each request's tokens equal the same request decoded alone."""
    from specdecode import PromptLookupDrafter, SamplingParams, encode_prompt, speculative_decode
    from specdecode.batch import Batch

    model = default_model
    greedy, sampled = SamplingParams(temperature=0), SamplingParams(temperature=0.8, top_p=0.9)
    texts = ["Name three primary colours.", "Repeat exactly: red, green, blue, red, green, blue.",
             "What is the capital of France?", "Count to five in words.", "Name three primary colours."]
    asks = [(encode_prompt(model.tokenizer, t), params, seed, gamma)
            for t, (params, seed, gamma) in zip(texts, [(greedy, None, 3), (greedy, None, "auto"), (sampled, 4, 2),
                                                         (sampled, 9, 0), (greedy, None, 3)])]
    batch = Batch(model, max_batch=4, prompt_rows=24)
    requests = [batch.submit(ids, PromptLookupDrafter(), gamma=gamma, params=params, seed=seed, max_new_tokens=24)
                for ids, params, seed, gamma in asks]
    for _ in batch.run():
        pass
    for r, (ids, params, seed, gamma) in zip(requests, asks):
        alone = [t for s in speculative_decode(model, PromptLookupDrafter(), ids, gamma=gamma, params=params,
                                               seed=seed, max_new_tokens=24) for t in s.tokens]
        assert r.finish_reason in ("eos", "length") and r.stats.tokens == alone
    if model.row_invariant_prompts:  # the fifth waited for a slot: by then its twin's prompt was stored
        assert batch.prefixes.reused_tokens == len(asks[4][0]) - 1


def test_simultaneous_requests_with_one_prompt_compute_it_once(default_model):
    """n choices of one prompt, admitted together: the first computes the prompt, the others wait for
    it and copy its keys and values (all but the last token), and each still gets its output alone."""
    from specdecode import PromptLookupDrafter, SamplingParams, encode_prompt, speculative_decode
    from specdecode.batch import Batch

    model = default_model
    if not model.row_invariant_prompts:
        pytest.skip(f"{model!r} computes prompts apart from decode rows: no prefix reuse")
    ids = encode_prompt(model.tokenizer, "Write a sentence about rivers.")
    params = SamplingParams(temperature=0.9)
    batch = Batch(model, max_batch=4, prompt_rows=8)  # the prompt takes several steps: the others must wait
    requests = [batch.submit(ids, PromptLookupDrafter(), gamma=2, params=params, seed=s, max_new_tokens=8)
                for s in range(3)]
    for _ in batch.run():
        pass
    assert batch.prefixes.reused_tokens == 2 * (len(ids) - 1)
    for r, seed in zip(requests, range(3)):
        alone = [t for s in speculative_decode(model, PromptLookupDrafter(), ids, gamma=2, params=params, seed=seed,
                                               max_new_tokens=8) for t in s.tokens]
        assert r.finish_reason in ("eos", "length") and r.stats.tokens == alone
