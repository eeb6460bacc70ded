"""The native backend's small per-token operations (RMSNorm, RoPE with the cache writes, attention
over the cache, the MLP's activation), its 4-bit block products and its LM head in 8-bit blocks.

Each must compute a position exactly as it would be computed alone (the native backend's
exactness). The small ones are dominated by PyTorch's per-op overhead at decode sizes: RMSNorm is
eight ops (~17 us a call, 2.3 ms of a step), and row-invariant attention needs one fused-attention
call per position and layer (~70 us each: ~13 ms of a k = 8 verification). The products are bound
by unpacking quantised weights on 2 cores: the 4-bit one unpacks each weight once for up to 8 rows
(PyTorch's int4 kernel: once per 4 rows) and multiplies with bf16 dot products; the head
(49152 x 576), which a GGUF stores as Q8_0, reads half of bf16's bytes in those 8-bit blocks (1.1 ms
against 2.2 ms for one row here). `kernels.c` does each in one call, a row at a time in a fixed
order. It is compiled once per machine and source with the system C compiler (cached next to the
converted models), linked against the OpenMP runtime PyTorch has already loaded, and called
through ctypes. `TorchKernels` is the same interface in PyTorch ops (no quantised products: then
PyTorch's int4 kernel serves and the head stays bf16), used where no C compiler can build the file:
exact too, only slower.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F

from .hf import cache_root

SOURCE = Path(__file__).with_name("kernels.c")
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]
LANES, MAX_HEAD_DIM = 16, 256  # as in kernels.c


def _cpu_signature() -> str:
    """What -march=native compiles for: the CPU's model and flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        import platform

        return platform.processor() or platform.machine()
    return "\n".join(sorted({line for line in lines if line.startswith(("model name", "flags"))}))


def c_compiler() -> str | None:
    """The C compiler to build with: $CC, else gcc or cc on the PATH; None where there is none."""
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


@lru_cache(maxsize=None)
def load_library() -> ctypes.CDLL | None:
    """kernels.c compiled for this CPU, built on first use; None where no C compiler can build it."""
    compiler = c_compiler()
    if compiler is None:
        return None
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join([compiler, *FLAGS, _cpu_signature()]).encode()).hexdigest()
    path = cache_root() / "kernels" / f"kernels-{key[:16]}.so"
    if not path.exists():
        try:  # built aside, moved in whole: concurrent builds never load a half-written file
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
                built = Path(tmp) / path.name
                subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(built), "-lm"], capture_output=True, check=True)
                os.replace(built, path)
        except (OSError, subprocess.CalledProcessError):  # no compiler, a failed build, an unwritable cache
            return None
    try:
        lib = ctypes.CDLL(str(path))
    except OSError:  # a file that does not load here
        return None
    pointers, i32 = [ctypes.c_void_p] * 4, [ctypes.c_int] * 4
    for name in ("attend_f32", "attend_bf16"):
        getattr(lib, name).restype = ctypes.c_int
        getattr(lib, name).argtypes = pointers + i32 + [ctypes.c_long, ctypes.c_int, ctypes.c_float, ctypes.c_int]
    for name in ("rms_norm_f32", "rms_norm_bf16"):
        getattr(lib, name).restype = None
        getattr(lib, name).argtypes = pointers[:3] + i32[:2] + [ctypes.c_float]
    for name in ("silu_mul_f32", "silu_mul_bf16"):
        getattr(lib, name).restype = None
        getattr(lib, name).argtypes = pointers[:2] + i32[:2]
    for name in ("rope_store_f32", "rope_store_bf16"):
        getattr(lib, name).restype = None
        getattr(lib, name).argtypes = pointers + pointers[:2] + i32 + [ctypes.c_long, ctypes.c_int]
    lib.q8_matmul.restype = None
    lib.q8_matmul.argtypes = pointers + i32
    lib.q4_matmul.restype = ctypes.c_int
    lib.q4_matmul.argtypes = pointers + i32
    lib.q4_available.restype = ctypes.c_int
    lib.q4_available.argtypes = []
    return lib


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class TorchKernels:
    """RMSNorm, RoPE with the cache writes, attention over the cache and the MLP's activation, in
    PyTorch ops."""

    def __init__(self, heads: int, kv_heads: int, head_dim: int) -> None:
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim

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

    def rope_store(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor,
                   values: torch.Tensor, p0: int) -> torch.Tensor:
        """RoPE (rotate-half form) of the new q and k, k and v written into one layer of the cache:
        qkv [T, (H + 2 Hkv) hd], cos/sin [T, hd] of positions p0.., keys/values [Hkv, P, hd] -> q [T, H, hd]."""
        T, (H, Hkv, hd) = qkv.shape[0], (self.heads, self.kv_heads, self.head_dim)
        q, key, value = qkv.split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [T, 1, hd]
        q, key = q.view(T, H, hd), key.view(T, Hkv, hd)
        keys[:, p0 : p0 + T] = (key * cos + _rotate_half(key) * sin).transpose(0, 1)
        values[:, p0 : p0 + T] = value.view(T, Hkv, hd).transpose(0, 1)
        return q * cos + _rotate_half(q) * sin

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, p0: int) -> torch.Tensor:
        """q [T, H, hd] at positions p0.., keys/values [Hkv, P, hd] of one layer -> [T, H hd]: query t
        over the first p0 + t + 1 positions, one fused-attention call per position (4-d inputs take
        PyTorch's fused CPU kernel; the 3-d form fell back to the unfused math path, 2x slower)."""
        H, Hkv, hd = self.heads, self.kv_heads, self.head_dim
        q = q.to(keys.dtype)
        return torch.cat([
            F.scaled_dot_product_attention(q[t].view(1, Hkv, H // Hkv, hd), keys[None, :, : p0 + t + 1],
                                           values[None, :, : p0 + t + 1]).reshape(1, H * hd)
            for t in range(q.shape[0])])


class CKernels(TorchKernels):
    """The same operations through kernels.c."""

    def __init__(self, lib: ctypes.CDLL, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        super().__init__(heads, kv_heads, head_dim)
        suffix = "bf16" if dtype == torch.bfloat16 else "f32"
        self._rms_norm, self._rope_store, self._attend, self._silu_mul = (
            getattr(lib, f"{op}_{suffix}") for op in ("rms_norm", "rope_store", "attend", "silu_mul"))
        self._q8_matmul, self._q4_matmul = lib.q8_matmul, lib.q4_matmul
        self.dtype, self.scale = dtype, head_dim ** -0.5
        # the 4-bit product takes bf16 activations and needs AVX512-BF16's dot product
        self.q4 = dtype == torch.bfloat16 and bool(lib.q4_available())

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        self._rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], eps)
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate_up = gate_up.contiguous()
        T, width = gate_up.shape
        out = torch.empty(T, width // 2, dtype=gate_up.dtype)
        self._silu_mul(gate_up.data_ptr(), out.data_ptr(), T, width // 2)
        return out

    def rope_store(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor,
                   values: torch.Tensor, p0: int) -> torch.Tensor:
        T = qkv.shape[0]
        qkv, cos, sin = qkv.contiguous(), cos.contiguous(), sin.contiguous()
        q = torch.empty(T, self.heads, self.head_dim)  # float32: the attention's input
        self._rope_store(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), q.data_ptr(), keys.data_ptr(),
                         values.data_ptr(), T, self.heads, self.kv_heads, self.head_dim, keys.stride(0), p0)
        return q

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, p0: int) -> torch.Tensor:
        T = q.shape[0]
        qf = q.float().contiguous()  # [T, H, hd]
        out = torch.empty(T, self.heads * self.head_dim, dtype=self.dtype)  # written in the cache's dtype
        if self._attend(qf.data_ptr(), keys.data_ptr(), values.data_ptr(), out.data_ptr(), T, self.heads,
                        self.kv_heads, self.head_dim, keys.stride(0), p0 + 1, self.scale, torch.get_num_threads()):
            raise MemoryError("attention: no memory for one query's scores")
        return out

    def q8_matmul(self, x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """x [T, in] @ W^T for W in Q8_0 blocks laid out as kernels.c's q8_matmul takes them:
        q [out / 16, in, 16] int8, scales [out / 16, in / 32, 16] float32 -> [T, out] float32."""
        x = x.float().contiguous()
        T, (blocks, K, _) = x.shape[0], q.shape
        y = torch.empty(T, blocks * 16)
        self._q8_matmul(x.data_ptr(), q.data_ptr(), scales.data_ptr(), y.data_ptr(), T, K, blocks * 16,
                        torch.get_num_threads())
        return y

    def q4_matmul(self, x: torch.Tensor, q: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
        """x [T, in] bf16 @ W^T for W in Q4_1 groups laid out as kernels.c's q4_matmul takes them:
        q [out / 16, in / 4, 32] uint8, coef [out / 16, in / 32, 2, 16] float32 -> [T, out] bf16."""
        x = x.contiguous()
        T, (blocks, chunks, _) = x.shape[0], q.shape
        y = torch.empty(T, blocks * 16, dtype=torch.bfloat16)
        if self._q4_matmul(x.data_ptr(), q.data_ptr(), coef.data_ptr(), y.data_ptr(), T, chunks * 4, blocks * 16,
                           torch.get_num_threads()):
            raise MemoryError("4-bit product: no memory for the group sums")
        return y


def make_kernels(heads: int, kv_heads: int, head_dim: int, dim: int, dtype: torch.dtype) -> TorchKernels:
    """The C kernels where they serve these shapes and a compiler built them, else PyTorch's."""
    fits = (dim % LANES == 0 and head_dim % (2 * LANES) == 0 and head_dim <= MAX_HEAD_DIM and heads % kv_heads == 0
            and dtype in (torch.bfloat16, torch.float32))
    lib = load_library() if fits else None
    return CKernels(lib, heads, kv_heads, head_dim, dtype) if lib is not None else TorchKernels(heads, kv_heads,
                                                                                                head_dim)
