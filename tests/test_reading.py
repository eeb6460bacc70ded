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

from specdecode.bench.random_model import write_llama
from specdecode.models.native.reading import LAYERS, refusal
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
    return {arch: write_llama(root / f"{arch}.gguf", architecture=arch) for arch in LAYERS}


@pytest.mark.parametrize("arch", list(LAYERS))
def test_the_files_the_native_path_computes_are_read_without_a_refusal(plain, arch):
    fields, tensors = _fields_and_tensors(plain[arch])
    assert refusal(arch, fields, tensors) is None


# (architecture, extra tensors, extra keys, what the refusal names)
_rope_freqs = {"rope_freqs.weight": np.where(np.arange(HEAD // 2) < 8, 1.0, 8.0)}
CASES = {
    "llama-rope_freqs": ("llama", _rope_freqs, {}, "'rope_freqs.weight'"),
    "llama-attn_output.bias": ("llama", {"blk.0.attn_output.bias": np.zeros(DIM)}, {}, "'blk.0.attn_output.bias'"),
    "llama-ffn_down.bias": ("llama", {"blk.1.ffn_down.bias": np.zeros(DIM)}, {}, "'blk.1.ffn_down.bias'"),
    "llama-ffn_up.bias": ("llama", {"blk.0.ffn_up.bias": np.zeros(HIDDEN)}, {}, "'blk.0.ffn_up.bias'"),
    "llama-qkv-biases": ("llama", {f"blk.0.attn_{n}.bias": np.zeros(HEAD * h)
                                   for n, h in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS))}, {}, ".bias'"),
    "llama-weight-scale": ("llama", {"blk.0.attn_q.scale": np.ones(1)}, {}, "'blk.0.attn_q.scale'"),
    "llama-yarn": ("llama", {}, {"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}, "'yarn'"),
    "llama-attn_factor": ("llama", {}, {"llama.rope.scaling.attn_factor": 0.5}, "llama.rope.scaling.attn_factor"),
    "qwen2-output.bias": ("qwen2", {"output.bias": np.zeros(49152)}, {}, "'output.bias'"),
    "gemma3-attn_output.scale": ("gemma3", {"blk.1.attn_output.scale": np.ones(1)}, {}, "'blk.1.attn_output.scale'"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_piece_llama_cpp_reads_and_the_native_path_does_not_compute_is_refused_by_name(case, tmp_path):
    arch, tensors, keys, named = CASES[case]
    path = write_llama(tmp_path / f"{case}.gguf", architecture=arch, tensors=tensors, keys=keys)
    fields, names = _fields_and_tensors(path)
    why = refusal(arch, fields, names)
    assert why is not None and named in why, why
    from specdecode.models.native import load_native

    with pytest.raises(NativeRefusal, match="cannot run natively") as refused:
        load_native(path)
    assert named in str(refused.value) and "\n" not in str(refused.value)
    llama_cpp = pytest.importorskip("llama_cpp")
    from specdecode.models.load import auto_backend

    backend, reason = auto_backend(str(path), "cpu")
    assert backend == "llama.cpp" and named in reason, reason
    model = llama_cpp.Llama(str(path), n_ctx=64, verbose=False)  # llama.cpp reads the piece: no refusal of a dead file
    assert model.n_vocab() == 49152


def test_a_layer_with_some_of_its_q_k_v_biases_is_refused():
    """The native layers add q|k|v's bias as one; a file with q's alone is not what they compute."""
    fields = {"qwen2.block_count": 1}
    names = ["token_embd.weight", "output_norm.weight", "blk.0.attn_q.bias",
             *(f"blk.0.{n}" for n in LAYERS["qwen2"][0])]
    assert "attn_q.bias" in refusal("qwen2", fields, names)
    names += ["blk.0.attn_k.bias", "blk.0.attn_v.bias"]
    assert refusal("qwen2", fields, names) is None


def test_a_missing_tensor_a_layer_past_the_count_and_a_per_layer_size_are_refused():
    required = sorted(LAYERS["llama"][0])
    names = ["token_embd.weight", "output_norm.weight", *(f"blk.0.{n}" for n in required)]
    fields = {"llama.block_count": 1}
    assert refusal("llama", fields, names) is None
    assert "'blk.0.ffn_up.weight'" in refusal("llama", fields, [n for n in names if n != "blk.0.ffn_up.weight"])
    assert "'blk.1.attn_norm.weight'" in refusal("llama", fields, names + ["blk.1.attn_norm.weight"])
    assert "per layer" in refusal("llama", {**fields, "llama.feed_forward_length": [256, 512]}, names)
    assert refusal("llama", {**fields, "llama.feed_forward_length": [256]}, names) is None
    assert "'phi3'" in refusal("phi3", {}, names)
    # a rotary dimension count other than the head size (llama.cpp's own graphs assert it away for these
    # architectures, so no file of it runs there either)
    heads = {"llama.attention.head_count": 4, "llama.embedding_length": 128}
    assert "llama.rope.dimension_count" in refusal("llama", {**fields, **heads, "llama.rope.dimension_count": 16}, names)
    assert refusal("llama", {**fields, **heads, "llama.rope.dimension_count": 32}, names) is None
