"""Strict reading: a GGUF file runs natively only where the native path computes everything llama.cpp
reads in it (`models/native/reading.py`, which follows llama-cpp-python 0.3.36's vendored llama.cpp
loader: `src/llama-model.cpp` and `src/models/{llama,qwen2,qwen3,gemma3}.cpp`).

Each optional piece llama.cpp's loader takes for an architecture that the native path does not
compute is written into a small random file here; the native loader must refuse it in one sentence
naming the piece, `--backend auto` must hand the file to llama.cpp, and llama.cpp must load the file
(so the piece is one it reads: the refusal is not of a file nobody runs)."""

from __future__ import annotations

import numpy as np
import pytest

from specdecode.bench.random_model import llama3_factors, write_llama
from specdecode.models.native.arch import ARCHITECTURES
from specdecode.models.native.reading import refusal
from specdecode.models.gguf import GGUFHeader
from specdecode.models.native.source import NativeRefusal

DIM, HEADS, KV_HEADS, HIDDEN = 128, 4, 2, 256  # write_llama's default shape
HEAD = DIM // HEADS


def _fields_and_tensors(path):
    header = GGUFHeader(path)
    return header.fields, list(header.tensors)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    root = tmp_path_factory.mktemp("reading")
    return {arch: write_llama(root / f"{arch}.gguf", architecture=arch) for arch in ARCHITECTURES}


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_the_files_the_native_path_computes_are_read_without_a_refusal(plain, arch):
    fields, tensors = _fields_and_tensors(plain[arch])
    assert refusal(arch, fields, tensors) is None


# The matrix of what llama.cpp's loader (0.3.36) accepts for each architecture the native path runs,
# beside the tensors every such file has: piece -> (the architectures whose loader takes it, extra
# tensors, extra keys, what a refusal names). create_tensor_qkv takes q, k, v biases for all four; the
# generic pass takes a `.scale` beside every projection; load_hparams reads the RoPE scaling type and
# attention factor for all; the llama loader alone takes output and MLP biases and rope_freqs, the
# qwen2 one an output bias. Each (architecture, piece) is either computed, and compared with
# llama.cpp by a test (`COMPUTED`), or refused here by name.
ALL = ("llama", "qwen2", "qwen3", "gemma3")
SCALED = {"llama": "attn_q", "qwen2": "ffn_down", "qwen3": "attn_output", "gemma3": "ffn_gate"}
PIECES = {
    "qkv-biases": (ALL, lambda a: {} if a == "qwen2" else {  # the writer gives a Qwen2 its biases already
        f"blk.0.attn_{n}.bias": np.zeros(HEAD * h) for n, h in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS))},
        {}, ".bias'"),
    # the generic pass takes one beside every projection; one a file, a different projection each
    "scale": (ALL, lambda a: {f"blk.1.{SCALED[a]}.scale": np.ones(1)}, {}, ".scale'"),
    "yarn": (ALL, lambda a: {}, lambda a: {f"{a}.rope.scaling.type": "yarn", f"{a}.rope.scaling.factor": 4.0}, "'yarn'"),
    "attn_factor": (ALL, lambda a: {}, lambda a: {f"{a}.rope.scaling.attn_factor": 0.5}, "rope.scaling.attn_factor"),
    "attn_output.bias": (("llama",), lambda a: {"blk.0.attn_output.bias": np.zeros(DIM)}, {}, "'blk.0.attn_output.bias'"),
    "ffn_down.bias": (("llama",), lambda a: {"blk.1.ffn_down.bias": np.zeros(DIM)}, {}, "'blk.1.ffn_down.bias'"),
    "ffn_up.bias": (("llama",), lambda a: {"blk.0.ffn_up.bias": np.zeros(HIDDEN)}, {}, "'blk.0.ffn_up.bias'"),
    "ffn_gate.bias": (("llama",), lambda a: {"blk.0.ffn_gate.bias": np.zeros(HIDDEN)}, {}, "'blk.0.ffn_gate.bias'"),
    "output.bias": (("qwen2",), lambda a: {"output.bias": np.zeros(49152)}, {}, "'output.bias'"),
    "rope_freqs": (("llama",), lambda a: {"rope_freqs.weight": np.ones(HEAD // 2)}, {}, "'rope_freqs.weight'"),
}
# computed natively, each compared with llama.cpp on the same file by the test named
COMPUTED = {("qwen2", "qkv-biases"): "test_gguf.py::test_qwen_architectures_match_llama_cpp_...",
            ("llama", "rope_freqs"): "test_reading.py::test_llama3_rope_factors_are_applied_as_llama_cpp_applies_them"}
CASES = {f"{arch}-{piece}": (arch, *rest) for piece, (archs, *rest) in PIECES.items() for arch in archs}


def test_the_matrix_covers_every_piece_for_every_architecture_its_loader_takes_it_for():
    assert len(CASES) == 4 * 4 + 6 and set(ARCHITECTURES) == set(ALL)
    for arch, piece in COMPUTED:
        assert f"{arch}-{piece}" in CASES


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_each_piece_llama_cpp_reads_is_computed_or_refused_by_name(case, tmp_path):
    arch, tensors, keys, named = CASES[case]
    piece = case.split("-", 1)[1]
    path = write_llama(tmp_path / f"{case}.gguf", architecture=arch, tensors=tensors(arch),
                       keys=keys(arch) if callable(keys) else keys)
    fields, names = _fields_and_tensors(path)
    llama_cpp = pytest.importorskip("llama_cpp")
    model = llama_cpp.Llama(str(path), n_ctx=64, verbose=False)  # llama.cpp reads the piece: no refusal of a dead file
    assert model.n_vocab() == 49152
    del model
    why = refusal(arch, fields, names)
    if (arch, piece) in COMPUTED:  # compared with llama.cpp there
        assert why is None, why
        return
    assert why is not None and named in why, why
    from specdecode.models.native import load_native

    with pytest.raises(NativeRefusal, match="cannot run natively") as refused:
        load_native(path)
    assert named in str(refused.value) and "\n" not in str(refused.value)
    from specdecode.models.load import auto_backend

    backend, reason = auto_backend(str(path), "cpu")
    assert backend == "llama.cpp" and named in reason, reason


def test_a_layer_with_some_of_its_q_k_v_biases_is_refused():
    """The native layers add q|k|v's bias as one; a file with q's alone is not what they compute."""
    fields = {"qwen2.block_count": 1}
    names = ["token_embd.weight", "output_norm.weight", "blk.0.attn_q.bias",
             *(f"blk.0.{n}" for n in ARCHITECTURES["qwen2"].layer_tensors)]
    assert "attn_q.bias" in refusal("qwen2", fields, names)
    names += ["blk.0.attn_k.bias", "blk.0.attn_v.bias"]
    assert refusal("qwen2", fields, names) is None


def test_a_missing_tensor_a_layer_past_the_count_and_a_per_layer_size_are_refused():
    required = sorted(ARCHITECTURES["llama"].layer_tensors)
    names = ["token_embd.weight", "output_norm.weight", *(f"blk.0.{n}" for n in required)]
    fields = {"llama.block_count": 1}
    assert refusal("llama", fields, names) is None
    assert "'blk.0.ffn_up.weight'" in refusal("llama", fields, [n for n in names if n != "blk.0.ffn_up.weight"])
    assert "'blk.1.attn_norm.weight'" in refusal("llama", fields, names + ["blk.1.attn_norm.weight"])
    assert "per layer" in refusal("llama", {**fields, "llama.feed_forward_length": [256, 512]}, names)
    assert refusal("llama", {**fields, "llama.feed_forward_length": [256]}, names) is None
    assert "'phi3'" in refusal("phi3", {}, names)
    # Llama 3's rope_freqs is a Llama's (llama.cpp's qwen and gemma loaders take none)
    assert refusal("llama", fields, names + ["rope_freqs.weight"]) is None
    qwen = ["token_embd.weight", "output_norm.weight", *(f"blk.0.{n}" for n in ARCHITECTURES["qwen3"].layer_tensors)]
    assert "'rope_freqs.weight'" in refusal("qwen3", {"qwen3.block_count": 1}, qwen + ["rope_freqs.weight"])
    # a rotary dimension count other than the head size (llama.cpp's own graphs assert it away for these
    # architectures, so no file of it runs there either)
    heads = {"llama.attention.head_count": 4, "llama.embedding_length": 128}
    assert "llama.rope.dimension_count" in refusal("llama", {**fields, **heads, "llama.rope.dimension_count": 16}, names)
    assert refusal("llama", {**fields, **heads, "llama.rope.dimension_count": 32}, names) is None


def test_llama3_rope_factors_are_applied_as_llama_cpp_applies_them(tmp_path):
    """A Llama with Llama 3.1's rope_freqs, quantised to Q4_0: native next-token distributions within
    the oracle's thresholds of llama.cpp's on the same file over 128 positions, on every kernel path
    this host runs; the same file read without its factors is far off (what the native path computed
    before it applied them), so the comparison sees them; greedy speculation stays lossless."""
    import torch

    llama_cpp = pytest.importorskip("llama_cpp")
    from specdecode.bench.random_model import quantize
    from specdecode.drafters import PromptLookupDrafter
    from specdecode.models.load import auto_backend, load_model
    from specdecode.models.native import load_native, plan
    from specdecode.sampling import SamplingParams
    from specdecode import autoregressive_decode, speculative_decode

    # Llama 3.1's formula with an original context of 64 positions, so that its factor-8 pairs turn within
    # the 128 positions compared (at 8,192 they would all but stand still there, and any factors would do)
    factors = llama3_factors(HEAD, 10000.0, context=64)
    assert factors.min() == 1.0 and factors.max() == 8.0 and len(set(factors.tolist())) > 2
    path = quantize(write_llama(tmp_path / "llama3.gguf", context=256, tensors={"rope_freqs.weight": factors}),
                    "Q4_0")
    assert auto_backend(str(path), "cpu")[0] == "native"
    tokens = torch.randint(0, 49152, (128,), generator=torch.Generator().manual_seed(4)).tolist()

    def logprobs(model):
        return torch.log_softmax(model.forward(torch.tensor([tokens]), model.new_cache())[0].double(), -1)

    theirs = logprobs(load_model(str(path), backend="llama.cpp", n_ctx=256))
    for kernels in plan.runnable_paths():
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(plan.ENV, kernels)
            native = load_native(path, max_positions=256)
        ours = logprobs(native)
        kl = (theirs.exp() * (theirs - ours)).sum(-1).mean().item()
        agree = (ours.argmax(-1) == theirs.argmax(-1)).double().mean().item()
        assert kl < 0.01 and agree >= 0.85, (kernels, kl, agree)
    unscaled = load_native(path, max_positions=256)
    unscaled.cos, unscaled.sin = unscaled._rope_table(10000.0)  # the factors left out
    ours = logprobs(unscaled)
    assert (theirs.exp() * (theirs - ours)).sum(-1).mean().item() > 0.1
    greedy, prompt = SamplingParams(temperature=0), tokens[:24] * 2
    plain = [t for s in autoregressive_decode(native, prompt, params=greedy, max_new_tokens=40) for t in s.tokens]
    steps = list(speculative_decode(native, PromptLookupDrafter(), prompt, gamma=4, params=greedy, max_new_tokens=40))
    assert [t for s in steps for t in s.tokens] == plain and any(s.num_accepted for s in steps)
