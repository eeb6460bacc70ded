"""The native Llama: loading, the forward pass over the static cache, and the loader entry point."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from ..base import Vocabulary, eos_ids
from .cache import NativeCache
from .kernels import CKernels, make_kernels
from .linear import Int4Linear, Linear, Q8Linear, bf16_supported, dense
from .plan import kernel_plan


def activation_dtype() -> torch.dtype:
    """bf16 where the CPU has bf16 units and the kernel plan uses them, else float32 (emulated bf16
    would be slower; the avx2 and portable paths run float32 as an AVX2-only CPU must)."""
    _, lib = kernel_plan()
    return torch.bfloat16 if bf16_supported() and (lib is None or lib.q4_available()) else torch.float32


class NativeLlama:
    """A Llama-family causal LM behind the model protocol (batch size 1)."""

    backend = "native"
    supports_trees = True  # forward(..., parents=...) verifies a draft tree in one call

    PREFILL_CHUNK = 256

    DTYPES = ("auto", "int4", "w4a8", "bfloat16", "float32")
    QUANTISED = ("int4", "w4a8")  # 4-bit weights: float activations, or 8-bit ones (integer dot products)

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
        self.name = name or directory.name
        self.device = torch.device("cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(directory)
        self.vocab = Vocabulary.from_tokens(self.name, self.tokenizer.get_vocab())
        self.eos_token_ids = eos_ids(config.get("eos_token_id"), self.tokenizer)

        self.layers = config["num_hidden_layers"]
        self.heads = config["num_attention_heads"]
        self.kv_heads = config.get("num_key_value_heads", self.heads)
        self.dim = config["hidden_size"]
        self.head_dim = config.get("head_dim") or self.dim // self.heads
        self.eps = config["rms_norm_eps"]
        limit = config.get("max_position_embeddings", 4096)
        self.max_positions = min(limit, max_positions) if max_positions else limit
        theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))

        w = load_file(directory / "model.safetensors")
        products = [self._block_products(w, i) for i in range(self.layers)]
        quantised = self._quantised_dtype(dtype)  # 8-bit activations: float32 between the products
        self._use(torch.float32 if dtype == "float32" or quantised == "w4a8" else activation_dtype())
        if quantised == "w4a8" and not self.kernels.q4q8:  # these shapes take PyTorch's ops
            if dtype == "w4a8":
                raise ValueError(f"--dtype w4a8 needs the C kernels, which do not serve {self.name}'s shapes")
            quantised = "int4"
            self._use(activation_dtype())
        linears = self._int4(products, quantised, strict=dtype != "auto") if quantised else None
        if linears is None and dtype == "auto" and self.compute_dtype != activation_dtype():
            self._use(activation_dtype())  # not 4-bit groups: the widest fast float
        self.dtype = quantised if linears else str(self.compute_dtype).removeprefix("torch.")
        # A prefill is compute-bound (each weight serves every prompt row): oneDNN's bf16 product runs a
        # 256-row chunk ~2.8x faster than the int4 kernel, so the prompt goes through bf16 copies where the
        # path runs bf16 (w4a8 too: its float32 stream is cast for them; 512 tokens 0.48 s against 0.83 s).
        prefill_dtype = activation_dtype() if self.dtype == "w4a8" else self.compute_dtype
        self.prefill_products = [{n: Linear(m.to(prefill_dtype)) for n, m in b.items()} for b in products]
        if linears is None and self.compute_dtype == torch.float32:  # BLAS float32 rows depend on the row count
            linears = [{n: dense(m, torch.float32, self.kernels) for n, m in b.items()} for b in products]
        linears = linears or self.prefill_products
        del products
        head = w.get("lm_head.weight", w["model.embed_tokens.weight"])  # [V, D]
        # In 4-bit mode a head stored in 8-bit blocks (Q8_0) runs as such; else in the activation dtype.
        self.head = (Q8Linear.quantize(head, self.kernels, int8_activations=self.dtype == "w4a8")
                     if self.dtype in self.QUANTISED else None) or dense(
            head, self.compute_dtype, self.kernels)
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
        self.layer_pointers = self._layer_pointers()

    def _use(self, compute_dtype: torch.dtype) -> None:
        self.compute_dtype = compute_dtype
        self.kernels = make_kernels(self.heads, self.kv_heads, self.head_dim, self.dim, compute_dtype)

    @staticmethod
    def _quantised_dtype(dtype: str) -> str | None:
        """Which 4-bit precision to try for `dtype`: the one asked for, or for "auto" 8-bit activations
        where the kernel build has vector integer dot products (faster, and closer to the float32
        reference than llama.cpp: README), else int4."""
        plan, lib = kernel_plan()
        if dtype == "w4a8" and lib is None:
            raise ValueError(f"--dtype w4a8 needs the C kernels, and this kernel plan runs {plan}")
        if dtype == "auto":
            return "w4a8" if lib is not None and lib.q4q8_vector() else "int4"
        return dtype if dtype in NativeLlama.QUANTISED else None

    def _layer_pointers(self) -> torch.Tensor | None:
        """The layers' weights as kernels.c's layers_q4f takes them ([layers, 10] int64 addresses of
        tensors this model holds), where every product is 4-bit with float32 activations (q4f) or 8-bit
        ones (q4q8), all alike; else None."""
        if not isinstance(self.kernels, CKernels) or self.compute_dtype != torch.float32:
            return None
        rows = []
        for b in self.blocks:
            linears = [b[n] for n in ("qkv", "o", "gate_up", "down")]
            kind = "q4q8" if self.dtype == "w4a8" else "q4f"
            if not all(isinstance(m, Int4Linear) and m.kind == kind for m in linears):
                return None
            rows.append([b["attn_norm"].data_ptr(), b["mlp_norm"].data_ptr()]
                        + [t.data_ptr() for m in linears for t in (m.packed, m.coef)])
        return torch.tensor(rows, dtype=torch.int64)

    @staticmethod
    def _block_products(w: dict[str, torch.Tensor], i: int) -> dict[str, torch.Tensor]:
        """Layer i's four products, each projection group fused into one weight [out, in]."""
        g = lambda n: w[f"model.layers.{i}.{n}.weight"]  # noqa: E731
        return dict(qkv=torch.cat([g("self_attn.q_proj"), g("self_attn.k_proj"), g("self_attn.v_proj")]),
                    o=g("self_attn.o_proj"), gate_up=torch.cat([g("mlp.gate_proj"), g("mlp.up_proj")]),
                    down=g("mlp.down_proj"))

    def _int4(self, products: list[dict[str, torch.Tensor]], dtype: str,
              strict: bool) -> list[dict[str, Int4Linear]] | None:
        """Every block product as 4-bit groups (`dtype` int4 or w4a8), or None (an error if `strict`) if
        one is not such a grid."""
        linears = []
        for i, b in enumerate(products):
            layer = {n: Int4Linear.quantize(m, self.compute_dtype, self.kernels, int8_activations=dtype == "w4a8")
                     for n, m in b.items()}
            missing = [n for n, linear in layer.items() if linear is None]
            if missing and strict:
                raise ValueError(f"--dtype {dtype} runs a model on its own 4-bit weights, and layer {i}'s {missing[0]} "
                                 f"product of {self.name} is not 4-bit groups of {Int4Linear.GROUP} (as a GGUF "
                                 f"Q4_1 file's are): use --dtype bfloat16 or auto")
            if missing:
                return None
            linears.append(layer)
        return linears

    def new_cache(self) -> NativeCache:
        return NativeCache(self.layers, self.kv_heads, self.max_positions, self.head_dim, self.compute_dtype)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, cache: NativeCache, num_logits: int | None = None,
                parents: Sequence[int] | None = None) -> torch.Tensor:
        """tokens [1, T] -> logits [1, num_logits or T, V] float32; appends T positions.

        `parents` makes the tokens a tree (a draft tree, verified in one call): token t follows token
        parents[t] (< t), or the cache's last position where -1; each token is computed exactly as at
        the end of the chain of its ancestors (bit for bit), in cache slot length + t at position
        length + its depth. Keep a root-to-node path with `cache.keep`."""
        if tokens.dim() != 2 or tokens.shape[0] != 1:
            raise ValueError(f"the native backend runs batch size 1, got tokens of shape {tuple(tokens.shape)}")
        T = tokens.shape[1]
        if cache.length + T > self.max_positions:
            raise ValueError(f"{cache.length} cached + {T} new positions exceed the context of {self.max_positions}")
        k = min(num_logits or T, T)
        ids = tokens[0]
        prefill = cache.length == 0
        if parents is not None:
            return self.head(self.kernels.rms_norm(self._layers(ids, cache, False, self._tree(parents, T, cache)),
                                                   self.norm, self.eps)[T - k:]).float().unsqueeze(0)
        hidden = []
        for start in range(0, T, self.PREFILL_CHUNK):  # long prompts in chunks: bounded attention memory
            h = self._layers(ids[start : start + self.PREFILL_CHUNK], cache, prefill)
            if start + h.shape[0] > T - k:  # only the last k positions need logits
                hidden.append(h[max(0, T - k - start):])
        h = self.kernels.rms_norm(torch.cat(hidden), self.norm, self.eps)
        return self.head(h).float().unsqueeze(0)  # [1, k, V]

    def _tree(self, parents: Sequence[int], T: int, cache: NativeCache) -> torch.Tensor:
        """`parents` checked, as int32 [T]."""
        parents = [int(p) for p in parents]
        if len(parents) != T or any(not -1 <= p < t for t, p in enumerate(parents)):
            raise ValueError(f"a draft tree's parents must give each of its {T} tokens an earlier one or -1, "
                             f"got {parents}")
        if cache.length == 0:
            raise ValueError("a draft tree follows a prefilled prompt: the cache is empty")
        return torch.tensor(parents, dtype=torch.int32)

    def _layers(self, ids: torch.Tensor, cache: NativeCache, prefill: bool,
                parents: torch.Tensor | None = None) -> torch.Tensor:
        """ids [T] in cache slots cache.length.. (a chain, or a tree given `parents`) -> final hidden
        states [T, D]; fills the cache."""
        T, p0 = ids.shape[0], cache.length
        positions = torch.arange(p0, p0 + T)
        if parents is not None:  # a node's position: the cache's length plus its depth
            depth = []
            for p in parents.tolist():
                depth.append(0 if p < 0 else depth[p] + 1)
            positions = p0 + torch.tensor(depth)
        cos, sin = self.cos[positions], self.sin[positions]  # [T, hd]
        x = F.embedding(ids, self.embed)  # [T, D]
        if not prefill and self.layer_pointers is not None:  # the loop below in one C call
            hidden = self.blocks[0]["gate_up"].out_features // 2
            x = self.kernels.layers_q4f(x, self.layer_pointers, cache.k, cache.v, cos, sin, p0, hidden, self.eps,
                                        int8_activations=self.dtype == "w4a8", parents=parents)
            cache.length = p0 + T
            return x
        for i, b in enumerate(self.blocks):
            products = self.prefill_products[i] if prefill else b
            qkv = products["qkv"](self.kernels.rms_norm(x, b["attn_norm"], self.eps))  # [T, (H + 2 Hkv) hd]
            keys, values = cache.layer_k[i], cache.layer_v[i]  # [Hkv, P, hd]
            q = self.kernels.rope_store(qkv, cos, sin, keys, values, p0)  # [T, H, hd]; k, v cached
            if prefill:  # all queries at once (the decode loop prefills a prompt alone, plain or not)
                attn = self._attend_block(q, i, cache, p0)
            else:  # each position alone: its numerics do not depend on what shares the call
                attn = self.kernels.attend(q, keys, values, p0, parents)
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

    @property
    def kernel_plan(self) -> str:
        """Which kernels run: the path, the build's instruction set, the products, the threads."""
        products = {"int4": "4-bit", "w4a8": "4-bit x 8-bit integer"}.get(self.dtype, self.dtype)
        return f"{self.kernels.plan}; {products} products, {self.compute_dtype_name} activations, {self.n_threads} threads"

    @property
    def profile_tag(self) -> str:
        """Names the kernel build in cached profiles: `-avx2-<source and flags hash>`."""
        library = self.kernels.plan.library
        return f"-{self.kernels.plan.path}" + (f"-{Path(library).stem.rsplit('-', 1)[-1]}" if library else "")

    @property
    def compute_dtype_name(self) -> str:
        return str(self.compute_dtype).removeprefix("torch.")

    def __repr__(self) -> str:
        return f"NativeLlama({self.name}, {self.dtype}, kernels={self.kernels.plan.path})"


def load_native(path: str | os.PathLike, dtype: str = "auto", max_positions: int | None = 4096) -> NativeLlama:
    """A transformers Llama directory or a .gguf file (dequantised once and cached, as for `hf`).

    dtype "auto": 4-bit products where the weights are 4-bit groups (a Q4_1 GGUF), else bf16;
    "bfloat16" and "int4" compute in float32 on CPUs without bf16 units (emulated bf16 is slower)."""
    from ..files import model_directory

    path, directory = model_directory(path)
    return NativeLlama(directory, dtype, name=path.name, max_positions=max_positions)
