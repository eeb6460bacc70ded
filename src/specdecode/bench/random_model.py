"""Random-weight Llama models of any shape as GGUF files, written the way llama.cpp's converter writes
them (the `gguf` writer; the embedded model's tokenizer, so llama.cpp loads them) and quantised by
llama.cpp itself (llama-cpp-python's quantize API) into each format a user brings: what the tests
check the native backend against llama.cpp on, and what benchmarks/size_sweep.py times."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from specdecode.models.default import default_target_path

FORMATS = ("Q4_0", "Q4_1", "Q8_0", "Q4_K_M", "Q5_K_M", "F16")


@lru_cache(maxsize=4)
def _tokenizer_fields(source: Path) -> tuple:
    """Every tokenizer.* field of the GGUF file `source`: (key, type, contents, array item type),
    read once a process (`gguf`'s reader takes seconds over a 49,152-token vocabulary)."""
    import gguf

    reader = gguf.GGUFReader(source)
    return tuple((key, field.types[0], field.contents(), field.types[-1])
                 for key, field in reader.fields.items() if key.startswith("tokenizer."))


def _copy_tokenizer(writer, source: Path, vocab: int) -> None:
    """Every tokenizer.* field of the GGUF file `source` (the embedded model's: vocabulary, merges,
    special ids, chat template), its vocabulary padded to `vocab` entries with plain tokens no merge
    reaches (`tok<id>`): a Llama 3-sized table and head, with the embedded model's tokenisation."""
    import gguf

    for key, kind, contents, item in _tokenizer_fields(source):
        if key == "tokenizer.ggml.tokens":
            contents = contents + [f"tok{i}" for i in range(len(contents), vocab)]
        elif key == "tokenizer.ggml.token_type":
            contents = contents + [int(gguf.TokenType.NORMAL)] * (vocab - len(contents))
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, contents, kind, sub_type=item)
        else:
            writer.add_key_value(key, contents, kind)


EMBEDDED_VOCAB = 49152
# (layers, dim, heads, kv_heads, hidden, vocabulary): SmolLM2's shapes by parameter count (0.1, 0.4 and
# 1.7 billion), and Llama 3.2's (1B and 3B: a 128,256-token vocabulary, tied, with Llama 3's RoPE factors)
SHAPES = {"135M": (30, 576, 9, 3, 1536, EMBEDDED_VOCAB), "360M": (32, 960, 15, 5, 2560, EMBEDDED_VOCAB),
          "1.7B": (24, 2048, 32, 32, 8192, EMBEDDED_VOCAB),
          "llama3.2-1B": (16, 2048, 32, 8, 8192, 128256), "llama3.2-3B": (28, 3072, 24, 8, 8192, 128256)}
LLAMA3_THETA = 500000.0


def llama3_factors(head_dim: int, theta: float, factor: float = 8.0, low: float = 1.0, high: float = 4.0,
                   context: int = 8192) -> np.ndarray:
    """Llama 3.1's RoPE frequency factors as its converter writes them (`rope_freqs`): 1 for pairs
    turning faster than context / high per wavelength, `factor` for those slower than context / low,
    a smooth blend between (Llama 3.2: factor 32)."""
    factors = []
    for i in range(0, head_dim, 2):
        wavelength = 2 * np.pi * theta ** (i / head_dim)
        if wavelength < context / high:
            factors.append(1.0)
        elif wavelength > context / low:
            factors.append(factor)
        else:
            smooth = (context / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)


def write_shape(path: Path, size: str, dtype: str = "F16", context: int = 2048) -> Path:
    """A random-weight model of one of `SHAPES` (the Llama 3.2 ones with their RoPE base and factors)."""
    layers, dim, heads, kv_heads, hidden, vocab = SHAPES[size]
    llama3 = size.startswith("llama3")
    return write_llama(path, layers, dim, heads, kv_heads, hidden, context=context, dtype=dtype, vocab=vocab,
                       theta=LLAMA3_THETA if llama3 else 10000.0,
                       tensors={"rope_freqs.weight": llama3_factors(dim // heads, LLAMA3_THETA, factor=32.0)}
                       if llama3 else None)


def write_llama(path: Path, layers: int = 2, dim: int = 128, heads: int = 4, kv_heads: int = 2, hidden: int = 256,
                seed: int = 0, context: int = 512, dtype: str = "F32", architecture: str = "llama",
                head_dim: int | None = None, window: int = 8, tensors: dict | None = None,
                keys: dict | None = None, vocab: int = EMBEDDED_VOCAB, theta: float = 10000.0) -> Path:
    """A Llama-family model of random weights as a GGUF file (tied embeddings, as SmolLM2's):
    `architecture` llama, mistral, qwen2 (with q, k, v biases), qwen3 (with q and k norms, and
    `head_dim` other than dim / heads where given) or gemma3 (q and k norms, norms of the attention's
    and the MLP's outputs, every layer but each sixth with a sliding window of `window` positions,
    RoPE base 1e6 scaled linearly by 8 on the others as Gemma 3 4B's, 10000 on the sliding ones;
    its norms' weights stored as llama.cpp's converter stores them, 1 + w). The embeddings'
    spread (0.25; the head is tied) gives next-token distributions of a few nats' entropy: neither
    uniform nor one-hot, so that a misread weight moves them measurably (Gemma's embeddings, scaled
    by sqrt(dim), would make the input token the prediction but for post-norms of ~3).

    `tensors` ({name: float32 array}) and `keys` ({key: bool, int (uint32), float (float32) or str}) are
    written besides, a key given replacing the one written by default: pieces llama.cpp reads that the
    tests need in a file (Llama 3's `rope_freqs`, a bias, a scaling type). `vocab` entries (the
    embedded model's tokenizer, padded past its 49,152) and RoPE base `theta` (not Gemma's)."""
    import gguf

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), architecture)
    head_dim = head_dim or dim // heads
    writer.add_block_count(layers)
    writer.add_context_length(context)
    writer.add_embedding_length(dim)
    writer.add_feed_forward_length(hidden)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(1e6 if architecture == "gemma3" else theta)
    writer.add_layer_norm_rms_eps(1e-6 if architecture == "gemma3" else 1e-5)
    if architecture == "gemma3":
        writer.add_sliding_window(window)
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(8.0)
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "F32" else gguf.LlamaFileType.MOSTLY_F16)
    for key, value in (keys or {}).items():
        kind = {bool: gguf.GGUFValueType.BOOL, int: gguf.GGUFValueType.UINT32, float: gguf.GGUFValueType.FLOAT32,
                str: gguf.GGUFValueType.STRING}[type(value)]
        writer.kv_data[0].pop(key, None)  # replaced, not written twice
        writer.add_key_value(key, value, kind)
    matrix = np.float32 if dtype == "F32" else np.float16  # the 2-d tensors' type (F16 halves a big model's file)
    _copy_tokenizer(writer, default_target_path(), vocab)

    def tensor(name: str, *shape: int, std: float) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape, dtype=np.float32) * std).astype(matrix))

    tensor("token_embd.weight", vocab, dim, std=0.25)
    writer.add_tensor("output_norm.weight", (1 + 0.1 * rng.standard_normal(dim)).astype(np.float32))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", (1 + 0.1 * rng.standard_normal(dim)).astype(np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", (1 + 0.1 * rng.standard_normal(dim)).astype(np.float32))
        tensor(f"blk.{i}.attn_q.weight", heads * head_dim, dim, std=dim ** -0.5)
        tensor(f"blk.{i}.attn_k.weight", kv_heads * head_dim, dim, std=dim ** -0.5)
        tensor(f"blk.{i}.attn_v.weight", kv_heads * head_dim, dim, std=dim ** -0.5)
        tensor(f"blk.{i}.attn_output.weight", dim, heads * head_dim, std=(heads * head_dim) ** -0.5)
        tensor(f"blk.{i}.ffn_gate.weight", hidden, dim, std=dim ** -0.5)
        tensor(f"blk.{i}.ffn_up.weight", hidden, dim, std=dim ** -0.5)
        tensor(f"blk.{i}.ffn_down.weight", dim, hidden, std=hidden ** -0.5)
        if architecture == "qwen2":
            for name, rows in (("attn_q", heads), ("attn_k", kv_heads), ("attn_v", kv_heads)):
                writer.add_tensor(f"blk.{i}.{name}.bias", (0.1 * rng.standard_normal(rows * head_dim)).astype(np.float32))
        if architecture in ("qwen3", "gemma3"):
            for name in ("attn_q_norm", "attn_k_norm"):
                writer.add_tensor(f"blk.{i}.{name}.weight", (1 + 0.1 * rng.standard_normal(head_dim)).astype(np.float32))
        if architecture == "gemma3":  # 3x: the layers' outputs, not the scaled embedding, lead the residual stream
            for name in ("post_attention_norm", "post_ffw_norm"):
                writer.add_tensor(f"blk.{i}.{name}.weight", (3 + 0.3 * rng.standard_normal(dim)).astype(np.float32))
    for name, value in (tensors or {}).items():
        writer.add_tensor(name, np.asarray(value, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def quantize(source: Path, fmt: str, out: Path | None = None) -> Path:
    """`source` quantised by llama.cpp into `fmt` (one of FORMATS)."""
    import llama_cpp

    out = out or source.with_name(f"{source.stem}.{fmt}.gguf")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{fmt}")
    params.nthread = 2
    if llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), params) != 0:
        raise RuntimeError(f"llama.cpp could not quantise {source} to {fmt}")
    return out
