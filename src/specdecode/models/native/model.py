"""The native Llama: loading, the forward pass over the static cache, and the loader entry point."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F

from ..base import ForwardCall, Vocabulary, eos_ids
from .cache import NativeCache
from . import threads
from .kernels import CKernels, DecodeModel, Segment, make_kernels
from .linear import F32Linear, Int4Linear, Linear, Q8Linear, StackedLinear, bf16_supported, dense
from .plan import cpu_flags, kernel_plan
from .source import (DirectorySource, Embedding, GGUFSource, Groups4, Groups6, Groups8, GroupsK, Stacked, Weight,
                     as_float, concat, open_source)


def activation_dtype() -> torch.dtype:
    """bf16 where the CPU has bf16 units and the kernel plan uses them, else float32 (emulated bf16
    would be slower; the avx2 and portable paths run float32 as an AVX2-only CPU must)."""
    _, lib = kernel_plan()
    return torch.bfloat16 if bf16_supported() and (lib is None or lib.q4_available()) else torch.float32


PRODUCT_NAMES = ("qkv", "o", "gate_up", "down")  # a block's products, in decode_layers' order


class _Segment(NamedTuple):
    """One request's rows in a forward: `rows` new positions in `cache` (from its length on), a
    chain, or a draft tree given `parents` (int32)."""

    cache: NativeCache
    rows: int
    parents: torch.Tensor | None = None


class NativeLlama:
    """A Llama-family causal LM behind the model protocol (batch size 1 a request; several requests'
    decode calls in one ragged forward with `forward_batch`)."""

    backend = "native"
    supports_trees = True  # forward(..., parents=...) verifies a draft tree in one call (models.base.Capabilities)
    sized_caches = True  # new_cache(positions=n)

    PREFILL_CHUNK = 256

    DTYPES = ("auto", "int4", "w4a8", "bfloat16", "float32")
    QUANTISED = ("int4", "w4a8")  # 4-bit weights: float activations, or 8-bit ones (integer dot products)

    def __init__(self, source: str | os.PathLike | DirectorySource | GGUFSource, dtype: str = "auto",
                 name: str | None = None, max_positions: int | None = 4096, n_threads: int | None = None) -> None:
        """`source`: a .gguf file (read directly) or a transformers directory, or a source opened on one
        (`source.open_source`). `n_threads`: the kernels' threads (default: PyTorch's count, as it
        was before any native model lowered it; see `threads`)."""
        if not isinstance(source, (DirectorySource, GGUFSource)):
            source = open_source(source)
        if dtype not in self.DTYPES:
            raise ValueError(f"the native backend runs {', '.join(self.DTYPES)}, not {dtype!r}")
        where = getattr(source, "path", None) or source.directory
        self.name = name or where.name
        self.n_threads = threads.cores(n_threads)
        self.device = torch.device("cpu")
        self.tokenizer = source.tokenizer()
        self.vocab = Vocabulary.from_tokens(self.name, self.tokenizer.get_vocab())
        self.eos_token_ids = eos_ids(source.eos_token_id, self.tokenizer)

        hyper = source.hyper
        self.layers, self.heads, self.kv_heads = hyper.layers, hyper.heads, hyper.kv_heads
        self.dim, self.head_dim, self.eps = hyper.dim, hyper.head_dim, hyper.eps
        self.max_positions = min(hyper.context, max_positions) if max_positions else hyper.context
        # Gemma 3's: sliding-window layers (the whole cache is kept, the window is a mask by position,
        # so a trim stays a trim), the query-key scale, the embeddings' scale, gelu, a logit softcap
        self.windows = hyper.windows()
        self.attention_scale = hyper.attention_scale or self.head_dim ** -0.5
        self.embed_scale, self.gelu, self.softcap = hyper.embed_scale, hyper.activation == "gelu", hyper.softcap

        # the layers' weights are unpacked and laid out for the kernels on every core: numpy's and
        # PyTorch's array operations, which are most of a load's time, let go of the GIL
        with ThreadPoolExecutor(self.n_threads) as pool:
            products = list(pool.map(lambda i: self._block_products(source, i), range(self.layers)))
            quantised = self._quantised_dtype(dtype)  # 8-bit activations: float32 between the products
            self._use(torch.float32 if dtype == "float32" or quantised == "w4a8" else activation_dtype())
            if quantised == "w4a8" and not self.kernels.q4q8:  # these shapes take PyTorch's ops
                if dtype == "w4a8":
                    raise ValueError(f"--dtype w4a8 needs the C kernels, which do not serve {self.name}'s shapes")
                quantised = "int4"
                self._use(activation_dtype())
            linears = self._grouped(products, quantised, pool, strict=dtype != "auto") if quantised else None
        if linears is None and dtype == "auto" and self.compute_dtype != activation_dtype():
            self._use(activation_dtype())  # not 4-bit groups: the widest fast float
        self.dtype = quantised if linears else str(self.compute_dtype).removeprefix("torch.")
        if linears is None:  # BLAS float32 rows depend on the row count: `dense` keeps them row-invariant
            linears = [{n: dense(as_float(m), self.compute_dtype, self.kernels) for n, m in b.items()}
                       for b in products]
        embed = source.weight("token_embd")
        head = source.weight("output")
        head = embed if head is None else head  # tied
        # In 4-bit mode a head stored in 8-bit blocks (Q8_0, as SmolLM2's GGUF stores it) runs as such; else
        # in the activation dtype.
        self.head = (self._group_product(head, "w4a8" if self.dtype == "w4a8" else "int4", head=True)
                     if self.dtype in self.QUANTISED else None) or dense(as_float(head), self.compute_dtype,
                                                                          self.kernels)
        tied = head is embed
        del head
        # A tied table held once: an 8-bit head's rows serve the lookups
        self.embedding = Embedding(self.head.rows if tied and isinstance(self.head, Q8Linear) else embed,
                                   self.compute_dtype)
        del embed
        def vector(name: str, layer: int | None = None) -> torch.Tensor | None:
            weight = source.weight(name, layer)
            return None if weight is None else as_float(weight).to(self.compute_dtype)

        # Qwen2's q|k|v bias, Qwen3's and Gemma 3's norms of each head's q and k, Gemma 3's norms of the
        # attention's and the MLP's outputs (each None where the architecture has none). Gemma's RMSNorms
        # scale by 1 + w: llama.cpp's converter stored 1 + w, used as it is.
        biases = [[source.bias(n, i) for n in ("attn_q", "attn_k", "attn_v")] for i in range(self.layers)]
        self.blocks = [dict(attn_norm=vector("attn_norm", i), mlp_norm=vector("ffn_norm", i),
                            qkv_bias=None if b[0] is None else torch.cat(b).to(self.compute_dtype),
                            q_norm=vector("attn_q_norm", i), k_norm=vector("attn_k_norm", i),
                            post_attn_norm=vector("post_attention_norm", i), post_mlp_norm=vector("post_ffw_norm", i),
                            **linears[i])
                       for i, b in enumerate(biases)]
        self.norm = vector("output_norm")
        self.vocab_size = self.head.out_features
        self.cos, self.sin = self._rope_table(hyper.theta, hyper.rope_scale, hyper.rope_factors)
        # the sliding layers' own RoPE base (Gemma 3), unscaled
        self.cos_swa, self.sin_swa = self._rope_table(hyper.theta_swa) if any(self.windows) else (None, None)
        self.c_layers = self._c_layers()
        # Where the 4-bit x 8-bit products have vector integer dot products, a prompt's rows go through
        # the decode path as well (each row alone), which those dot products make no slower than the
        # bf16 copies. Rows computed alone do not depend on what shares the call, so a batch may
        # prefill prompts beside other requests' decode rows, in pieces of any size. Not with AMX
        # tiles, whose bf16 products serve a prompt faster, nor where the dot products are plain C.
        self.row_invariant_prompts = (self.c_layers is not None and self.dtype == "w4a8"
                                      and getattr(self.kernels, "q4q8_vector", False) and "amx_tile" not in cpu_flags())
        # A prefill is compute-bound (each weight serves every prompt row), which oneDNN's bf16 product
        # serves better than the int4 kernels, so otherwise the prompt goes through bf16 copies where the
        # path runs bf16 (w4a8 too: its float32 stream is cast for them). Kept only where used: they cost
        # memory the size of the model in bf16.
        if self.row_invariant_prompts:
            self.prefill_products = None
        elif self.dtype in self.QUANTISED:
            prefill_dtype = activation_dtype() if self.dtype == "w4a8" else self.compute_dtype
            self.prefill_products = [{n: Linear(as_float(m).to(prefill_dtype)) for n, m in b.items()}
                                     for b in products]
        else:
            self.prefill_products = linears
        del products
        source.close()
        release_freed_memory()
        # Where the C kernels run every decode layer and the head, PyTorch keeps to one thread (module
        # `threads`: its idle workers would spin on the kernels' cores); a forward through PyTorch's
        # products borrows them back.
        self.owns_cores = self.c_layers is not None and not isinstance(self.head, Linear)
        if self.owns_cores:
            threads.hand_to_kernels()

    def _use(self, compute_dtype: torch.dtype) -> None:
        self.compute_dtype = compute_dtype
        self.kernels = make_kernels(self.heads, self.kv_heads, self.head_dim, self.dim, compute_dtype, self.n_threads,
                                    self.attention_scale)

    def _rope_table(self, theta: float, scale: float = 1.0,
                    factors: Sequence[float] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's cos and sin [P, hd] of every position (times `scale`: linear scaling) with base theta,
        pair i's frequency divided by factors[i] where given (Llama 3's rope_freqs, as ggml_rope_ext
        divides its theta). Every path reads these tables (the C decode layers, the per-operation
        loop, prefill, batches and trees), so each computes the same rotation."""
        inv_freq = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        if factors:
            inv_freq = inv_freq / torch.tensor(factors, dtype=torch.float32)
        freqs = torch.outer(torch.arange(self.max_positions, dtype=torch.float32) * scale, inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)  # [P, hd]
        return emb.cos().to(self.compute_dtype), emb.sin().to(self.compute_dtype)

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

    def _c_layers(self) -> DecodeModel | None:
        """The layers as the C kernels' decode_layers takes them (`CKernels.decode_model`: the
        addresses of tensors this model holds, by the library's layer slots, and its product ids),
        where every product is one the C layers run with float32 activations; else None."""
        if not isinstance(self.kernels, CKernels) or self.compute_dtype != torch.float32:
            return None
        tensors = self.c_tensors()
        if tensors is None:
            return None
        slots, kinds = tensors
        pointers = [[0 if t is None else t.data_ptr() for t in layer] for layer in slots]
        windows = torch.tensor(self.windows, dtype=torch.int32) if any(self.windows) else None
        return self.kernels.decode_model(torch.tensor(pointers, dtype=torch.int64),
                                         torch.tensor(kinds, dtype=torch.int32).view(-1, 4), windows, self.dim,
                                         self.blocks[0]["gate_up"].out_features // 2, self.eps, self.gelu)

    def c_tensors(self) -> tuple[list[list[torch.Tensor | None]], list[int]] | None:
        """Each layer's tensors in the C decode layers' slots (`kernels.slots`; None where the
        architecture has none) and the product ids of its q|k|v, o, gate|up and down, one list; None
        where a product is not one the C layers run."""
        products, slots, kinds = self.kernels.products, [], []
        for b in self.blocks:
            slot = {n: b[n] for n in ("attn_norm", "mlp_norm", "qkv_bias", "q_norm", "k_norm", "post_attn_norm",
                                      "post_mlp_norm")}
            for n in PRODUCT_NAMES:
                m = b[n]
                if isinstance(m, Int4Linear) and m.kind in products:
                    slot[n], slot[n + "_coef"] = m.packed, m.coef
                elif isinstance(m, Q8Linear):
                    slot[n], slot[n + "_coef"] = m.q, m.scales
                elif isinstance(m, (F32Linear, StackedLinear)):
                    slot[n], slot[n + "_coef"] = (m.w if isinstance(m, F32Linear) else m.descriptor), None
                else:
                    return None
                kinds.append(products["f32" if isinstance(m, F32Linear) else m.kind])
            slots.append([slot[n] for n in self.kernels.slots])
        return slots, kinds

    @staticmethod
    def _block_products(source, i: int) -> dict[str, Weight]:
        """Layer i's four products, each projection group fused into one weight [out, in]."""
        w = lambda n: source.weight(n, i)  # noqa: E731
        return dict(qkv=concat([w("attn_q"), w("attn_k"), w("attn_v")]), o=w("attn_output"),
                    gate_up=concat([w("ffn_gate"), w("ffn_up")]), down=w("ffn_down"))

    def _group_product(self, weight: Weight, dtype: str, head: bool = False) -> Int4Linear | Q8Linear | None:
        """A product on the weight's own groups (`dtype` int4 or w4a8: float or 8-bit activations), or
        None: the file's 4-bit groups (or a float weight that is such a grid, as a dequantised Q4_1
        file's); 8-bit groups (Q8_0) for the head, or for a block product with 8-bit activations (a
        float head that is an 8-bit grid too)."""
        int8 = dtype == "w4a8"
        if isinstance(weight, Stacked):  # each part on its own groups, or the whole as float
            parts = [self._group_product(p, dtype) for p in weight.parts]
            products = self.kernels.products
            return (StackedLinear(parts, products) if int8 and all(p is not None and p.kind in products for p in parts)
                    else None)
        if isinstance(weight, (Groups8, Groups6)):
            return Q8Linear.from_groups(weight, self.kernels, int8_activations=int8) if head or int8 else None
        if isinstance(weight, Groups4):
            return Int4Linear.from_groups(weight, self.compute_dtype, self.kernels, int8_activations=int8)
        if isinstance(weight, GroupsK):  # K-quants: integer products with 8-bit activations only
            return Int4Linear.from_k_quant(weight, self.kernels) if int8 and self.compute_dtype == torch.float32 else None
        if head:
            return Q8Linear.quantize(weight, self.kernels, int8_activations=int8)
        return Int4Linear.quantize(weight, self.compute_dtype, self.kernels, int8_activations=int8)

    def _grouped(self, products: list[dict[str, Weight]], dtype: str, pool: ThreadPoolExecutor,
                 strict: bool) -> list[dict] | None:
        """Every block product on its own groups (`dtype` int4 or w4a8), laid out on `pool`, where the
        kernels take them; a product they do not (a type the source dequantised, K-quants with float
        activations) runs in float in the compute dtype. None where no product has groups (the model
        is a float one), an error then if `strict`."""
        linears = list(pool.map(lambda b: {n: self._group_product(m, dtype) for n, m in b.items()}, products))
        if all(linear is None for layer in linears for linear in layer.values()):
            if strict:
                raise ValueError(f"--dtype {dtype} runs a model on its own quantised weights, and {self.name} has "
                                 f"no products in 4-bit groups of {Int4Linear.GROUP} (a GGUF Q4_0, Q4_1 or, with "
                                 f"w4a8, Q4_K or Q8_0 file's): use --dtype auto")
            return None
        for layer, b in zip(linears, products):
            for n, linear in layer.items():
                if linear is None:
                    layer[n] = dense(as_float(b[n]), self.compute_dtype, self.kernels)
        return linears

    def new_cache(self, positions: int | None = None) -> NativeCache:
        """A cache for `positions` positions (None: the whole context, max_positions): a server sizes
        each request's to its prompt and max_tokens (SmolLM2 in float32: ~46 KB a position)."""
        positions = self.max_positions if positions is None else int(positions)
        if not 1 <= positions <= self.max_positions:
            raise ValueError(f"a cache holds 1 to {self.max_positions} positions (the context), not {positions}")
        return NativeCache(self.layers, self.kv_heads, positions, self.head_dim, self.compute_dtype)

    def _room(self, cache: NativeCache, T: int, call: str = "") -> None:
        """Refuse `T` new positions that do not fit `cache` (its own capacity, at most the context)."""
        if cache.length + T > cache.positions:
            room = (f"the context of {self.max_positions}" if cache.positions == self.max_positions
                    else f"the cache's {cache.positions} positions")
            raise ValueError(f"{call}{cache.length} cached + {T} new positions exceed {room}")

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, cache: NativeCache, num_logits: int | None = None,
                parents: Sequence[int] | None = None, prefill: bool | None = None) -> torch.Tensor:
        """tokens [1, T] -> logits [1, num_logits or T, V] float32; appends T positions.

        `parents` makes the tokens a tree (a draft tree, verified in one call): token t follows token
        parents[t] (< t), or the cache's last position where -1; each token is computed exactly as at
        the end of the chain of its ancestors (bit for bit), in cache slot length + t at position
        length + its depth. Keep a root-to-node path with `cache.keep`.

        `prefill`: compute the tokens as a prompt's (the prefill products, all of a chunk's queries at
        once, in chunks of PREFILL_CHUNK) or as decode steps (each row alone, whatever shares the
        call); None: as a prompt where the cache is empty, unless `row_invariant_prompts`. A prompt
        fed in pieces cut at multiples of PREFILL_CHUNK with prefill=True (between other requests'
        steps) leaves the cache and the last logits bit-identical to one call over the whole prompt."""
        if tokens.dim() != 2 or tokens.shape[0] != 1:
            raise ValueError(f"the native backend runs batch size 1, got tokens of shape {tuple(tokens.shape)}")
        T = tokens.shape[1]
        self._room(cache, T)
        k = min(num_logits or T, T)
        ids = tokens[0]
        if parents is not None:
            if prefill:
                raise ValueError("a draft tree is verified with the decode numerics: prefill=True takes a chain")
            tree = self._tree(parents, T, cache)
            return self._logits(self._layers(ids, [_Segment(cache, T, tree)])[T - k:])
        prefill = (cache.length == 0 and not self.row_invariant_prompts) if prefill is None else bool(prefill)
        hidden = []
        for start in range(0, T, self.PREFILL_CHUNK):  # long prompts in chunks: bounded attention memory
            chunk = ids[start : start + self.PREFILL_CHUNK]
            h = self._layers(chunk, [_Segment(cache, chunk.shape[0])], prefill)
            if start + h.shape[0] > T - k:  # only the last k positions need logits
                hidden.append(h[max(0, T - k - start):])
        return self._logits(hidden[0] if len(hidden) == 1 else torch.cat(hidden))

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final hidden states [k, D] -> logits [1, k, V] float32 (softcapped where the model says)."""
        logits = self.head(self.kernels.rms_norm(h, self.norm, self.eps)).float()
        if self.softcap > 0:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits.unsqueeze(0)

    @torch.inference_mode()
    def forward_batch(self, calls: Sequence[ForwardCall]) -> list[torch.Tensor]:
        """Several requests' decode calls in one ragged forward: each call's logits [1, k, V] (k its
        num_logits, at most its T) and its cache filled, bit-identical to `forward` of that call alone.

        The rows of every call go through the products together (the weights read once for all of
        them); RoPE, the cache writes and the attention run per call over its own cache, at its own
        positions (its cache's length on, or a draft tree's depths); only each call's last k rows
        reach the final norm and the LM head. Each call needs its own cache. With
        `row_invariant_prompts` a call may be (a piece of) a prompt, from an empty cache on; else a
        prefill goes alone (`forward`, or pieces of it with prefill=True). One call is exactly
        `forward`, a prefill included."""
        calls = list(calls)
        if not calls:
            return []
        if len(calls) == 1:
            c = calls[0]
            return [self.forward(c.tokens, c.cache, num_logits=c.num_logits, parents=c.parents)]
        segments, ks, seen = [], [], {}
        for i, c in enumerate(calls):
            tokens, cache = c.tokens, c.cache
            if not isinstance(cache, NativeCache):
                raise ValueError(f"forward_batch: call {i}'s cache is a {type(cache).__name__}, not this "
                                 f"model's NativeCache")
            if tokens.dim() != 2 or tokens.shape[0] != 1 or tokens.shape[1] == 0:
                raise ValueError(f"forward_batch: call {i}'s tokens must be [1, T] with T >= 1, got "
                                 f"{tuple(tokens.shape)}")
            if id(cache) in seen:
                raise ValueError(f"forward_batch: calls {seen[id(cache)]} and {i} share one cache: each request "
                                 f"needs its own")
            seen[id(cache)] = i
            if cache.length == 0 and not self.row_invariant_prompts:
                raise ValueError(f"forward_batch: call {i}'s cache is empty: a batch runs decode calls; prefill "
                                 f"its prompt alone first (forward)")
            T = tokens.shape[1]
            self._room(cache, T, f"forward_batch: call {i}: ")
            try:
                tree = None if c.parents is None else self._tree(c.parents, T, cache)
            except ValueError as e:
                raise ValueError(f"forward_batch: call {i}: {e}") from None
            segments.append(_Segment(cache, T, tree))
            ks.append(min(c.num_logits or T, T))
        x = self._layers(torch.cat([c.tokens[0] for c in calls]), segments)
        rows, start = [], 0
        for s, k in zip(segments, ks):
            rows.append(torch.arange(start + s.rows - k, start + s.rows))
            start += s.rows
        logits = self._logits(x.index_select(0, torch.cat(rows)))[0]  # the rows that need logits, only
        return [part.unsqueeze(0) for part in logits.split(ks)]

    def _tree(self, parents: Sequence[int], T: int, cache: NativeCache) -> torch.Tensor:
        """`parents` checked, as int32 [T]."""
        parents = [int(p) for p in parents]
        if len(parents) != T or any(not -1 <= p < t for t, p in enumerate(parents)):
            raise ValueError(f"a draft tree's parents must give each of its {T} tokens an earlier one or -1, "
                             f"got {parents}")
        if cache.length == 0:
            raise ValueError("a draft tree follows a prefilled prompt: the cache is empty")
        return torch.tensor(parents, dtype=torch.int32)

    @staticmethod
    def _positions(segment: _Segment) -> torch.Tensor:
        """A segment's rows' positions: its cache's length on, or for a tree that plus each node's depth."""
        p0 = segment.cache.length
        if segment.parents is None:
            return torch.arange(p0, p0 + segment.rows)
        depth = []
        for p in segment.parents.tolist():
            depth.append(0 if p < 0 else depth[p] + 1)
        return p0 + torch.tensor(depth)

    def _layers(self, ids: torch.Tensor | None, segments: Sequence[_Segment], prefill: bool = False,
                inputs: torch.Tensor | None = None) -> torch.Tensor:
        """ids [T], the rows of `segments` in turn (one request's each, with its own cache: a chain, or
        a tree given its parents, in cache slots cache.length..) -> final hidden states [T, D]; fills
        the caches (and the features of those that `keep_features`: the residual stream after the
        layers they name, and the final-norm outputs). The products run once
        over all T rows; RoPE with the cache writes and the attention per segment over its own cache.
        `inputs` [T, D]: the first layer's inputs in place of the tokens' embeddings (a feature draft's)."""
        one = len(segments) == 1
        positions = self._positions(segments[0]) if one else torch.cat([self._positions(s) for s in segments])
        rope = (self.cos[positions], self.sin[positions],  # [T, hd]: the global layers', then the sliding ones'
                *((None, None) if self.cos_swa is None else (self.cos_swa[positions], self.sin_swa[positions])))
        x = self.embedding(ids) if inputs is None else inputs  # [T, D]
        if self.embed_scale != 1.0 and inputs is None:
            x = x * self.embed_scale
        # layers after which a cache keeps the residual stream (`NativeCache.keep_features`): x is copied there
        taps = sorted({n for s in segments if s.cache.features is not None for n in s.cache.feature_layers})
        if any(not 0 < n < len(self.blocks) for n in taps):
            raise ValueError(f"a cache asks for the features after layers {taps}; {self.name} has {len(self.blocks)}")
        tapped: dict[int, torch.Tensor] = {}
        if not prefill and self.c_layers is not None:  # the loop below in one C call (one per tap)
            bounds = [0, *taps, len(self.blocks)]
            for a, b in zip(bounds, bounds[1:]):
                layers = self.c_layers if (a, b) == (0, len(self.blocks)) else self.c_layers.layers_between(a, b)
                x = self.kernels.decode_layers(
                    x, layers, [Segment(s.rows, s.cache.k[a:b], s.cache.v[a:b], s.cache.length, s.parents)
                                for s in segments], *rope)
                if b in taps:
                    tapped[b] = x.clone()
        else:
            with threads.lent_to_torch(self.n_threads) if self.owns_cores else nullcontext():
                x = self._layer_loop(x, segments, rope, prefill, taps, tapped)
        start = 0
        for s in segments:
            if s.cache.features is not None:
                rows, D = slice(s.cache.length, s.cache.length + s.rows), x.shape[1]
                for j, n in enumerate(s.cache.feature_layers):
                    s.cache.features[rows, j * D : (j + 1) * D] = tapped[n][start : start + s.rows]
                s.cache.features[rows, -D:] = self.kernels.rms_norm(x[start : start + s.rows], self.norm, self.eps)
            start += s.rows
            s.cache.length += s.rows
        return x

    def _layer_loop(self, x: torch.Tensor, segments: Sequence[_Segment], rope: tuple, prefill: bool,
                    taps: Sequence[int] = (), tapped: dict | None = None) -> torch.Tensor:
        """`_layers` one operation at a time (each a call over all rows, or one per segment); rope: cos,
        sin [T, hd] of the rows' positions for the global layers, then for the sliding ones (or None).
        The residual stream after each of the first `taps` layers goes into `tapped`, by layer count."""
        one, bounds, start = len(segments) == 1, [], 0
        for s in segments:
            bounds.append((start, start + s.rows, s.cache.length))
            start += s.rows
        activation = self.kernels.gelu_mul if self.gelu else self.kernels.silu_mul
        for i, b in enumerate(self.blocks):
            products = self.prefill_products[i] if prefill and self.prefill_products else b
            window = self.windows[i]
            cos, sin = rope[2:] if window else rope[:2]
            qkv = self._qkv_extras(products["qkv"](self.kernels.rms_norm(x, b["attn_norm"], self.eps)), b)
            parts = []
            for s, (lo, hi, p0) in zip(segments, bounds):
                keys, values = s.cache.layer_k[i], s.cache.layer_v[i]  # [Hkv, P, hd]
                q = self.kernels.rope_store(qkv if one else qkv[lo:hi], cos if one else cos[lo:hi],
                                           sin if one else sin[lo:hi], keys, values, p0)  # [rows, H, hd]; k, v cached
                if prefill:  # all queries at once (the decode loop prefills a prompt alone, plain or not)
                    parts.append(self._attend_block(q, i, s.cache, p0, window))
                else:  # each position alone: its numerics do not depend on what shares the call
                    parts.append(self.kernels.attend(q, keys, values, p0, s.parents, window))
            attn = parts[0] if one else torch.cat(parts)
            x = x + self._post_norm(products["o"](attn), b["post_attn_norm"])
            gate_up = products["gate_up"](self.kernels.rms_norm(x, b["mlp_norm"], self.eps))  # [T, 2 I]
            x = x + self._post_norm(products["down"](activation(gate_up)), b["post_mlp_norm"])
            if i + 1 in taps:
                tapped[i + 1] = x.clone()
        return x

    def _post_norm(self, y: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        """Gemma 3's norm of the attention's or the MLP's output before the residual add (none elsewhere)."""
        return y if weight is None else self.kernels.rms_norm(y, weight, self.eps)

    def _qkv_extras(self, qkv: torch.Tensor, block: dict) -> torch.Tensor:
        """qkv [T, (H + 2 Hkv) hd] with the layer's bias added and each head's q and k normed, where the
        architecture has them (the C decode layers do the same, in the same order)."""
        if block["qkv_bias"] is not None:
            qkv = qkv + block["qkv_bias"]
        if block["q_norm"] is not None:
            T, (H, Hkv, hd) = qkv.shape[0], (self.heads, self.kv_heads, self.head_dim)
            q, k, v = qkv.split([H * hd, Hkv * hd, Hkv * hd], dim=1)
            q = self.kernels.rms_norm(q.reshape(T * H, hd), block["q_norm"], self.eps).view(T, H * hd)
            k = self.kernels.rms_norm(k.reshape(T * Hkv, hd), block["k_norm"], self.eps).view(T, Hkv * hd)
            qkv = torch.cat([q, k, v], dim=1)
        return qkv

    def _attend_block(self, q: torch.Tensor, layer: int, cache: NativeCache, p0: int, window: int = 0) -> torch.Tensor:
        """A prefill chunk's queries at once, causally (within the last `window` positions where > 0):
        q [T, H, hd] -> [T, H hd]."""
        T = q.shape[0]
        H, Hkv, hd = self.heads, self.kv_heads, self.head_dim
        L = p0 + T
        keys, values = cache.k[layer, :, :L], cache.v[layer, :, :L]  # [Hkv, L, hd]
        G = H // Hkv
        mask = torch.ones(T, L, dtype=torch.bool).tril(p0)  # query t sees keys <= p0 + t
        if window > 0:
            mask = mask.triu(p0 - window + 1)  # ... and > p0 + t - window
        qg = q.to(keys.dtype).view(T, Hkv, G, hd).permute(1, 2, 0, 3).reshape(Hkv, G * T, hd)
        out = F.scaled_dot_product_attention(qg[None], keys[None], values[None], attn_mask=mask.repeat(G, 1),
                                             scale=self.attention_scale)  # [1, Hkv, G T, hd]
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


def release_freed_memory() -> None:
    """Hand the memory a load allocated and freed back to the system (glibc keeps freed heap memory
    for reuse: after a load, more than the model's own size)."""
    import ctypes
    import ctypes.util

    library = ctypes.util.find_library("c")
    try:
        ctypes.CDLL(library).malloc_trim(0)
    except (OSError, AttributeError, TypeError):  # not glibc
        pass


def load_native(path: str | os.PathLike, dtype: str = "auto", max_positions: int | None = 4096,
                n_threads: int | None = None) -> NativeLlama:
    """A .gguf file, read directly (its own quantised blocks), or a transformers Llama directory.

    dtype "auto": 4-bit products where the weights are 4-bit groups (a Q4_0 or Q4_1 GGUF), else bf16;
    "bfloat16" and "int4" compute in float32 on CPUs without bf16 units (emulated bf16 is slower)."""
    source = open_source(path)
    return NativeLlama(source, dtype, name=Path(path).expanduser().name, max_positions=max_positions,
                       n_threads=n_threads)
