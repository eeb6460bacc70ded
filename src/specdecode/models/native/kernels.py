"""The native backend's small per-token operations (RMSNorm, RoPE with the cache writes, attention
over the cache, the MLP's activation) and its products: 4-bit groups (bf16, float32 or 8-bit
activations), the LM head in 8-bit blocks (float32 or 8-bit activations), float32 weights.

Each must compute a position exactly as it would be computed alone (the native backend's
exactness). The small ones are dominated by PyTorch's per-op overhead at decode sizes: RMSNorm is
eight ops, and row-invariant attention needs one fused-attention call per position and layer (k of
them a layer in a k-token verification). The products are bound by unpacking quantised weights on
2 cores: the 4-bit ones unpack each weight once for up to 8 (bf16) or 4 (float32) rows; the head
(49152 x 576), which a GGUF stores as Q8_0, reads half of bf16's bytes in those 8-bit blocks. A
BLAS float32 product sums in an order that depends on the row count, so float32 weights go through
`f32_matmul`. The C kernels (`csrc/`, their interface in `csrc/kernels.h`) do each in one call, a
row at a time in a fixed order; `plan.py` decides which build of them runs (AVX-512, AVX2,
portable) and builds it once per machine. With 4-bit products and float32 activations (the AVX2
and portable paths) a decode forward's layers run in one call, `decode_layers`, the same kernels in
the same order, which saves the ~9 calls and output tensors a layer costs from Python. It takes
the rows of several requests at once (ragged `Segment`s, each with its own cache): the products
read the weights once for all of them. `TorchKernels` is the same interface in PyTorch ops, used
where the plan has no C library: exact too, only slower.
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F

from .plan import DecodeModel, KernelPlan, kernel_plan

LANES, MAX_HEAD_DIM = 16, 256  # as in csrc/kernels.h


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def tree_keys(parents: torch.Tensor, node: int, p0: int) -> torch.Tensor:
    """The cache slots a draft tree's node attends to: the first p0, then its ancestors' and its own
    (node i sits in slot p0 + i; parents[i] is its parent among the nodes, -1 for the cache's last
    token), root first: the keys it would see at the end of a chain of them."""
    path = []
    while node >= 0:
        path.append(p0 + node)
        node = int(parents[node])
    return torch.cat([torch.arange(p0), torch.tensor(path[::-1])])


class TorchKernels:
    """RMSNorm, RoPE with the cache writes, attention over the cache and the MLP's activation, in
    PyTorch ops. `scale`: the attention's query-key scale (default head_dim ** -0.5)."""

    q4 = q4f = q4q8 = False  # no 4-bit products of its own (PyTorch's int4 kernel serves)
    products: dict[str, int] = {}  # no decode_layers (CKernels: its product ids by kind, and its layer slots)
    slots: list[str] = []

    def __init__(self, heads: int, kv_heads: int, head_dim: int, plan: KernelPlan | None = None,
                 scale: float | None = None) -> None:
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.scale = head_dim ** -0.5 if scale is None else scale
        self.plan = plan or KernelPlan("torch", "pytorch", "these shapes take PyTorch ops")

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """Llama's RMSNorm, computed in float32 as transformers does: x [T, D] -> [T, D]."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(x.dtype)

    @staticmethod
    def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
        """The MLP's activation: gate_up [T, 2 I] (gate | up) -> silu(gate) * up [T, I]."""
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    @staticmethod
    def gelu_mul(gate_up: torch.Tensor) -> torch.Tensor:
        """Gemma's MLP activation: gate_up [T, 2 I] (gate | up) -> gelu(gate) * up [T, I], gelu's tanh
        approximation (transformers' gelu_pytorch_tanh, llama.cpp's gelu)."""
        gate, up = gate_up.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up

    def rope_store(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor,
                   values: torch.Tensor, p0: int) -> torch.Tensor:
        """RoPE (rotate-half form) of the new q and k, k and v written into one layer of the cache:
        qkv [T, (H + 2 Hkv) hd], cos/sin [T, hd] of positions p0.., keys/values [Hkv, P, hd] -> q [T, H, hd]."""
        T, (H, Hkv, hd) = qkv.shape[0], (self.heads, self.kv_heads, self.head_dim)
        q, key, value = qkv.split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [T, 1, hd]
        q, key = q.view(T, H, hd), key.view(T, Hkv, hd)
        keys[:, p0 : p0 + T] = (key * cos + rotate_half(key) * sin).transpose(0, 1)
        values[:, p0 : p0 + T] = value.view(T, Hkv, hd).transpose(0, 1)
        return q * cos + rotate_half(q) * sin

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, p0: int,
               parents: torch.Tensor | None = None, window: int = 0) -> torch.Tensor:
        """q [T, H, hd] in cache slots p0.., keys/values [Hkv, P, hd] of one layer -> [T, H hd]: query t
        over the first p0 + t + 1 positions, or, given `parents` (a draft tree, see `tree_keys`), over
        the first p0 and its ancestors' and its own; of those only the last `window` where window > 0
        (a sliding window); one fused-attention call per position (4-d inputs take PyTorch's fused
        CPU kernel; the 3-d form fell back to the slower unfused math path)."""
        H, Hkv, hd = self.heads, self.kv_heads, self.head_dim
        q = q.to(keys.dtype)
        rows = []
        for t in range(q.shape[0]):
            if parents is None:
                seen = slice(max(0, p0 + t + 1 - window) if window > 0 else 0, p0 + t + 1)
            else:
                seen = tree_keys(parents, t, p0)[-window if window > 0 else 0:]
            rows.append(F.scaled_dot_product_attention(q[t].view(1, Hkv, H // Hkv, hd), keys[None, :, seen],
                                                       values[None, :, seen], scale=self.scale).reshape(1, H * hd))
        return torch.cat(rows)


class CKernels(TorchKernels):
    """The same operations through the C kernels (csrc/)."""

    def __init__(self, lib, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 plan: KernelPlan | None = None, threads: int | None = None, scale: float | None = None) -> None:
        super().__init__(heads, kv_heads, head_dim, plan, scale)
        self.threads = threads or torch.get_num_threads()  # the library's pool runs each call on this many
        suffix = "bf16" if dtype == torch.bfloat16 else "f32"
        self._rms_norm, self._rope_store, self._attend, self._silu_mul, self._gelu_mul = (
            getattr(lib, f"{op}_{suffix}") for op in ("rms_norm", "rope_store", "attend", "silu_mul", "gelu_mul"))
        self._q8_matmul, self._q4_matmul, self._q4f_matmul = lib.q8_matmul, lib.q4_matmul, lib.q4f_matmul
        self._q4q8_matmul, self._q8q8_matmul = lib.q4q8_matmul, lib.q8q8_matmul
        self._f32_matmul, self._decode_layers = lib.f32_matmul, lib.decode_layers
        self._q4kq8_matmul, self._q5kq8_matmul, self._q5q8_matmul = lib.q4kq8_matmul, lib.q5kq8_matmul, lib.q5q8_matmul
        self._q6q8_matmul, self._q40q8_matmul = lib.q6q8_matmul, lib.q40q8_matmul
        self._q6kq8_matmul = lib.q6kq8_matmul
        # Q6_K's values in 6 bits (q6kq8) where the build has vector code for them, else as int8 (q6q8)
        self.q6k_packed = bool(lib.q6kq8_vector())
        # decode_layers' product ids by the Python products' `kind`, and its layer slots, from the
        # library itself (csrc/kernels.h's PRODUCT_KINDS and LAYER_SLOTS)
        self.products = {name: i for i, name in enumerate(lib.product_kinds().decode().split(","))}
        self.slots = lib.layer_slots().decode().split(",")
        self.dtype = dtype
        # 4-bit products: bf16 activations through AVX512-BF16's dot product (q4), float32 ones on any build (q4f)
        self.q4 = dtype == torch.bfloat16 and bool(lib.q4_available())
        self.q4f = dtype == torch.float32
        # ... and with the activations quantised to 8 bits (integer dot products; plain C where not `q4q8_vector`)
        self.q4q8 = dtype == torch.float32
        self.q4q8_vector = bool(lib.q4q8_vector())

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        self._rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], eps)
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self._activation(self._silu_mul, gate_up)

    def gelu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self._activation(self._gelu_mul, gate_up)

    @staticmethod
    def _activation(kernel, gate_up: torch.Tensor) -> torch.Tensor:
        gate_up = gate_up.contiguous()
        T, width = gate_up.shape
        out = torch.empty(T, width // 2, dtype=gate_up.dtype)
        kernel(gate_up.data_ptr(), out.data_ptr(), T, width // 2)
        return out

    def rope_store(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor,
                   values: torch.Tensor, p0: int) -> torch.Tensor:
        T = qkv.shape[0]
        qkv, cos, sin = qkv.contiguous(), cos.contiguous(), sin.contiguous()
        q = torch.empty(T, self.heads, self.head_dim)  # float32: the attention's input
        self._rope_store(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), q.data_ptr(), keys.data_ptr(),
                         values.data_ptr(), T, self.heads, self.kv_heads, self.head_dim, keys.stride(0), p0)
        return q

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, p0: int,
               parents: torch.Tensor | None = None, window: int = 0) -> torch.Tensor:
        T = q.shape[0]
        qf = q.float().contiguous()  # [T, H, hd]
        out = torch.empty(T, self.heads * self.head_dim, dtype=self.dtype)  # written in the cache's dtype
        if self._attend(qf.data_ptr(), keys.data_ptr(), values.data_ptr(), out.data_ptr(), T, self.heads,
                        self.kv_heads, self.head_dim, keys.stride(0), p0 + 1, _pointer(parents), window,
                        self.scale, self.threads):
            raise MemoryError("attention: no memory for one query's scores")
        return out

    def q8_matmul(self, x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """x [T, in] @ W^T for W in Q8_0 blocks laid out as the C kernels' q8_matmul takes them:
        q [out / 16, in, 16] int8, scales [out / 16, in / 32, 16] float32 -> [T, out] float32."""
        x = x.float().contiguous()
        T, (blocks, K, _) = x.shape[0], q.shape
        y = torch.empty(T, blocks * 16)
        if self._q8_matmul(x.data_ptr(), q.data_ptr(), scales.data_ptr(), y.data_ptr(), T, K, blocks * 16,
                           self.threads):
            raise MemoryError("8-bit product: no memory for the rows' sums")
        return y

    def q8q8_matmul(self, x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """x [T, in] float32, quantised to 8 bits per group of 32 inside, @ W^T for W in Q8_0 blocks laid
        out as the C kernels' q8q8_matmul takes them: q [out / 16, in / 32, 8, 16, 4] uint8 (q + 128),
        scales [out / 16, in / 32, 16] float32 -> [T, out] float32."""
        return self._grouped(self._q8q8_matmul, x, q, scales, "8-bit product")

    def q6q8_matmul(self, x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """q8q8_matmul with a scale a 16 inputs (Q6_K's d sc): scales [out / 16, in / 256, 288] uint8, per
        16 outputs and super-block d [16] float16 then sc [16 groups][16 outputs] int8 (common.h)."""
        return self._grouped(self._q6q8_matmul, x, q, scales, "8-bit product")

    def q6kq8_matmul(self, x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """q6q8_matmul on Q6_K's values packed in 6 bits: q [out / 16, in / 32, 384] uint8 (`linear.pack_q6k`)."""
        return self._grouped(self._q6kq8_matmul, x, q, scales, "8-bit product")

    def q4_matmul(self, x: torch.Tensor, q: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
        """x [T, in] bf16 @ W^T for W in Q4_1 groups laid out as the C kernels' q4_matmul takes them:
        q [out / 16, in / 4, 32] uint8, coef [out / 16, in / 32, 2, 16] float32 -> [T, out] bf16."""
        x = x.contiguous()
        T, (blocks, chunks, _) = x.shape[0], q.shape
        y = torch.empty(T, blocks * 16, dtype=torch.bfloat16)
        if self._q4_matmul(x.data_ptr(), q.data_ptr(), coef.data_ptr(), y.data_ptr(), T, chunks * 4, blocks * 16,
                           self.threads):
            raise MemoryError("4-bit product: no memory for the group sums")
        return y

    def q4f_matmul(self, x: torch.Tensor, q: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
        """x [T, in] float32 @ W^T for W in Q4_1 groups laid out as the C kernels' q4f_matmul takes them:
        q [out / 16, in / 32, 16, 16] uint8, coef [out / 16, in / 32, 2, 16] float16 (d, m) -> [T, out] float32."""
        return self._grouped(self._q4f_matmul, x, q, coef, "4-bit product")

    def q5q8_matmul(self, x: torch.Tensor, q: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
        """q4q8_matmul for Q5_1's 5-bit values: q [out / 16, in / 32, 320] uint8 (low nibbles, high bits)."""
        return self._grouped(self._q5q8_matmul, x, q, coef, "5-bit product")

    def q40q8_matmul(self, x: torch.Tensor, q: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
        """q4q8_matmul for Q4_0's groups: coef [out / 16, in / 32, 16] float16, d alone (m = -8 d)."""
        return self._grouped(self._q40q8_matmul, x, q, coef, "4-bit product")

    def q4kq8_matmul(self, x: torch.Tensor, q: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
        """q4q8_matmul for Q4_K groups: coef [out / 16, in / 256, 320] uint8 (csrc/common.h's KQ_BYTES)."""
        return self._grouped(self._q4kq8_matmul, x, q, coef, "4-bit product")

    def q5kq8_matmul(self, x: torch.Tensor, q: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
        """The same for Q5_K's 5-bit values: q [out / 16, in / 32, 320] uint8 (low nibbles, high bits)."""
        return self._grouped(self._q5kq8_matmul, x, q, coef, "5-bit product")

    def q4q8_matmul(self, x: torch.Tensor, q: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
        """x [T, in] float32, quantised to 8 bits per group of 32 inside, @ W^T for W in Q4_1 groups laid
        out as the C kernels' q4q8_matmul takes them: q [out / 16, in / 32, 8, 32] uint8, coef as q4f's."""
        return self._grouped(self._q4q8_matmul, x, q, coef, "4-bit product")

    def _grouped(self, product, x: torch.Tensor, q: torch.Tensor, coef: torch.Tensor, what: str) -> torch.Tensor:
        """A product over weights laid out [out / 16, in / 32, ...] with float32 x [T, in] -> [T, out]."""
        x = x.float().contiguous()
        T, (blocks, groups) = x.shape[0], q.shape[:2]
        y = torch.empty(T, blocks * 16)
        if product(x.data_ptr(), q.data_ptr(), coef.data_ptr(), y.data_ptr(), T, groups * 32, blocks * 16,
                   self.threads):
            raise MemoryError(f"{what}: no memory for the rows' group sums or quantised activations")
        return y

    def f32_matmul(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x [T, in] float32 @ W^T for W laid out [out / 16, in, 16] float32 -> [T, out] float32."""
        x = x.float().contiguous()
        T, (blocks, K, _) = x.shape[0], w.shape
        y = torch.empty(T, blocks * 16)
        self._f32_matmul(x.data_ptr(), w.data_ptr(), y.data_ptr(), T, K, blocks * 16, self.threads)
        return y

    def decode_model(self, weights: torch.Tensor, kinds: torch.Tensor, windows: torch.Tensor | None, dim: int,
                     hidden: int, eps: float, gelu: bool) -> DecodeModel:
        """A model's layers as `decode_layers` takes them: weights [layers, LAYER_POINTERS] int64, the
        addresses `self.slots` names (tensors the caller keeps); kinds [layers, 4] int32, the ids
        `self.products` gives the q|k|v, o, gate|up and down products; windows [layers] int32 each
        layer's sliding window (0: none; None: no layer has one); gelu: the MLP's activation is
        gelu_mul's, else silu_mul's."""
        layers = weights.shape[0]
        assert weights.dtype == torch.int64 and weights.shape == (layers, len(self.slots)) and weights.is_contiguous()
        assert kinds.dtype == torch.int32 and kinds.shape == (layers, 4) and kinds.is_contiguous()
        assert windows is None or (windows.dtype == torch.int32 and windows.shape == (layers,))
        return DecodeModel.of(weights, kinds, windows, layers, dim, self.heads, self.kv_heads, self.head_dim, hidden,
                              int(gelu), eps, self.scale)

    def decode_layers(self, x: torch.Tensor, model: DecodeModel, segments: Sequence[Segment], cos: torch.Tensor,
                      sin: torch.Tensor, cos_swa: torch.Tensor | None = None,
                      sin_swa: torch.Tensor | None = None) -> torch.Tensor:
        """Every layer of a decode forward in one call (float32 residual stream; each product of its
        kind): x [T, D] float32, the rows of `segments` in turn (one request each, with its own cache;
        one segment for a single forward), updated in place and returned; `model` the layers
        (`decode_model`); cos/sin [T, hd] of the rows' positions, cos_swa/sin_swa [T, hd] for the
        layers with a sliding window. The products run once over all T rows, RoPE and the cache
        writes and the attention per segment over its own cache."""
        T, D = x.shape
        if sum(s.rows for s in segments) != T:
            raise ValueError(f"the segments hold {sum(s.rows for s in segments)} rows, x {T}")
        table = torch.tensor([[s.rows, s.k.data_ptr(), s.v.data_ptr(), s.k.shape[2], s.first,
                               _pointer(s.parents) or 0] for s in segments], dtype=torch.int64)
        for s in segments:
            assert s.k.dtype == s.v.dtype == torch.float32 and s.k.is_contiguous() and s.v.is_contiguous()
            assert s.k.shape == s.v.shape and s.first + s.rows <= s.k.shape[2] and s.k.shape[0] == model.layers
        assert D == model.dim
        cos, sin = cos.contiguous(), sin.contiguous()
        if model.windows:
            cos_swa, sin_swa = cos_swa.contiguous(), sin_swa.contiguous()
            assert cos_swa.shape == sin_swa.shape == cos.shape
        if self._decode_layers(ctypes.byref(model), x.data_ptr(), T, table.data_ptr(), len(segments), cos.data_ptr(),
                               sin.data_ptr(), cos_swa.data_ptr() if model.windows else None,
                               sin_swa.data_ptr() if model.windows else None, self.threads):
            raise MemoryError("decode layers: no memory for the activations")
        return x


class Segment(NamedTuple):
    """One request's rows in a ragged forward (see `CKernels.decode_layers`): `rows` consecutive rows,
    written into the cache `k`, `v` ([layers, Hkv, P, hd], P its own capacity) at slots first..; a
    chain, or a draft tree given `parents` (int32 [rows], see `attend`)."""

    rows: int
    k: torch.Tensor
    v: torch.Tensor
    first: int
    parents: torch.Tensor | None = None


def _pointer(parents: torch.Tensor | None) -> int | None:
    """A draft tree's parents as the C kernels take them (int32), or NULL for a chain."""
    if parents is None:
        return None
    assert parents.dtype == torch.int32 and parents.is_contiguous()
    return parents.data_ptr()


def make_kernels(heads: int, kv_heads: int, head_dim: int, dim: int, dtype: torch.dtype,
                 threads: int | None = None, scale: float | None = None) -> TorchKernels:
    """The C kernels of this process's kernel plan where they serve these shapes (each call on
    `threads` threads; default: PyTorch's count now), else PyTorch's; `scale`: the attention's
    query-key scale (default head_dim ** -0.5)."""
    fits = (dim % LANES == 0 and head_dim % (2 * LANES) == 0 and head_dim <= MAX_HEAD_DIM and heads % kv_heads == 0
            and dtype in (torch.bfloat16, torch.float32))
    plan, lib = kernel_plan()
    if lib is None or not fits:
        return TorchKernels(heads, kv_heads, head_dim, plan if lib is None else None, scale)
    return CKernels(lib, heads, kv_heads, head_dim, dtype, plan, threads, scale)
