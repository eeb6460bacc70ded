"""A native PyTorch Llama for CPU targets, in the spirit of gpt-fast: a static KV cache and as few,
as large operations per token as the architecture allows.

Why. Speculative decoding pays only where one forward over k tokens costs about one step. On a CPU
PyTorch's bf16 matrix products (oneDNN; AMX or AVX512-BF16 units) cost nearly the same for 1 or 16
rows, but transformers spends most of a step in Python and small ops, and llama.cpp's quantised
products are compute-bound (verifying k tokens costs ~k steps). This backend keeps the flat curve:

- Weights in bf16 (float32 where the CPU has no bf16 units), each projection group fused into one
  matrix (q|k|v, gate|up) and reordered once for oneDNN ("prepacked"): `F.linear` would reorder
  the weight on every call, which measured ~2x slower for bf16 here.
- A static KV cache [layers, kv_heads, positions, head_dim], preallocated: `trim(n)` moves a
  length counter and rejected positions are simply overwritten by the next forward (gpt-fast).
- Logits only where the caller needs them (`num_logits`), so a prefill does not run the 49k-wide
  head over the whole prompt; long prompts prefill in chunks.

Exactness. Greedy speculative output equals plain greedy output only if a forward over k tokens
computes each position exactly as single steps do. Row results of the prepacked products do not
depend on the row count once inputs wider than 1024 are split (see `Linear`), RMSNorm, RoPE and
the MLP are row-wise, and after the prefill attention runs one query position at a time over
exactly the keys that position sees, the same shapes whether it came in a batch or alone: so every
position's logits are bit-identical however the tokens after the prompt are batched (tested), in
bf16 as in float32. The prefill (a forward into an empty cache) attends with all its queries at
once, which is fast but rounds by its length: the decode loop therefore prefills the prompt alone,
plain or speculative, and both see the same cache. The price is one SDPA call per token and layer
in a verification, which is most of what T(k)/T(1) grows by.

Loads the Llama family (SmolLM2, Llama 2/3 shapes; default RoPE) from a transformers directory or
a GGUF file (dequantised once, as the `hf` backend does).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from .base import Vocabulary


def bf16_supported() -> bool:
    """Whether oneDNN runs bf16 products natively here (AVX512-BF16 or AMX)."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


class Linear:
    """y = x W^T with W reordered once for oneDNN (bf16), or a plain `F.linear` (float32).

    Batch invariance: oneDNN's bf16 product sums over the input dimension K in an order that
    depends on the row count once K exceeds 1024 (measured: SmolLM2's down projection, K = 1536,
    gave row results that differ between 1 and 2..16 rows; K <= 1024 never did). So a wider input
    is split into equal chunks of at most 1024 and the partial products added, which makes every
    row's result independent of how many rows share the call.
    """

    MAX_K = 1024

    def __init__(self, weight: torch.Tensor) -> None:  # weight [out, in]
        self.out_features, in_features = weight.shape
        self.packed = weight.dtype == torch.bfloat16 and bf16_supported()
        parts = -(-in_features // self.MAX_K) if self.packed else 1
        self.splits = [in_features // parts + (i < in_features % parts) for i in range(parts)]
        chunks = weight.split(self.splits, dim=1)
        self.weights = [torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), 1) if self.packed else w.contiguous()
                        for w in chunks]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, out]
        if not self.packed:
            return F.linear(x, self.weights[0])
        xs = x.split(self.splits, dim=-1) if len(self.splits) > 1 else (x,)
        y = None
        for xi, w in zip(xs, self.weights):
            yi = torch.ops.mkldnn._linear_pointwise(xi.contiguous(), w, None, "none", [], "")
            y = yi if y is None else y + yi
        return y


class NativeCache:
    """Preallocated keys and values; the first `length` positions are valid."""

    def __init__(self, layers: int, kv_heads: int, positions: int, head_dim: int, dtype: torch.dtype) -> None:
        # never read before written: positions past `length` are not attended to
        self.k = torch.empty(layers, kv_heads, positions, head_dim, dtype=dtype)
        self.v = torch.empty(layers, kv_heads, positions, head_dim, dtype=dtype)
        self.length = 0

    def __len__(self) -> int:
        return self.length

    def trim(self, n: int) -> None:
        if n < 0 or n > self.length:
            raise ValueError(f"cannot trim {n} positions from a cache holding {self.length}")
        self.length -= n


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm, computed in float32 as transformers does: x [T, D] -> [T, D]."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class NativeLlama:
    """A Llama-family causal LM behind the model protocol (batch size 1)."""

    PREFILL_CHUNK = 256

    def __init__(self, directory: str | os.PathLike, dtype: str = "bfloat16", name: str | None = None,
                 max_positions: int | None = 4096) -> None:
        from safetensors.torch import load_file
        from transformers import AutoTokenizer

        directory = Path(directory)
        config = json.loads((directory / "config.json").read_text())
        if config.get("model_type") != "llama":
            raise ValueError(f"the native backend runs Llama-family models; this one is "
                             f"{config.get('model_type')!r}: use --backend hf")
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(f"the native backend supports default RoPE only, not {rope.get('rope_type')!r}: "
                             "use --backend hf")
        if dtype not in ("bfloat16", "float32"):
            raise ValueError(f"the native backend runs bfloat16 or float32, not {dtype!r}")
        self.dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        self.name = name or directory.name
        self.device = torch.device("cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(directory)
        self.vocab = Vocabulary.from_tokens(self.name, self.tokenizer.get_vocab())
        eos = config.get("eos_token_id")
        eos = set([eos] if isinstance(eos, int) else (eos or []))
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(eos)

        self.layers = config["num_hidden_layers"]
        self.heads = config["num_attention_heads"]
        self.kv_heads = config.get("num_key_value_heads", self.heads)
        self.dim = config["hidden_size"]
        self.head_dim = config.get("head_dim") or self.dim // self.heads
        self.eps = config["rms_norm_eps"]
        limit = config.get("max_position_embeddings", 4096)
        self.max_positions = min(limit, max_positions) if max_positions else limit
        theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))

        w = {k: v.to(self.dtype) for k, v in load_file(directory / "model.safetensors").items()}
        p = "model.layers.{}."
        self.embed = w["model.embed_tokens.weight"]  # [V, D]
        self.blocks = []
        for i in range(self.layers):
            g = lambda n: w[p.format(i) + n]  # noqa: E731
            self.blocks.append(dict(
                attn_norm=g("input_layernorm.weight"), mlp_norm=g("post_attention_layernorm.weight"),
                qkv=Linear(torch.cat([g("self_attn.q_proj.weight"), g("self_attn.k_proj.weight"),
                                      g("self_attn.v_proj.weight")])),
                o=Linear(g("self_attn.o_proj.weight")),
                gate_up=Linear(torch.cat([g("mlp.gate_proj.weight"), g("mlp.up_proj.weight")])),
                down=Linear(g("mlp.down_proj.weight")),
            ))
        self.norm = w["model.norm.weight"]
        self.head = Linear(w.get("lm_head.weight", self.embed))
        self.vocab_size = self.head.out_features
        inv_freq = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        freqs = torch.outer(torch.arange(self.max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)  # [P, hd]
        self.cos, self.sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)
        self.n_threads = torch.get_num_threads()

    def new_cache(self) -> NativeCache:
        return NativeCache(self.layers, self.kv_heads, self.max_positions, self.head_dim, self.dtype)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, cache: NativeCache, num_logits: int | None = None) -> torch.Tensor:
        """tokens [1, T] -> logits [1, num_logits or T, V] float32; appends T positions."""
        if tokens.dim() != 2 or tokens.shape[0] != 1:
            raise ValueError(f"the native backend runs batch size 1, got tokens of shape {tuple(tokens.shape)}")
        T = tokens.shape[1]
        if cache.length + T > self.max_positions:
            raise ValueError(f"{cache.length} cached + {T} new positions exceed the context of {self.max_positions}")
        k = min(num_logits or T, T)
        ids = tokens[0]
        prefill = cache.length == 0
        hidden = []
        for start in range(0, T, self.PREFILL_CHUNK):  # long prompts in chunks: bounded attention memory
            h = self._layers(ids[start : start + self.PREFILL_CHUNK], cache, prefill)
            if start + h.shape[0] > T - k:  # only the last k positions need logits
                hidden.append(h[max(0, T - k - start):])
        h = _rms_norm(torch.cat(hidden), self.norm, self.eps)
        return self.head(h).float().unsqueeze(0)  # [1, k, V]

    def _layers(self, ids: torch.Tensor, cache: NativeCache, prefill: bool) -> torch.Tensor:
        """ids [T] at positions cache.length.. -> final hidden states [T, D]; fills the cache."""
        T, p0 = ids.shape[0], cache.length
        H, Hkv, hd = self.heads, self.kv_heads, self.head_dim
        cos, sin = self.cos[p0 : p0 + T].unsqueeze(1), self.sin[p0 : p0 + T].unsqueeze(1)  # [T, 1, hd]
        x = F.embedding(ids, self.embed)  # [T, D]
        for i, b in enumerate(self.blocks):
            qkv = b["qkv"](_rms_norm(x, b["attn_norm"], self.eps))  # [T, (H + 2 Hkv) hd]
            q, key, value = qkv.split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
            q = q.view(T, H, hd)
            key = key.view(T, Hkv, hd)
            q = q * cos + _rotate_half(q) * sin
            key = key * cos + _rotate_half(key) * sin
            cache.k[i, :, p0 : p0 + T] = key.transpose(0, 1)  # [Hkv, T, hd]
            cache.v[i, :, p0 : p0 + T] = value.view(T, Hkv, hd).transpose(0, 1)
            if prefill:  # all queries at once (the decode loop prefills a prompt alone, plain or not)
                attn = self._attend_block(q, i, cache, p0)
            else:  # one query at a time: each position's numerics do not depend on what shares the call
                attn = torch.cat([self._attend(q[t], i, cache, p0 + t + 1) for t in range(T)])
            x = x + b["o"](attn)
            gate, up = b["gate_up"](_rms_norm(x, b["mlp_norm"], self.eps)).chunk(2, dim=-1)
            x = x + b["down"](F.silu(gate) * up)
        cache.length = p0 + T
        return x

    def _attend(self, q: torch.Tensor, layer: int, cache: NativeCache, length: int) -> torch.Tensor:
        """One query position over the `length` keys it sees: q [H, hd] -> [1, H hd]. The shapes
        depend only on the position, never on how many tokens share the forward."""
        H, Hkv, hd = self.heads, self.kv_heads, self.head_dim
        keys, values = cache.k[layer, None, :, :length], cache.v[layer, None, :, :length]  # [1, Hkv, L, hd]
        # 4-d inputs take PyTorch's fused CPU kernel (the 3-d form fell back to the unfused math path, 2x slower)
        out = F.scaled_dot_product_attention(q.view(1, Hkv, H // Hkv, hd), keys, values)  # [1, Hkv, G, hd]
        return out.reshape(1, H * hd)

    def _attend_block(self, q: torch.Tensor, layer: int, cache: NativeCache, p0: int) -> torch.Tensor:
        """A prefill chunk's queries at once, causally: q [T, H, hd] -> [T, H hd]."""
        T = q.shape[0]
        H, Hkv, hd = self.heads, self.kv_heads, self.head_dim
        L = p0 + T
        keys, values = cache.k[layer, :, :L], cache.v[layer, :, :L]  # [Hkv, L, hd]
        G = H // Hkv
        mask = torch.ones(T, L, dtype=torch.bool).tril(p0).repeat(G, 1)  # query t sees keys <= p0 + t
        qg = q.view(T, Hkv, G, hd).permute(1, 2, 0, 3).reshape(Hkv, G * T, hd)
        out = F.scaled_dot_product_attention(qg[None], keys[None], values[None], attn_mask=mask)  # [1, Hkv, G T, hd]
        return out.view(Hkv, G, T, hd).permute(2, 0, 1, 3).reshape(T, H * hd)

    def __repr__(self) -> str:
        return f"NativeLlama({self.name}, {self.dtype})"


def load_native(path: str | os.PathLike, dtype: str = "bfloat16", max_positions: int | None = 4096) -> NativeLlama:
    """A transformers Llama directory or a .gguf file (dequantised once and cached, as for `hf`)."""
    from .hf import convert_gguf

    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model path {str(path)!r} does not exist (a local directory or .gguf file is needed)")
    directory = convert_gguf(path) if path.is_file() and path.suffix == ".gguf" else path
    if not (directory / "config.json").exists():
        raise ValueError(f"{str(path)!r} is neither a .gguf file nor a transformers model directory (no config.json)")
    if dtype == "bfloat16" and not bf16_supported():
        dtype = "float32"  # no bf16 units: bf16 would be emulated, slower than float32
    return NativeLlama(directory, dtype, name=path.name, max_positions=max_positions)
