"""A native PyTorch Llama for CPU targets, in the spirit of gpt-fast: a static KV cache and as few,
as cheap operations per token as the architecture allows.

Why. Speculative decoding pays only where one forward over k tokens costs about one step, and a
CPU decode step is bound by the bytes of weights it reads. transformers spends most of a step in
Python and small ops; llama.cpp's quantised products are compute-bound (verifying k tokens costs
~k steps). This backend:

- Reads 4-bit weights where the model is 4-bit (a Q4_1 GGUF: its own values, see `Int4Linear`),
  else bf16 (float32 where the CPU has no bf16 units) reordered once for oneDNN (`Linear`); each
  projection group is one product (q|k|v, gate|up). With 4-bit products, an LM head stored in 8-bit
  blocks (Q8_0, as SmolLM2's GGUF stores it) runs as such (`Q8Linear`, half of bf16's bytes); else
  the head is bf16. A prefill is compute-bound, not bandwidth-bound,
  so the prompt runs through the bf16 products (an 800-token prompt: 0.97 s against 1.76 s).
- Keeps a static KV cache [layers, kv_heads, positions, head_dim], preallocated: `trim(n)` moves a
  length counter and rejected positions are simply overwritten by the next forward (gpt-fast).
- Runs RMSNorm, RoPE with the cache writes, the attention of new positions and the MLP's
  silu(gate) * up in small C kernels (`kernels.py`): one call each per layer where PyTorch needed
  ~8, ~16, one per position or 3 ops.
- Computes logits only where the caller needs them (`num_logits`), so a prefill does not run the
  49k-wide head over the whole prompt; long prompts prefill in chunks.

Exactness. Greedy speculative output equals plain greedy output only if a forward over k tokens
computes each position exactly as single steps do. Row results of the products do not depend on
the row count (bf16 inputs wider than 1024 are split, see `Linear`), RMSNorm, RoPE and the MLP are
row-wise, and after the prefill each position attends alone over exactly the keys it sees: so
every position's logits are bit-identical however the tokens after the prompt are batched (tested).
The prefill (a forward into an empty cache) attends with all its queries at once, which is fast
but rounds by its length: the decode loop therefore prefills the prompt alone, plain or
speculative, and both see the same cache.

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
from .kernels import make_kernels


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


def _grid_values(w: torch.Tensor, offset: torch.Tensor, scale: torch.Tensor, lowest: int, highest: int):
    """The integers q (lowest..highest) with w = scale * q + offset per group, or None unless they
    reproduce every weight to within a thousandth of its group's step. w [N, K/G, G] float32;
    offset and scale [N, K/G, 1] (a zero scale, a constant group, is taken as 1). Returns (q, scale)."""
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = ((w - offset) / scale).round_().clamp_(lowest, highest)
    return None if ((q * scale + offset - w).abs() > scale * 1e-3).any() else (q, scale)


class Int4Linear:
    """y = x W^T with W held as 4-bit integers in groups of 32 inputs, each group with a scale and a
    minimum: w = scale * q + minimum, q in 0..15 (the GGUF Q4_1 block format): a quarter of the bf16
    bytes, which is what a decode step is bound by. Two kernels:

    - `kernels.c`'s `q4_matmul` (bf16 activations on AVX512-BF16 CPUs): unpacks each weight once per
      call for up to 8 rows into bf16 and multiplies with the bf16 dot product. Over SmolLM2's 120
      block products, side by side with PyTorch's kernel: as fast for 1 row, 1.4x as fast for 4,
      1.75x for 8 and 16 (`benchmarks/results/int4_products.md`).
    - elsewhere PyTorch's CPU kernel (`_weight_int4pack_mm_for_cpu`), which unpacks the weights again
      for every 4 rows.

    `quantize` returns None unless the weight already is such a grid (every weight reproduced to
    within a thousandth of its group's step): a model dequantised from Q4_1 is run on its own
    4-bit values, never a lossy requantisation of another format. Row results do not depend on the
    row count (tested with the other batch-invariance tests).
    """

    GROUP = 32

    def __init__(self, packed: torch.Tensor, coef: torch.Tensor, out_features: int, kernels=None) -> None:
        self.packed, self.coef = packed, coef  # the kernel's layouts of q and of the groups' scales and minima
        self.out_features = out_features
        self.kernels = kernels  # with q4_matmul, else PyTorch's kernel

    @classmethod
    def quantize(cls, weight: torch.Tensor, dtype: torch.dtype, kernels=None) -> Int4Linear | None:
        """weight [out, in] (float) -> an Int4Linear holding exactly its values, or None. Runs through
        `kernels.q4_matmul` where `kernels.q4` says it serves."""
        N, K = weight.shape
        if K % cls.GROUP or N % 16:  # both kernels take outputs 16 at a time
            return None
        w = weight.float().view(N, K // cls.GROUP, cls.GROUP)
        low, high = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)  # [N, K/G, 1]
        grid = _grid_values(w, low, (high - low) / 15, 0, 15)  # Q4_1 maps a group's min to 0, its max to 15
        if grid is None:
            return None
        q, scale = grid
        if getattr(kernels, "q4", False):
            # kernels.c's layout: per 16 outputs and 4 inputs 32 bytes, byte 2o + j = q[o, j] | q[o, j + 2] << 4
            q = q.to(torch.uint8).view(N // 16, 16, K // 4, 2, 2)  # [blocks, o, chunk, high nibble?, j]
            packed = (q[..., 0, :] | q[..., 1, :] << 4).transpose(1, 2).reshape(N // 16, K // 4, 32)  # o, j -> 2o + j
            coef = torch.cat([16 * scale, low - 16 * scale], dim=-1)  # a = 16 d, b = m - 16 d: [N, K/G, 2]
            return cls(packed, coef.view(N // 16, 16, K // cls.GROUP, 2).permute(0, 2, 3, 1).contiguous(), N,
                       kernels)
        packed = torch._convert_weight_to_int4pack_for_cpu(q.view(N, K).to(torch.int32), 1)
        # PyTorch's kernel computes (q - 8) * scale + offset, with both in the activation dtype
        scales_zeros = torch.cat([scale, low + 8 * scale], dim=-1).transpose(0, 1).contiguous().to(dtype)
        return cls(packed, scales_zeros, N)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, out]
        if self.kernels is not None:
            return self.kernels.q4_matmul(x, self.packed, self.coef)
        return torch._weight_int4pack_mm_for_cpu(x.contiguous(), self.packed, self.GROUP, self.coef)


class Q8Linear:
    """y = x W^T with W held as int8 in groups of 32 inputs, each with one scale: w = scale * q (the
    GGUF Q8_0 block format, in which SmolLM2's file stores its tied embedding / LM head). Runs
    through `kernels.c` (`CKernels.q8_matmul`); float32 out. Like `Int4Linear.quantize`, `quantize`
    returns None unless the weight already is such a grid, so nothing is requantised."""

    def __init__(self, q: torch.Tensor, scales: torch.Tensor, kernels) -> None:
        self.q, self.scales, self.kernels = q, scales, kernels  # [out/16, in, 16] int8, [out/16, in/32, 16]
        self.out_features = q.shape[0] * 16

    @classmethod
    def quantize(cls, weight: torch.Tensor, kernels) -> Q8Linear | None:
        """weight [out, in] (float) -> a Q8Linear holding exactly its values, or None."""
        N, K = weight.shape
        if K % 32 or N % 16 or not hasattr(kernels, "q8_matmul"):
            return None
        w = weight.float().view(N, K // 32, 32)
        # Q8_0 maps each group's largest magnitude to +-127
        grid = _grid_values(w, torch.zeros(()), w.abs().amax(-1, keepdim=True) / 127, -127, 127)
        if grid is None:
            return None
        q, scale = grid
        q = q.to(torch.int8).view(N // 16, 16, K).transpose(1, 2).contiguous()
        return cls(q, scale.view(N // 16, 16, K // 32).transpose(1, 2).contiguous(), kernels)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, out] float32
        return self.kernels.q8_matmul(x, self.q, self.scales)


class NativeCache:
    """Preallocated keys and values; the first `length` positions are valid."""

    def __init__(self, layers: int, kv_heads: int, positions: int, head_dim: int, dtype: torch.dtype) -> None:
        # never read before written: positions past `length` are not attended to
        self.k = torch.empty(layers, kv_heads, positions, head_dim, dtype=dtype)
        self.v = torch.empty(layers, kv_heads, positions, head_dim, dtype=dtype)
        self.layer_k, self.layer_v = self.k.unbind(0), self.v.unbind(0)  # per-layer views, made once
        self.length = 0

    def __len__(self) -> int:
        return self.length

    def trim(self, n: int) -> None:
        if n < 0 or n > self.length:
            raise ValueError(f"cannot trim {n} positions from a cache holding {self.length}")
        self.length -= n


class NativeLlama:
    """A Llama-family causal LM behind the model protocol (batch size 1)."""

    PREFILL_CHUNK = 256

    DTYPES = ("auto", "int4", "bfloat16", "float32")

    def __init__(self, directory: str | os.PathLike, dtype: str = "auto", name: str | None = None,
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
        if dtype not in self.DTYPES:
            raise ValueError(f"the native backend runs {', '.join(self.DTYPES)}, not {dtype!r}")
        # activations: bf16 where the CPU has bf16 units (emulated bf16 would be slower than float32)
        self.compute_dtype = torch.float32 if dtype == "float32" or not bf16_supported() else torch.bfloat16
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

        self.kernels = make_kernels(self.heads, self.kv_heads, self.head_dim, self.dim, self.compute_dtype)
        w = load_file(directory / "model.safetensors")
        products = [self._block_products(w, i) for i in range(self.layers)]
        linears = self._int4(products, strict=dtype == "int4") if dtype in ("int4", "auto") else None
        self.dtype = "int4" if linears else str(self.compute_dtype).removeprefix("torch.")
        # A prefill is compute-bound (each weight serves every prompt row): oneDNN's bf16 product runs a
        # 256-row chunk ~2.8x faster than the int4 kernel, so the prompt goes through bf16 copies.
        self.prefill_products = [{n: Linear(m.to(self.compute_dtype)) for n, m in b.items()} for b in products]
        linears = linears or self.prefill_products
        del products
        head = w.get("lm_head.weight", w["model.embed_tokens.weight"])  # [V, D]
        # In 4-bit mode a head stored in 8-bit blocks (Q8_0) runs as such; else in the activation dtype.
        self.head = (Q8Linear.quantize(head, self.kernels) if self.dtype == "int4" else None) or Linear(
            head.to(self.compute_dtype))
        g = lambda name: w[name].to(self.compute_dtype)  # noqa: E731  (the products are built already)
        self.embed = g("model.embed_tokens.weight")  # [V, D]
        self.blocks = [dict(attn_norm=g(f"model.layers.{i}.input_layernorm.weight"),
                            mlp_norm=g(f"model.layers.{i}.post_attention_layernorm.weight"), **linears[i])
                       for i in range(self.layers)]
        self.norm = g("model.norm.weight")
        self.vocab_size = self.head.out_features
        inv_freq = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        freqs = torch.outer(torch.arange(self.max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)  # [P, hd]
        self.cos, self.sin = emb.cos().to(self.compute_dtype), emb.sin().to(self.compute_dtype)
        self.n_threads = torch.get_num_threads()

    @staticmethod
    def _block_products(w: dict[str, torch.Tensor], i: int) -> dict[str, torch.Tensor]:
        """Layer i's four products, each projection group fused into one weight [out, in]."""
        g = lambda n: w[f"model.layers.{i}.{n}.weight"]  # noqa: E731
        return dict(qkv=torch.cat([g("self_attn.q_proj"), g("self_attn.k_proj"), g("self_attn.v_proj")]),
                    o=g("self_attn.o_proj"), gate_up=torch.cat([g("mlp.gate_proj"), g("mlp.up_proj")]),
                    down=g("mlp.down_proj"))

    def _int4(self, products: list[dict[str, torch.Tensor]], strict: bool) -> list[dict[str, Int4Linear]] | None:
        """Every block product as 4-bit groups, or None (an error if `strict`) if one is not such a grid."""
        linears = []
        for i, b in enumerate(products):
            layer = {n: Int4Linear.quantize(m, self.compute_dtype, self.kernels) for n, m in b.items()}
            missing = [n for n, linear in layer.items() if linear is None]
            if missing and strict:
                raise ValueError(f"--dtype int4 runs a model on its own 4-bit weights, and layer {i}'s {missing[0]} "
                                 f"product of {self.name} is not 4-bit groups of {Int4Linear.GROUP} (as a GGUF "
                                 f"Q4_1 file's are): use --dtype bfloat16 or auto")
            if missing:
                return None
            linears.append(layer)
        return linears

    def new_cache(self) -> NativeCache:
        return NativeCache(self.layers, self.kv_heads, self.max_positions, self.head_dim, self.compute_dtype)

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
        h = self.kernels.rms_norm(torch.cat(hidden), self.norm, self.eps)
        return self.head(h).float().unsqueeze(0)  # [1, k, V]

    def _layers(self, ids: torch.Tensor, cache: NativeCache, prefill: bool) -> torch.Tensor:
        """ids [T] at positions cache.length.. -> final hidden states [T, D]; fills the cache."""
        T, p0 = ids.shape[0], cache.length
        cos, sin = self.cos[p0 : p0 + T], self.sin[p0 : p0 + T]  # [T, hd]
        x = F.embedding(ids, self.embed)  # [T, D]
        for i, b in enumerate(self.blocks):
            products = self.prefill_products[i] if prefill else b
            qkv = products["qkv"](self.kernels.rms_norm(x, b["attn_norm"], self.eps))  # [T, (H + 2 Hkv) hd]
            keys, values = cache.layer_k[i], cache.layer_v[i]  # [Hkv, P, hd]
            q = self.kernels.rope_store(qkv, cos, sin, keys, values, p0)  # [T, H, hd]; k, v cached
            if prefill:  # all queries at once (the decode loop prefills a prompt alone, plain or not)
                attn = self._attend_block(q, i, cache, p0)
            else:  # each position alone: its numerics do not depend on what shares the call
                attn = self.kernels.attend(q, keys, values, p0)
            x = x + products["o"](attn)
            gate_up = products["gate_up"](self.kernels.rms_norm(x, b["mlp_norm"], self.eps))  # [T, 2 I]
            x = x + products["down"](self.kernels.silu_mul(gate_up))
        cache.length = p0 + T
        return x

    def _attend_block(self, q: torch.Tensor, layer: int, cache: NativeCache, p0: int) -> torch.Tensor:
        """A prefill chunk's queries at once, causally: q [T, H, hd] -> [T, H hd]."""
        T = q.shape[0]
        H, Hkv, hd = self.heads, self.kv_heads, self.head_dim
        L = p0 + T
        keys, values = cache.k[layer, :, :L], cache.v[layer, :, :L]  # [Hkv, L, hd]
        G = H // Hkv
        mask = torch.ones(T, L, dtype=torch.bool).tril(p0).repeat(G, 1)  # query t sees keys <= p0 + t
        qg = q.to(keys.dtype).view(T, Hkv, G, hd).permute(1, 2, 0, 3).reshape(Hkv, G * T, hd)
        out = F.scaled_dot_product_attention(qg[None], keys[None], values[None], attn_mask=mask)  # [1, Hkv, G T, hd]
        return out.view(Hkv, G, T, hd).permute(2, 0, 1, 3).reshape(T, H * hd)

    def __repr__(self) -> str:
        return f"NativeLlama({self.name}, {self.dtype})"


def load_native(path: str | os.PathLike, dtype: str = "auto", max_positions: int | None = 4096) -> NativeLlama:
    """A transformers Llama directory or a .gguf file (dequantised once and cached, as for `hf`).

    dtype "auto": 4-bit products where the weights are 4-bit groups (a Q4_1 GGUF), else bf16;
    "bfloat16" and "int4" compute in float32 on CPUs without bf16 units (emulated bf16 is slower)."""
    from .hf import convert_gguf

    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model path {str(path)!r} does not exist (a local directory or .gguf file is needed)")
    directory = convert_gguf(path) if path.is_file() and path.suffix == ".gguf" else path
    if not (directory / "config.json").exists():
        raise ValueError(f"{str(path)!r} is neither a .gguf file nor a transformers model directory (no config.json)")
    return NativeLlama(directory, dtype, name=path.name, max_positions=max_positions)
