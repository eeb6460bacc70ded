"""Where a native model's hyperparameters and weights come from: a transformers directory (float
tensors in safetensors) or a GGUF file read directly over a memory map (its own quantised blocks:
no dequantisation on the way, no converted copy on disk).

Both give the model the same things under llama.cpp's tensor names (`attn_q`, `ffn_down`,
`token_embd`, ...): a `Hyper` of the architecture's sizes, and each weight as float, 4-bit groups
(`Groups4`: Q4_0, Q4_1 and Q5_1 blocks; `GroupsK`: Q4_K and Q5_K ones), 8-bit groups (`Groups8`: Q8_0
and Q5_0 blocks) or 6-bit ones (`Groups6`: Q6_K): one entry of `FORMATS` each, the block types read
as they are.
A GGUF type the kernels have no product for is dequantised by the `gguf` package (exact: the
file's own values), so every file runs, those tensors as float.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple, Union

import numpy as np
import torch

from ..gguf import GGUFHeader
from .arch import ARCHITECTURES as _ARCHITECTURES
from .reading import refusal

GROUP = 32  # inputs a scale covers in Q4_0, Q4_1 and Q8_0 blocks

# general.architecture values the native model runs, each declared in its module (`arch`)
ARCHITECTURES = tuple(_ARCHITECTURES)


class NativeRefusal(ValueError):
    """A model file the native path does not compute exactly as llama.cpp does (`reading.refusal`)."""


class Groups4(NamedTuple):
    """w = d q + m per group of 32 inputs, q in 0..15 (Q4_1; Q4_0 is m = -8 d, exact in float16) or
    0..31 (Q5_1)."""

    q: torch.Tensor  # [N, K] uint8
    d: torch.Tensor  # [N, K / 32] float16
    m: torch.Tensor  # [N, K / 32] float16

    def dense(self) -> torch.Tensor:  # [N, K] float32
        N, K = self.q.shape
        w = self.q.view(N, K // GROUP, GROUP).float() * self.d.float()[..., None] + self.m.float()[..., None]
        return w.view(N, K)


class GroupsK(NamedTuple):
    """The K-quants' 4- and 5-bit groups (Q4_K, Q5_K) as their files hold them: per super-block of 256
    inputs d and dmin, per group of 32 a 6-bit scale sc and minimum mn; w = d sc q - dmin mn, q in
    0..15 or 0..31 (llama.cpp's dequantize_row_q4_K and _q5_K)."""

    q: torch.Tensor  # [N, K] uint8
    d: torch.Tensor  # [N, K / 256] float16
    dmin: torch.Tensor  # [N, K / 256] float16
    sc: torch.Tensor  # [N, K / 32] uint8, 0..63
    mn: torch.Tensor  # [N, K / 32] uint8, 0..63

    def dense(self) -> torch.Tensor:  # [N, K] float32
        N, K = self.q.shape
        per = lambda block: block.float().repeat_interleave(8, dim=1)  # noqa: E731  (a super-block's, per group)
        scale, low = per(self.d) * self.sc.float(), -(per(self.dmin) * self.mn.float())  # exact in float32
        return (self.q.view(N, K // GROUP, GROUP).float() * scale[..., None] + low[..., None]).view(N, K)


class Groups8(NamedTuple):
    """w = d q per group of 32 inputs, q in -127..127 (Q8_0; Q5_0's 5-bit values less 16)."""

    q: torch.Tensor  # [N, K] int8
    d: torch.Tensor  # [N, K / 32] float32 (exact: the file's float16)

    def dense(self) -> torch.Tensor:  # [N, K] float32
        N, K = self.q.shape
        return (self.q.view(N, self.d.shape[1], -1).float() * self.d[..., None]).view(N, K)


class Groups6(NamedTuple):
    """Q6_K's groups as the file factors them: w = d sc q per group of 16 inputs, q its 6-bit values
    less 32 (-32..31), sc the group's int8 scale, d its super-block's (256 inputs) float16 one."""

    q: torch.Tensor  # [N, K] int8
    d: torch.Tensor  # [N, K / 256] float32 (the file's float16)
    sc: torch.Tensor  # [N, K / 16] int8

    def scales(self) -> torch.Tensor:  # [N, K / 16] float32, d sc: exact (an 11-bit by an 8-bit integer)
        return self.d.repeat_interleave(16, dim=1) * self.sc.float()

    def dense(self) -> torch.Tensor:  # [N, K] float32
        N, K = self.q.shape
        return (self.q.view(N, K // 16, 16).float() * self.scales()[..., None]).view(N, K)


class Stacked(NamedTuple):
    """Weights of different kinds with the same inputs, stacked along their outputs (a Q4_K q|k beside
    a Q6_K v, as llama.cpp's Q4_K_M and Q5_K_M files mix them): each part keeps its own groups."""

    parts: tuple  # of Groups4 / GroupsK / Groups8 / Groups6, in output order

    def dense(self) -> torch.Tensor:  # [N, K] float32
        return torch.cat([as_float(p).float() for p in self.parts])


Weight = Union[torch.Tensor, Groups4, GroupsK, Groups8, Groups6, Stacked]


def as_float(weight: Weight) -> torch.Tensor:
    """Any weight as float ([N, K] float32 for groups, a float tensor as it is)."""
    return weight if isinstance(weight, torch.Tensor) else weight.dense()


def take_rows(weight: Weight, index: torch.Tensor) -> Weight:
    """Rows `index` of a weight, in its own form (groups stay groups)."""
    return weight[index] if isinstance(weight, torch.Tensor) else type(weight)(*(field[index] for field in weight))


def concat(parts: list[Weight]) -> Weight:
    """Weights with the same inputs stacked along their outputs (q|k|v, gate|up): groups of one kind
    stay groups, groups of several kinds a `Stacked` of runs of one kind, anything with a float
    weight float."""
    kind = type(parts[0])
    if kind is not torch.Tensor and all(type(p) is kind for p in parts):
        return kind(*(torch.cat(fields) for fields in zip(*parts)))
    if all(isinstance(p, (Groups4, GroupsK, Groups8, Groups6)) for p in parts):
        runs = [[parts[0]]]  # neighbours of one kind (and one group size) fused
        for p in parts[1:]:
            last = runs[-1][-1]
            if type(p) is type(last) and p.d.dtype == last.d.dtype and p.d.shape[1] == last.d.shape[1]:
                runs[-1].append(p)
            else:
                runs.append([p])
        return Stacked(tuple(concat(run) for run in runs))
    return torch.cat([as_float(p).float() for p in parts])


class Embedding:
    """Token embeddings looked up in the weight as stored: a float table, or groups whose rows are
    dequantised as they are looked up (a Q8_0 table is a quarter of float32's memory)."""

    def __init__(self, weight: Weight, dtype: torch.dtype) -> None:  # weight [V, D]
        self.weight = weight.to(dtype) if isinstance(weight, torch.Tensor) else weight
        self.dtype = dtype

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, D]
        if isinstance(self.weight, torch.Tensor):
            return torch.nn.functional.embedding(ids, self.weight)
        if callable(self.weight):  # rows of a tied head's product (see `rows_of`)
            return self.weight(ids).to(self.dtype)
        return take_rows(self.weight, ids).dense().to(self.dtype)


@dataclass(frozen=True)
class Hyper:
    """A Llama-family model's sizes (the names are transformers' config keys where they have one), and
    what Gemma 3 does otherwise (the defaults are a Llama's)."""

    layers: int
    heads: int
    kv_heads: int
    dim: int
    head_dim: int
    hidden: int
    eps: float
    theta: float
    context: int
    rope_scale: float = 1.0  # the global layers' positions times this in RoPE (linear scaling: 1 / factor)
    # Llama 3's RoPE frequency factors (`rope_freqs`): pair i of each head turns at its frequency divided
    # by factors[i] (none where empty), as llama.cpp's ggml_rope_ext takes them
    rope_factors: tuple[float, ...] = ()
    window: int = 0  # the sliding layers' window: a query sees the keys of the last `window` positions
    sliding: tuple[bool, ...] = ()  # which layers slide (none where empty); they take RoPE base theta_swa
    theta_swa: float = 10000.0
    attention_scale: float | None = None  # the query-key scale (None: head_dim ** -0.5)
    embed_scale: float = 1.0  # the embeddings times this after the lookup (Gemma: sqrt(dim))
    activation: str = "silu"  # the MLP's: silu(gate) * up, or "gelu" (tanh approximation) (gate) * up
    softcap: float = 0.0  # where > 0, logits become softcap tanh(logits / softcap)

    def windows(self) -> list[int]:
        """Each layer's sliding window (0: it sees every position)."""
        return [self.window if i < len(self.sliding) and self.sliding[i] else 0 for i in range(self.layers)]


# llama.cpp's names of a layer's tensors, and transformers' names of the same
LAYER_TENSORS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                 "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                 "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


class DirectorySource:
    """A transformers Llama directory (config.json, model.safetensors, the tokenizer's files)."""

    def __init__(self, directory: str | os.PathLike) -> None:
        from safetensors.torch import load_file

        self.directory = Path(directory)
        config = json.loads((self.directory / "config.json").read_text())
        if config.get("model_type") not in {a.directory_type for a in _ARCHITECTURES.values()} - {None}:
            raise ValueError(f"the native backend runs Llama-family models; this one is "
                             f"{config.get('model_type')!r}: use --backend hf")
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(f"the native backend supports default RoPE only, not {rope.get('rope_type')!r}: "
                             "use --backend hf")
        heads = config["num_attention_heads"]
        self.hyper = Hyper(layers=config["num_hidden_layers"], heads=heads,
                           kv_heads=config.get("num_key_value_heads", heads), dim=config["hidden_size"],
                           head_dim=config.get("head_dim") or config["hidden_size"] // heads,
                           hidden=config["intermediate_size"], eps=config["rms_norm_eps"],
                           theta=rope.get("rope_theta", config.get("rope_theta", 10000.0)),
                           context=config.get("max_position_embeddings", 4096))
        self.eos_token_id = config.get("eos_token_id")
        self._tensors = load_file(self.directory / "model.safetensors")
        # strict reading (`reading`): every tensor is one the native model computes with (a rotary
        # table of the default RoPE is derived from the config, so it changes nothing)
        used = {f"model.layers.{i}.{hf}.weight" for i in range(self.hyper.layers) for hf in LAYER_TENSORS.values()}
        used |= {f"{hf}.weight" for hf in GLOBAL_TENSORS.values()}
        unused = sorted(n for n in self._tensors if n not in used and not n.endswith("rotary_emb.inv_freq"))
        if unused:
            raise NativeRefusal(f"{self.directory.name} cannot run natively: it has a tensor {unused[0]!r} that the "
                                "native backend does not compute with (--backend hf runs it)")

    def tokenizer(self):
        from ..tokenizer import Tokenizer, has_fast_files

        if has_fast_files(self.directory):
            return Tokenizer(self.directory)
        from transformers import AutoTokenizer  # a tokenizer only transformers can build

        return AutoTokenizer.from_pretrained(self.directory)

    def bias(self, name: str, layer: int) -> torch.Tensor | None:
        return None  # a Llama has none

    def weight(self, name: str, layer: int | None = None) -> Weight | None:
        """A tensor by llama.cpp's name (None where the model has none, e.g. a tied `output`)."""
        hf = (LAYER_TENSORS.get(name) if layer is not None else GLOBAL_TENSORS.get(name))
        if hf is None:
            return None
        return self._tensors.get((f"model.layers.{layer}.{hf}" if layer is not None else hf) + ".weight")

    def close(self) -> None:
        self._tensors = {}


def _un_permute(rows: int, heads: int) -> torch.Tensor:
    """The row order that undoes llama.cpp's converter's permutation of a Llama q or k projection
    (it interleaves each head's two rotary halves for its own RoPE): output row r of transformers'
    layout is row order[r] of the file's."""
    return torch.arange(rows).view(heads, rows // heads // 2, 2).transpose(1, 2).reshape(-1)


class GGUFSource:
    """A GGUF file, its tensors read over a memory map (`GGUFHeader`). Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K,
    Q5_K and Q6_K blocks become groups as they are; F32, F16 and BF16 tensors float; any other type is dequantised."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        try:
            self.header = GGUFHeader(self.path)
        except (ValueError, OSError, KeyError, IndexError) as e:
            raise ValueError(f"{str(self.path)!r} is not a GGUF file this reader can read: {e}") from None
        self.architecture = self._field("general.architecture")
        why = refusal(self.architecture, self.header.fields, self.header.tensors)
        if why:
            raise NativeRefusal(f"{self.path.name} cannot run natively: {why} (--backend llama.cpp runs it)")
        a, self.arch = self.architecture, _ARCHITECTURES[self.architecture]
        heads = self._field(f"{a}.attention.head_count")
        dim = self._field(f"{a}.embedding_length")
        # llama.cpp's reading: no type is linear, a factor (or the older scale_linear) divides the positions
        scaling = self._field(f"{a}.rope.scaling.type", "linear")
        factor = self._field(f"{a}.rope.scaling.factor", None) or self._field(f"{a}.rope.scale_linear", 0.0)
        layers = self._field(f"{a}.block_count")
        head_dim = self._field(f"{a}.attention.key_length", dim // heads)
        self.hyper = Hyper(layers=layers, heads=heads, kv_heads=self._field(f"{a}.attention.head_count_kv", heads),
                           dim=dim, head_dim=head_dim, hidden=self._field(f"{a}.feed_forward_length"),
                           eps=self._field(f"{a}.attention.layer_norm_rms_epsilon"),
                           theta=self._field(f"{a}.rope.freq_base", 10000.0),
                           context=self._field(f"{a}.context_length", 4096),
                           rope_scale=1.0 / factor if scaling == "linear" and factor else 1.0,
                           rope_factors=self._rope_factors(head_dim),
                           **self.arch.hyper(lambda key, default=...: self._field(f"{a}.{key}", default), layers,
                                             dim, heads, head_dim))
        self.eos_token_id = self._field("tokenizer.ggml.eos_token_id", None)
        self._tensors = self.header.tensors

    def _rope_factors(self, head_dim: int) -> tuple[float, ...]:
        """Llama 3.x's `rope_freqs.weight`, one factor a rotary pair (empty where the file has none)."""
        tensor = self.header.tensors.get("rope_freqs.weight")
        if tensor is None:
            return ()
        factors = np.asarray(tensor.data, dtype=np.float32).reshape(-1)
        if factors.shape[0] != head_dim // 2:
            raise NativeRefusal(f"{self.path.name} cannot run natively: its rope_freqs holds {factors.shape[0]} "
                                f"factors where its heads have {head_dim // 2} rotary pairs")
        return tuple(float(f) for f in factors)

    def _field(self, key: str, default=...):
        field = self.header.fields.get(key)
        if field is None:
            if default is ...:
                raise ValueError(f"{self.path.name} has no {key!r}, which a {self.architecture} model needs")
            return default
        return field

    def tokenizer(self):
        from ..files import gguf_tokenizer

        return gguf_tokenizer(self.path)

    def bias(self, name: str, layer: int) -> torch.Tensor | None:
        """A layer tensor's bias (Qwen2's q, k, v), float32; None where it has none."""
        tensor = self._tensors.get(f"blk.{layer}.{name}.bias")
        return None if tensor is None else as_float(_read(tensor)).float()

    def weight(self, name: str, layer: int | None = None) -> Weight | None:
        """A tensor by its name in the file (`blk.{layer}.` before a layer's), as groups or float;
        None where the file has none (a tied `output`, a norm the architecture lacks)."""
        tensor = self._tensors.get(f"blk.{layer}.{name}.weight" if layer is not None else f"{name}.weight")
        if tensor is None:
            return None
        weight = _read(tensor)
        if name in ("attn_q", "attn_k") and self.arch.permuted_qk:
            order = _un_permute(weight_rows(weight), self.hyper.heads if name == "attn_q" else self.hyper.kv_heads)
            weight = take_rows(weight, order)
        return weight

    def close(self) -> None:
        """Drop the memory map (the model holds its own copies of what it uses)."""
        self._tensors, self.header = {}, None


def weight_rows(weight: Weight) -> int:
    if isinstance(weight, Stacked):
        return sum(weight_rows(p) for p in weight.parts)
    return (weight if isinstance(weight, torch.Tensor) else weight.q).shape[0]


def _read(tensor) -> Weight:
    """One GGUF tensor as groups (`FORMATS`), or float for the rest."""
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize

    kind, data = tensor.tensor_type, np.asarray(tensor.data)
    if kind in (T.F32, T.F16):
        return torch.from_numpy(np.array(data))
    if kind == T.BF16:  # int16 bits
        return torch.from_numpy(np.array(data)).view(torch.bfloat16)
    if (fmt := FORMATS.get(T(kind).name)) is not None:
        return fmt.read(data.reshape(data.shape[0], -1, fmt.block_bytes))
    return torch.from_numpy(dequantize(data, kind))  # [N, K] float32


def _q4(blocks: np.ndarray, has_m: bool) -> Groups4:
    """Q4_1 blocks [N, K / 32, 20 bytes] (d, m float16, 16 bytes of nibbles: value i's low nibble in
    byte i, value i + 16's high) or Q4_0 ones [.., 18] (no m: w = d (q - 8), m = -8 d exact in float16)."""
    N = blocks.shape[0]
    d = torch.from_numpy(np.ascontiguousarray(blocks[..., :2]).view(np.float16)[..., 0])  # [N, K / 32]
    packed = torch.from_numpy(np.ascontiguousarray(blocks[..., -16:]))  # [N, K / 32, 16]
    q = torch.cat([packed & 15, packed >> 4], dim=-1).reshape(N, -1)
    m = d * -8 if not has_m else torch.from_numpy(np.ascontiguousarray(blocks[..., 2:4]).view(np.float16)[..., 0])
    return Groups4(q, d, m)


def _q8_0(blocks: np.ndarray) -> Groups8:
    """Q8_0 blocks [N, K / 32, 34 bytes]: d (float16), 32 int8 values; w = d q."""
    d = torch.from_numpy(np.ascontiguousarray(blocks[..., :2]).view(np.float16)[..., 0])
    q = torch.from_numpy(np.ascontiguousarray(blocks[..., 2:]).view(np.int8)).reshape(blocks.shape[0], -1)
    return Groups8(q, d.float())


def _q5_0(blocks: np.ndarray) -> Groups8:
    """Q5_0 blocks [N, K / 32, 22 bytes] as 8-bit groups: d (float16), 32 high bits (a little-endian
    uint32), 16 bytes of low nibbles (value i's in byte i % 16, low half for i < 16); w = d (q - 16),
    q - 16 in -16..15 (llama.cpp's dequantize_row_q5_0)."""
    N, B = blocks.shape[:2]
    d = torch.from_numpy(np.ascontiguousarray(blocks[..., 0:2]).view(np.float16)[..., 0].astype(np.float32))
    high = np.ascontiguousarray(blocks[..., 2:6]).view(np.uint32)  # [N, B, 1]
    bits = ((high >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int16)  # [N, B, 32]
    low = blocks[..., 6:22].astype(np.int16)
    q = np.concatenate([low & 15, low >> 4], axis=-1) | (bits << 4)
    return Groups8(torch.from_numpy((q - 16).astype(np.int8)).view(N, B * 32), d)


def _q5_1(blocks: np.ndarray) -> Groups4:
    """Q5_1 blocks [N, K / 32, 24 bytes] as 5-bit groups: d and m (float16), 32 high bits (a little-
    endian uint32), 16 bytes of low nibbles (value i's in byte i % 16, low half for i < 16); w = d q + m,
    q in 0..31 (llama.cpp's dequantize_row_q5_1; llama.cpp writes it for Q5_K where a row is not a
    multiple of 256)."""
    N, B = blocks.shape[:2]
    d, m = (torch.from_numpy(np.ascontiguousarray(blocks[..., at : at + 2]).view(np.float16)[..., 0]) for at in (0, 2))
    high = torch.from_numpy(np.ascontiguousarray(blocks[..., 4:8]))  # [N, B, 4]: value 8k + i's bit i of byte k
    bits = ((high[..., None] >> torch.arange(8, dtype=torch.uint8)) & 1).view(N, B, 32)
    low = torch.from_numpy(np.ascontiguousarray(blocks[..., 8:24]))
    q = torch.cat([low & 15, low >> 4], dim=-1) | (bits << 4)
    return Groups4(q.view(N, B * 32), d, m)


def _q6_k(blocks: np.ndarray) -> Groups6:
    """Q6_K super-blocks [N, K / 256, 210 bytes] as their groups of 16: 128 bytes of low nibbles, 64
    of high bit pairs, 16 int8 scales, d (float16); value e of a block has scale d sc[e // 16] and
    q - 32 in -32..31 (llama.cpp's dequantize_row_q6_K: per 128 values, byte l of the low nibbles
    holds values l and l + 64 (low, high nibble), byte l + 32 values l + 32 and l + 96; the high bits
    of value l + 32 j are bits 2j, 2j + 1 of byte l of the 32 high-bit bytes)."""
    N, B = blocks.shape[:2]
    low = torch.from_numpy(np.ascontiguousarray(blocks[..., :128])).view(N, B, 2, 2, 32)  # [.., half, l < 32?, l]
    high = torch.from_numpy(np.ascontiguousarray(blocks[..., 128:192])).view(N, B, 2, 1, 32)  # [.., half, 1, l]
    nibbles = torch.cat([low & 15, low >> 4], dim=-2)  # [N, B, half, j, l]: value 32 j + l of the half
    pairs = (high >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8)[:, None]) & 3  # [N, B, half, j, l]
    q = (nibbles | pairs << 4).view(torch.int8) - 32  # 0..63 less 32
    sc = torch.from_numpy(np.ascontiguousarray(blocks[..., 192:208]).view(np.int8)).reshape(N, B * 16)
    d = torch.from_numpy(np.ascontiguousarray(blocks[..., 208:210]).view(np.float16)[..., 0].astype(np.float32))
    return Groups6(q.reshape(N, B * 256), d, sc)


def _k_quant(blocks: np.ndarray, five: bool) -> GroupsK:
    """Q4_K super-blocks [N, K / 256, 144 bytes] or Q5_K ones [.., 176] as their groups of 32: d and
    dmin (float16), eight 6-bit scales and mins packed in 12 bytes, (Q5_K: 32 bytes of high bits, bit j
    of byte l the high bit of value 32 j + l), and 128 bytes of nibbles (64 values a 32-byte run: its
    low nibbles, then its high ones); w = d sc q - dmin m (llama.cpp's dequantize_row_q4_K, _q5_K)."""
    N, B = blocks.shape[:2]
    halves = lambda at: torch.from_numpy(np.ascontiguousarray(blocks[..., at : at + 2]).view(np.float16)[..., 0])  # noqa: E731
    packed = blocks[..., 4:16]  # [N, B, 12] uint8
    sc, mn = np.empty((N, B, 8), np.uint8), np.empty((N, B, 8), np.uint8)
    sc[..., :4], mn[..., :4] = packed[..., 0:4] & 63, packed[..., 4:8] & 63
    sc[..., 4:] = (packed[..., 8:12] & 15) | ((packed[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (packed[..., 8:12] >> 4) | ((packed[..., 4:8] >> 6) << 4)
    qs = torch.from_numpy(np.ascontiguousarray(blocks[..., 48 if five else 16:])).view(N, B, 4, 1, 32)
    q = torch.cat([qs & 15, qs >> 4], dim=3).reshape(N, B, 256)  # value 32 j + l at [j, l]
    if five:
        high = torch.from_numpy(np.ascontiguousarray(blocks[..., 16:48]))  # [N, B, 32]: byte l, bit j
        bits = (high[..., None, :] >> torch.arange(8, dtype=torch.uint8)[:, None]) & 1  # [N, B, 8 (j), 32 (l)]
        q |= (bits << 4).reshape(N, B, 256)
    return GroupsK(q.reshape(N, B * 256), halves(0), halves(2), torch.from_numpy(sc).view(N, B * 8),
                   torch.from_numpy(mn).view(N, B * 8))


class Format(NamedTuple):
    """A GGUF block type the native path reads as the file holds it: the bytes of a block, its reader
    ([N, K / values a block, block bytes] uint8 -> groups), and the products that run those groups in
    `decode_layers` (csrc/kernels.h's PRODUCT_KINDS: with float32 activations, then with 8-bit ones).
    Any other type is dequantised to float on reading."""

    block_bytes: int
    read: Callable[[np.ndarray], Weight]
    products: tuple[str, ...]


FORMATS = {  # by gguf's GGMLQuantizationType name
    "Q4_0": Format(18, lambda b: _q4(b, False), ("q4f", "q40q8")),
    "Q4_1": Format(20, lambda b: _q4(b, True), ("q4f", "q4q8")),
    "Q5_0": Format(22, _q5_0, ("q8", "q8q8")),
    "Q5_1": Format(24, _q5_1, ("q5q8",)),
    "Q8_0": Format(34, _q8_0, ("q8", "q8q8")),
    "Q4_K": Format(144, lambda b: _k_quant(b, five=False), ("q4kq8",)),
    "Q5_K": Format(176, lambda b: _k_quant(b, five=True), ("q5kq8",)),
    "Q6_K": Format(210, _q6_k, ("q6q8", "q6kq8")),
}


def native_reading(path: str | os.PathLike) -> tuple[str | None, str | None]:
    """(a GGUF file's general.architecture, why the native path refuses it or None where it computes
    all of it: `reading.refusal`); (None, None) where the file cannot be read (its loader says why)."""
    try:
        header = GGUFHeader(Path(path))
    except (ValueError, OSError, KeyError, IndexError):
        return None, None
    architecture = header.fields.get("general.architecture")
    return architecture, refusal(architecture, header.fields, header.tensors)


def open_source(path: str | os.PathLike) -> DirectorySource | GGUFSource:
    """The source behind a model path: a .gguf file read directly, or a transformers directory."""
    from ..files import check_model_directory, existing_model_path, is_gguf

    path = existing_model_path(path)
    if is_gguf(path):
        return GGUFSource(path)
    check_model_directory(path, path)
    return DirectorySource(path)
