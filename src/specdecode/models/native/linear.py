"""The native backend's products: bf16 through oneDNN (`Linear`), float32 through the C kernels
(`F32Linear`), 4-bit groups (`Int4Linear`) and 8-bit blocks (`Q8Linear`), each computing a row the
same whatever else shares the call. `dense` picks the float one for a weight and a kernel plan."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .source import Groups4, Groups6, Groups8, GroupsK


def bf16_supported() -> bool:
    """Whether oneDNN runs bf16 products natively here (AVX512-BF16 or AMX)."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


class Linear:
    """y = x W^T with W reordered once for oneDNN (bf16), or a plain `F.linear` (float32).

    `row_invariant` (float32 only): a BLAS product's row results depend on the row count (measured:
    a k = 9 forward differed from 9 single steps), so each row then goes through its own call;
    `F32Linear` is the fast way to the same guarantee. A prefill runs alone and needs neither.

    Batch invariance: oneDNN's bf16 product sums over the input dimension K in an order that
    depends on the row count once K exceeds 1024 (measured: SmolLM2's down projection, K = 1536,
    gave row results that differ between 1 and 2..16 rows; K <= 1024 never did). So a wider input
    is split into equal chunks of at most 1024 and the partial products added, which makes every
    row's result independent of how many rows share the call.
    """

    MAX_K = 1024

    def __init__(self, weight: torch.Tensor, row_invariant: bool = False) -> None:  # weight [out, in]
        self.out_features, in_features = weight.shape
        self.row_invariant = row_invariant
        self.packed = weight.dtype == torch.bfloat16 and bf16_supported()
        parts = -(-in_features // self.MAX_K) if self.packed else 1
        self.splits = [in_features // parts + (i < in_features % parts) for i in range(parts)]
        chunks = weight.split(self.splits, dim=1)
        self.weights = [torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), 1) if self.packed else w.contiguous()
                        for w in chunks]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, out], in x's dtype
        if self.packed and x.dtype != torch.bfloat16:  # a float32 stream through bf16 weights (w4a8's prefill)
            return self(x.bfloat16()).to(x.dtype)
        if not self.packed:
            if self.row_invariant and x.shape[0] > 1:
                return torch.cat([F.linear(row, self.weights[0]) for row in x.split(1)])
            return F.linear(x, self.weights[0])
        xs = x.split(self.splits, dim=-1) if len(self.splits) > 1 else (x,)
        y = None
        for xi, w in zip(xs, self.weights):
            yi = torch.ops.mkldnn._linear_pointwise(xi.contiguous(), w, None, "none", [], "")
            y = yi if y is None else y + yi
        return y


class F32Linear:
    """y = x W^T for a float32 weight through the C kernels' `f32_matmul` (layout [out / 16, in, 16]):
    each row summed in one fixed order whatever the row count, with the weight read once for up
    to 4 rows."""

    def __init__(self, weight: torch.Tensor, kernels) -> None:  # weight [out, in], out % 16 == 0, in % 32 == 0
        N, K = weight.shape
        self.w = weight.float().view(N // 16, 16, K).transpose(1, 2).contiguous()  # [out / 16, in, 16]
        self.out_features, self.kernels = N, kernels

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, out] float32
        return self.kernels.f32_matmul(x, self.w)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of W (float32 [len(ids), in]), read back from the kernel's layout (as `Q8Linear.rows`)."""
        return self.w[ids // 16, :, ids % 16]


def dense(weight: torch.Tensor, dtype: torch.dtype, kernels) -> Linear | F32Linear:
    """The row-invariant product of a float weight [out, in] in the activation dtype: oneDNN's bf16
    (split, see `Linear`), the C kernels' float32 where the shape fits, else one call per row."""
    N, K = weight.shape
    if dtype == torch.float32 and hasattr(kernels, "f32_matmul") and N % 16 == 0 and K % 32 == 0:
        return F32Linear(weight, kernels)
    return Linear(weight.to(dtype), row_invariant=True)


def _grid(w: torch.Tensor, offset: torch.Tensor, scale: torch.Tensor, lowest: int,
          highest: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The integers q (lowest..highest) nearest to w = scale * q + offset per group. w [N, K/G, G]
    float32; offset and scale [N, K/G, 1] (a zero scale, a constant group, is taken as 1). Returns
    (q, scale)."""
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return ((w - offset) / scale).round_().clamp_(lowest, highest), scale


def _grid_values(w: torch.Tensor, offset: torch.Tensor, scale: torch.Tensor, lowest: int, highest: int):
    """`_grid`'s (q, scale), or None unless q reproduces every weight to within a thousandth of its
    group's step."""
    q, scale = _grid(w, offset, scale, lowest, highest)
    return None if ((q * scale + offset - w).abs() > scale * 1e-3).any() else (q, scale)


def _q4_1_grid(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K/32, 32] -> Q4_1's minimum and step per group ([N, K/32, 1] each): the minimum maps to
    0 and the maximum to 15, both stored in float16."""
    low = w.amin(-1, keepdim=True).half().float()
    return low, ((w.amax(-1, keepdim=True) - low) / 15).half().float()


def q4_1_groups(weight: torch.Tensor) -> Groups4:
    """weight [N, K] float -> Q4_1 groups as llama.cpp writes them, rounding each weight to its
    group's nearest step (lossy, unlike `Int4Linear.quantize`)."""
    N, K = weight.shape
    w = weight.detach().float().view(N, K // 32, 32)
    low, step = _q4_1_grid(w)
    q, step = _grid(w, low, step, 0, 15)
    return Groups4(q.to(torch.uint8).view(N, K), step[..., 0].half(), low[..., 0].half())


def q8_0_groups(weight: torch.Tensor) -> Groups8:
    """weight [N, K] float -> Q8_0 groups as llama.cpp writes them: per 32 inputs the largest
    magnitude maps to +-127, the step stored in float16; each weight rounded to its nearest step."""
    N, K = weight.shape
    w = weight.detach().float().view(N, K // 32, 32)
    q, step = _grid(w, torch.zeros(()), (w.abs().amax(-1, keepdim=True) / 127).half().float(), -127, 127)
    return Groups8(q.to(torch.int8).view(N, K), step[..., 0])


class Int4Linear:
    """y = x W^T with W held as 4-bit integers in groups of 32 inputs, each group with a scale and a
    minimum: w = scale * q + minimum, q in 0..15 (the GGUF Q4_1 block format): a quarter of the bf16
    bytes, which is what a decode step is bound by. Four kernels (`kind`):

    - `q4`: the C kernels' `q4_matmul` (bf16 activations on AVX512-BF16 CPUs): unpacks each weight
      once per call for up to 8 rows into bf16 and multiplies with the bf16 dot product, where
      PyTorch's kernel unpacks again for every 4 rows (`benchmarks/results/int4_products.md`).
    - `q4f`: `q4f_matmul` (float32 activations, any C build: AVX2, portable): converts each nibble to
      float32 once for every two rows, with d and m kept in the file's float16.
    - `q4q8`: `q4q8_matmul` (activations quantised to 8 bits per group of 32 inside the call, as
      llama.cpp does): integer dot products, the same bits on every path (the `w4a8` precision);
      `q40q8` the same for Q4_0's groups, whose minimum is -8 d: their d alone is held.
    - `torch`: where the plan has no C library, PyTorch's CPU kernel (`_weight_int4pack_mm_for_cpu`),
      which unpacks the weights again for every 4 rows.

    `quantize` returns None unless the weight already is such a grid (every weight reproduced to
    within a thousandth of its group's step): a model dequantised from Q4_1 is run on its own
    4-bit values, never a lossy requantisation of another format. Row results do not depend on the
    row count (tested with the other batch-invariance tests).
    """

    GROUP = 32

    def __init__(self, packed: torch.Tensor, coef: torch.Tensor, out_features: int, kernels=None,
                 kind: str = "torch") -> None:
        self.packed, self.coef = packed, coef  # the kernel's layouts of q and of the groups' scales and minima
        self.out_features, self.kind = out_features, kind
        self.kernels = kernels  # with the `kind`_matmul product (None: PyTorch's kernel)

    @classmethod
    def quantize(cls, weight: torch.Tensor, dtype: torch.dtype, kernels=None,
                 int8_activations: bool = False) -> Int4Linear | None:
        """weight [out, in] (float) -> an Int4Linear holding exactly its values, or None (see
        `from_groups` for the kernels)."""
        N, K = weight.shape
        if K % cls.GROUP or N % 16:  # the kernels take outputs 16 at a time
            return None
        w = weight.float().view(N, K // cls.GROUP, cls.GROUP)
        low, step = _q4_1_grid(w)
        grid = _grid_values(w, low, step, 0, 15)
        if grid is None:
            return None
        q, scale = grid
        groups = Groups4(q.to(torch.uint8).view(N, K), scale[..., 0].half(), low[..., 0].half())
        return cls.from_groups(groups, dtype, kernels, int8_activations)

    @classmethod
    def from_groups(cls, groups: Groups4, dtype: torch.dtype, kernels=None,
                    int8_activations: bool = False) -> Int4Linear | None:
        """4-bit groups (a GGUF file's Q4_0 or Q4_1 blocks) -> an Int4Linear, or None where the kernels
        do not take the shape. Runs through `kernels.q4q8_matmul` where `int8_activations` (float32
        `dtype`, kernels with `q4q8`), else `kernels.q4_matmul` where `kernels.q4` says it serves,
        `kernels.q4f_matmul` where `kernels.q4f` does, else PyTorch's kernel."""
        N, K = groups.q.shape
        if K % cls.GROUP or N % 16:  # the kernels take outputs 16 at a time
            return None
        q = groups.q.view(N, K // cls.GROUP, cls.GROUP)
        scale, low = groups.d.float()[..., None], groups.m.float()[..., None]  # [N, K/G, 1]
        # q4f's and q4q8's d, m: float16 [N/16, K/G, 2, 16], as the file holds them (half the bytes of a, b)
        halves = lambda: torch.cat([scale, low], dim=-1).half().view(  # noqa: E731
            N // 16, 16, K // cls.GROUP, 2).permute(0, 2, 3, 1).contiguous()
        if int8_activations:
            if not (getattr(kernels, "q4q8", False) and dtype == torch.float32):
                raise ValueError("8-bit activations need the C kernels with float32 activations")
            packed, five = _q4q8_values(groups.q)  # 5-bit values (Q5_1): q5q8_matmul
            if not five and torch.equal(groups.m.float(), -8 * groups.d.float()):  # Q4_0's: d alone, q40q8_matmul
                d = groups.d.half().view(N // 16, 16, K // cls.GROUP).transpose(1, 2).contiguous()  # [N/16, K/G, 16]
                return cls(packed, d, N, kernels, kind="q40q8")
            return cls(packed, halves(), N, kernels, kind="q5q8" if five else "q4q8")
        if bool((groups.q > 15).any()):  # 5-bit values: only the 8-bit-activation kernels take them
            return None
        if getattr(kernels, "q4f", False) and dtype == torch.float32:
            # q4f_matmul's layout: per 16 outputs and group, byte [i][o] = q[o, i] | q[o, i + 16] << 4
            t = q.view(N // 16, 16, K // cls.GROUP, 2, 16)  # [blocks, o, group, high nibble?, i]
            packed = (t[:, :, :, 0] | t[:, :, :, 1] << 4).permute(0, 2, 3, 1).contiguous()  # [blocks, group, i, o]
            return cls(packed, halves(), N, kernels, kind="q4f")
        coef = torch.cat([16 * scale, low - 16 * scale], dim=-1)  # a = 16 d, b = m - 16 d: [N, K/G, 2]
        coef = coef.view(N // 16, 16, K // cls.GROUP, 2).permute(0, 2, 3, 1).contiguous()  # [N/16, K/G, 2, 16]
        if getattr(kernels, "q4", False):
            # q4_matmul's layout: per 16 outputs and 4 inputs 32 bytes, byte 2o + j = q[o, j] | q[o, j + 2] << 4
            t = q.view(N // 16, 16, K // 4, 2, 2)  # [blocks, o, chunk, high nibble?, j]
            packed = (t[..., 0, :] | t[..., 1, :] << 4).transpose(1, 2).reshape(N // 16, K // 4, 32)  # o, j -> 2o + j
            return cls(packed, coef, N, kernels, kind="q4")
        packed = torch._convert_weight_to_int4pack_for_cpu(q.view(N, K).to(torch.int32), 1)
        # PyTorch's kernel computes (q - 8) * scale + offset, with both in the activation dtype
        scales_zeros = torch.cat([scale, low + 8 * scale], dim=-1).transpose(0, 1).contiguous().to(dtype)
        return cls(packed, scales_zeros, N)

    @classmethod
    def from_k_quant(cls, groups: GroupsK, kernels) -> Int4Linear | None:
        """K-quant groups (Q4_K, Q5_K) -> an Int4Linear on `kernels.q4kq8_matmul` (values 0..15) or
        `q5kq8_matmul` (a value above 15), with 8-bit activations; None where the kernels lack them or
        the shape does not fit. The coefficients stay the file's fields (common.h's KQ_BYTES layout:
        0.625 bits a weight, against 2 for float32 d and m a group)."""
        N, K = groups.q.shape
        if K % 256 or N % 16 or not getattr(kernels, "q4q8", False):
            return None
        packed, five = _q4q8_values(groups.q)
        per_block = lambda t: t.view(N // 16, 16, K // 256, -1).permute(0, 2, 3, 1)  # noqa: E731  [N/16, K/256, .., 16]
        coef = torch.cat([per_block(groups.d.view(N, -1, 1)).contiguous().view(torch.uint8).flatten(2),
                          per_block((-groups.dmin).view(N, -1, 1)).contiguous().view(torch.uint8).flatten(2),
                          per_block(groups.sc.view(N, -1, 8)).flatten(2), per_block(groups.mn.view(N, -1, 8)).flatten(2)],
                         dim=-1)  # [N/16, K/256, 320]: d, -dmin (float16 [16] each), sc, mn ([8][16] each)
        return cls(packed.contiguous(), coef.contiguous(), N, kernels, kind="q5kq8" if five else "q4kq8")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, out]
        if self.kind == "torch":
            return torch._weight_int4pack_mm_for_cpu(x.contiguous(), self.packed, self.GROUP, self.coef)
        return getattr(self.kernels, f"{self.kind}_matmul")(x, self.packed, self.coef)


def _q4q8_values(q: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """4- or 5-bit values [N, K] in q4q8_matmul's layout (`_q4q8_nibbles`), and whether any is above 15.
    Where one is (Q5_1, Q5_K), each group's 256 bytes of low nibbles are followed by 64 of high bits:
    per chunk two little-endian uint32, bit b the high bit of chunk byte b's low, then high nibble
    (csrc/common.h). A tensor whose values all fit 4 bits runs as 4-bit, exactly."""
    N, K = q.shape
    high = q >> 4
    if not bool(high.any()):
        return _q4q8_nibbles(q).view(N // 16, K // 32, 256), False
    # lane b = 4o + j of a half's uint32 is bit b % 8 of its byte b // 8: output o = 2k + (o % 2) of the half
    t = high.view(N // 16, 2, 4, 2, K // 32, 8, 4)  # [blocks, half, byte k, o % 2, group, c, j]
    x = t[:, :, :, 0] | t[:, :, :, 1] << 4  # bit 4 (o % 2)
    byte = x[..., 0] | x[..., 1] << 1 | x[..., 2] << 2 | x[..., 3] << 3  # bit 4 (o % 2) + j: [blocks, half, k, group, c]
    packed = torch.cat([_q4q8_nibbles(q & 15).view(N // 16, K // 32, 256),
                        byte.permute(0, 3, 4, 1, 2).reshape(N // 16, K // 32, 64)], dim=-1)
    return packed.contiguous(), True


def _q4q8_nibbles(q: torch.Tensor) -> torch.Tensor:
    """4-bit values [N, K] in q4q8_matmul's layout: per 16 outputs, group of 32 and chunk c of 4 inputs,
    32 bytes, byte 4o + j = q[o, 4c + j] | q[o + 8, 4c + j] << 4 (o < 8): [N / 16, K / 32, 8, 32]."""
    N, K = q.shape
    t = q.view(N // 16, 2, 8, K // 32, 8, 4).permute(0, 3, 4, 2, 5, 1)  # [blocks, group, c, o, j, half]
    return (t[..., 0] | t[..., 1] << 4).reshape(N // 16, K // 32, 8, 32).contiguous()


class Q8Linear:
    """y = x W^T with W held as int8 in groups of 32 inputs, each with one scale: w = scale * q (the
    GGUF Q8_0 block format, in which SmolLM2's file stores its tied embedding / LM head). Runs
    through the C kernels: `q8_matmul` (float32 activations) or, with `int8_activations`, `q8q8_matmul`
    (the activations quantised to 8 bits too; integer dot products), or for Q6_K's 6-bit values, a
    scale d sc a 16 inputs kept as the file factors it, `q6q8_matmul`. Float32 out. Like
    `Int4Linear.quantize`, `quantize` returns None unless the weight already is such a grid, so
    nothing is requantised."""

    def __init__(self, q: torch.Tensor, scales: torch.Tensor, kernels, kind: str = "q8") -> None:
        self.q, self.scales, self.kernels, self.kind = q, scales, kernels, kind  # q, scales: the kernel's layouts
        self.out_features = scales.shape[0] * 16

    @classmethod
    def quantize(cls, weight: torch.Tensor, kernels, int8_activations: bool = False) -> Q8Linear | None:
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
        return cls.from_groups(Groups8(q.to(torch.int8).view(N, K), scale[..., 0]), kernels, int8_activations)

    @classmethod
    def from_groups(cls, groups: Groups8 | Groups6, kernels, int8_activations: bool = False) -> Q8Linear | None:
        """8-bit groups (a GGUF file's Q8_0 blocks) or Q6_K's -> a Q8Linear, or None where the kernels do
        not take the shape (Q6_K's: with 8-bit activations only, `q6q8_matmul`)."""
        N, K = groups.q.shape
        if K % 32 or N % 16 or not hasattr(kernels, "q8_matmul"):
            return None
        q = groups.q
        if isinstance(groups, Groups6):
            if not int8_activations:
                return None
            # q6q8_matmul's coefficients (csrc/common.h's Q6K_BYTES): per 16 outputs and super-block of 256
            # inputs, d [16] float16 then sc [16 groups][16 outputs] int8, as the file factors the scales
            d = groups.d.half().view(N // 16, 16, K // 256).permute(0, 2, 1).contiguous().view(torch.uint8)
            sc = groups.sc.view(N // 16, 16, K // 256, 16).permute(0, 2, 3, 1).reshape(N // 16, K // 256, 256)
            coef = torch.cat([d.view(N // 16, K // 256, 32), sc.view(torch.uint8)], dim=-1).contiguous()
            if getattr(kernels, "q6k_packed", False):  # the values in 6 bits: a quarter fewer bytes a step
                return cls(pack_q6k(q), coef, kernels, kind="q6kq8")
            return cls(_q8q8_layout(q), coef, kernels, kind="q6q8")
        if int8_activations:
            q = _q8q8_layout(q)
        scales = groups.d.float().view(N // 16, 16, K // 32).transpose(1, 2).contiguous()  # [out/16, in/32, 16]
        if int8_activations:
            return cls(q, scales, kernels, kind="q8q8")
        q = q.view(N // 16, 16, K).transpose(1, 2).contiguous()  # [out/16, in, 16]
        return cls(q, scales, kernels)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, out] float32
        return getattr(self.kernels, f"{self.kind}_matmul")(x, self.q, self.scales)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of W (float32 [len(ids), in]), read back from the kernel's layout: a tied
        embedding looks its tokens up here rather than keeping a second copy of the table."""
        block, o = ids // 16, ids % 16
        if self.kind in ("q6q8", "q6kq8"):  # [out/16, in/256, 288] bytes: d [16] float16, sc [16 groups][16] int8
            coef = self.scales[block]  # [T, in / 256, 288]
            d = coef[..., :32].contiguous().view(torch.float16).float()[torch.arange(len(ids)), :, o]  # [T, in/256]
            sc = coef[..., 32:].view(torch.int8).view(len(ids), -1, 16, 16)[torch.arange(len(ids)), :, :, o]
            scales = (d[..., None] * sc.float()).flatten(1)  # [T, in / 16]
        else:
            scales = self.scales[block, :, o]  # [T, in / 32]
        if self.kind in ("q8q8", "q6q8"):  # [out/16, in/32, 8, 16, 4] bytes, q + 128
            q = self.q[block, :, :, o].to(torch.int16) - 128  # [T, in / 32, 8, 4]
        elif self.kind == "q6kq8":
            q = unpack_q6k(self.q[block], o) - 32  # [T, in / 32, 8, 4]
        else:  # [out/16, in, 16] int8
            q = self.q[block, :, o]  # [T, in]
        T = ids.shape[0]
        return (q.reshape(T, scales.shape[1], -1).float() * scales[..., None]).reshape(T, -1)


def _q8q8_layout(q: torch.Tensor) -> torch.Tensor:
    """int8 q [N, K] -> q8q8_matmul's [N/16, K/32, 8, 16, 4] bytes, q + 128 (chunk c, output o, input 4c+j)."""
    N, K = q.shape
    return (q.view(torch.uint8) ^ 128).view(N // 16, 16, K // 32, 8, 4).permute(0, 2, 3, 1, 4).contiguous()


def pack_q6k(q: torch.Tensor) -> torch.Tensor:
    """Q6_K's values as q - 32, int8 [N, K] -> q6kq8_matmul's [N/16, K/32, 384] bytes (csrc/common.h's
    Q6K_GROUP_BYTES): q in 0..63, chunk c's 32 bytes of nibbles (byte 4o + j: input 4c + j of output o
    low, of output o + 8 high), then after all 8 chunks' nibbles each chunk's 16 bytes of high bits
    (byte k: those of nibble bytes k and k + 16, low nibbles in bits 0-3, high ones in bits 4-7)."""
    N, K = q.shape
    u = (q.to(torch.int16) + 32).to(torch.uint8).view(N // 16, 16, K // 32, 8, 4).permute(0, 2, 3, 1, 4)
    low, high = u[..., :8, :].reshape(N // 16, K // 32, 8, 32), u[..., 8:, :].reshape(N // 16, K // 32, 8, 32)
    nibbles = (low & 15) | ((high & 15) << 4)
    low, high = low >> 4, high >> 4  # the two high bits
    bits = low[..., :16] | (low[..., 16:] << 2) | (high[..., :16] << 4) | (high[..., 16:] << 6)
    return torch.cat([nibbles.reshape(N // 16, K // 32, 256), bits.reshape(N // 16, K // 32, 128)], -1).contiguous()


def unpack_q6k(groups: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """Output o[t]'s values (0..63, int16 [T, K/32, 8, 4]: chunk, input) of groups [T, K/32, 384]
    (`pack_q6k`'s layout, each its 16 outputs' block)."""
    T, G = groups.shape[:2]
    byte = 4 * (o % 8)[:, None] + torch.arange(4)  # [T, 4]: nibble byte b of each input of a chunk
    high = (o >= 8).to(torch.int16)[:, None, None, None]
    rows = torch.arange(T)[:, None]
    nibbles = groups[..., :256].view(T, G, 8, 32).permute(0, 3, 1, 2)[rows, byte]  # [T, 4, G, 8]
    bits = groups[..., 256:].view(T, G, 8, 16).permute(0, 3, 1, 2)[rows, byte % 16]
    nibbles, bits = nibbles.permute(0, 2, 3, 1).to(torch.int16), bits.permute(0, 2, 3, 1).to(torch.int16)
    shift = (2 * (byte // 16)).to(torch.int16)[:, None, None, :] + 4 * high  # [T, 1, 1, 4]
    return ((nibbles >> (4 * high)) & 15) | (((bits >> shift) & 3) << 4)


class StackedLinear:
    """Products of different kinds over the same input, their outputs side by side (`source.Stacked`:
    a Q4_K q|k beside a Q6_K v): each part runs on its own groups, where one fused weight would need
    them all as float. `descriptor`: what the C layers read for it (kernels.h's PRODUCT_STACKED)."""

    kind = "stacked"

    def __init__(self, parts: list, kinds: dict[str, int]) -> None:
        self.parts = parts
        self.out_features = sum(p.out_features for p in parts)
        fields = [len(parts)]
        for p in parts:
            q, coef = (p.packed, p.coef) if isinstance(p, Int4Linear) else (p.q, p.scales)
            fields += [kinds[p.kind], q.data_ptr(), coef.data_ptr(), p.out_features]
        self.descriptor = torch.tensor(fields, dtype=torch.int64)  # [1 + 4 parts]: the parts' tensors stay alive in them

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, out]
        return torch.cat([p(x) for p in self.parts], dim=-1)
