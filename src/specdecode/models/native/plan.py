"""Which kernel path the native backend runs on this CPU, decided once and shown everywhere.

Paths, best first:
- `avx512`: the C kernels (`csrc/`) built for this CPU (`-march=native`) where it has AVX-512; with
  AVX512-BF16 the activations are bf16 and the 4-bit products use the bf16 dot product.
- `avx2`: built for AVX2 + FMA + F16C (`-march=native -mno-avx512f` on x86, so an AVX-512 host runs
  exactly what an AVX2 host would): float32 activations, 4-bit products unpacked in integer ops.
- `neon`: aarch64 with the dot-product extension (`-march=armv8.2-a+dotprod`; every Apple silicon
  CPU, Graviton 2 and later, Ampere): the integer products on `sdot`, the rest in vector C.
- `portable`: built with no instruction-set flags (SSE2 on x86-64, ARMv8.0's NEON on aarch64): the
  reference the fast paths are tested against.
- `torch`: no C library; PyTorch ops (slower, exact too).

`SPECDECODE_KERNELS=avx512|avx2|neon|portable|torch` (or the CLI's `--kernels`) forces a path: a path
this CPU or compiler cannot run is then an error, never a silent fallback. Without it the best path
is built; if that build fails, the next is tried and the reason is kept in the plan (and warned).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from ...progress import waiting
from ..files import cache_root

if TYPE_CHECKING:  # annotations only: the plan and the library load without PyTorch (the early first token)
    import torch

# The C kernels: every csrc/*.c compiled together into one library; csrc/kernels.h is their interface.
CSRC = Path(__file__).with_name("csrc")
PATHS = ("avx512", "avx2", "neon", "portable", "torch")
COMMON_FLAGS = ["-O3", "-shared", "-fPIC", "-Wno-psabi"]
ENV = "SPECDECODE_KERNELS"


@dataclass(frozen=True)
class KernelPlan:
    """The kernel path in use: `path` (one of PATHS), `isa` (what the built library says it was
    compiled for), `reason` (why this path), `library` (the built file, None for torch)."""

    path: str
    isa: str
    reason: str
    library: str | None = None

    def __str__(self) -> str:
        return f"{self.path} ({self.isa}): {self.reason}"


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux reports them (empty elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _arm() -> bool:
    return platform.machine().lower() in ("aarch64", "arm64")


def runnable_paths() -> list[str]:
    """The paths this CPU can run, best first."""
    flags, x86 = cpu_flags(), platform.machine().lower() in ("x86_64", "amd64")
    paths = []
    if x86 and "avx512f" in flags:
        paths.append("avx512")
    if x86 and {"avx2", "fma", "f16c"} <= flags:
        paths.append("avx2")
    if _arm() and ("asimddp" in flags or platform.system() == "Darwin"):  # every Apple silicon CPU has sdot
        paths.append("neon")
    return paths + ["portable", "torch"]


def c_compiler() -> str | None:
    """The C compiler to build with: $CC, else gcc or cc on the PATH; None where there is none."""
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def path_flags(path: str) -> list[str]:
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    if path == "avx512":
        return ["-march=native"]
    if path == "avx2":
        return ["-march=native", "-mno-avx512f"] if "avx2" in cpu_flags() else ["-mavx2", "-mfma", "-mf16c"]
    if path == "neon":
        return ["-march=armv8.2-a+dotprod"]
    return [] if x86 else ["-march=armv8-a"] if _arm() else ["-march=native"]  # portable: the baseline


class BuildError(RuntimeError):
    pass


def sources() -> list[Path]:
    """The kernels' C files, compiled together (each ISA file's `#if` keeps what the build has)."""
    return sorted(CSRC.glob("*.c"))


def _sources_digest() -> bytes:
    """Every file of csrc (.c and .h) by name and content, for the build's cache key."""
    digest = hashlib.sha256()
    for file in sorted(f for f in CSRC.iterdir() if f.suffix in (".c", ".h")):
        digest.update(file.name.encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.digest()


_ERROR = re.compile(r"([\w.+-]+\.[ch]):\d+(?::\d+)?: (?:fatal )?error")


def _build_failure(compiler: str, path: str, stderr: str) -> BuildError:
    """The error for a failed build, naming the csrc file of the compiler's first error (csrc/ where it
    names none: a link error) and quoting that error and the compiler's last lines."""
    lines = stderr.strip().splitlines()
    first = next((line for line in lines if _ERROR.search(line)), None)
    where = f"{CSRC.name}/{_ERROR.search(first)[1]}" if first else f"{CSRC.name}/"
    shown = ([first] if first and first not in lines[-3:] else []) + lines[-3:]
    return BuildError(f"{compiler} could not build {where} for {path}: {' | '.join(shown)}")


def build(path: str, compiler: str) -> Path:
    """The C kernels (every csrc/*.c) compiled into one library for `path`, built once per machine,
    source and flags, cached next to the converted models (built aside and moved in whole:
    concurrent builds never load half a file)."""
    flags = COMMON_FLAGS + path_flags(path) + ["-pthread"]
    signature = "\n".join(sorted(cpu_flags())) + cpu_name()
    key = hashlib.sha256(_sources_digest() + " ".join([compiler, *flags, signature]).encode()).hexdigest()
    target = cache_root() / "kernels" / f"kernels-{path}-{key[:16]}.so"
    if target.exists():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp, waiting(f"building the {path} kernels", once=True):
            built = Path(tmp) / target.name
            subprocess.run([compiler, *flags, f"-I{CSRC}", *map(str, sources()), "-o", str(built), "-lm"],
                           capture_output=True, text=True, check=True)
            os.replace(built, target)
    except subprocess.CalledProcessError as e:
        raise _build_failure(compiler, path, e.stderr or "") from None
    except OSError as e:
        raise BuildError(f"could not build {CSRC.name}/ for {path} with {compiler}: {e}") from None
    return target


def _expected_isa(path: str) -> tuple[str, ...]:
    return {"avx512": ("avx512-bf16", "avx512"), "avx2": ("avx2-fma",), "neon": ("neon-dotprod",),
            "portable": ("portable", "aarch64")}[path]


class DecodeModel(ctypes.Structure):
    """csrc/kernels.h's decode_model_t: a model's layers (or a run of them) and its shapes, as
    decode_layers reads them; the tensors its pointers address stay alive in `tensors`."""

    _fields_ = [("weights", ctypes.c_void_p), ("kinds", ctypes.c_void_p), ("windows", ctypes.c_void_p),
                *((name, ctypes.c_int32) for name in ("layers", "dim", "heads", "kv_heads", "head_dim", "hidden",
                                                      "gelu")),
                ("eps", ctypes.c_float), ("scale", ctypes.c_float)]

    @classmethod
    def of(cls, weights: torch.Tensor, kinds: torch.Tensor, windows: torch.Tensor | None, *shapes) -> DecodeModel:
        model = cls(weights.data_ptr(), kinds.data_ptr(), None if windows is None else windows.data_ptr(), *shapes)
        model.tensors = (weights, kinds, windows)
        return model

    def layers_between(self, a: int, b: int) -> DecodeModel:
        """Layers a..b-1 alone (the cache given to decode_layers then holds those layers)."""
        weights, kinds, windows = self.tensors
        return DecodeModel.of(weights[a:b], kinds[a:b], None if windows is None else windows[a:b], b - a,
                              *(getattr(self, name) for name, _ in self._fields_[4:]))


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Argument types of the C kernels' functions: csrc/kernels.h is the source of truth for them."""
    p, i32 = ctypes.c_void_p, ctypes.c_int
    lib.kernels_isa.restype, lib.kernels_isa.argtypes = ctypes.c_char_p, []
    for name in ("attend_f32", "attend_bf16"):
        getattr(lib, name).restype = ctypes.c_int
        getattr(lib, name).argtypes = [p] * 4 + [i32] * 4 + [ctypes.c_long, i32, p, i32, ctypes.c_float, i32]
    for name in ("rms_norm_f32", "rms_norm_bf16"):
        getattr(lib, name).restype, getattr(lib, name).argtypes = None, [p] * 3 + [i32] * 2 + [ctypes.c_float]
    for name in ("silu_mul_f32", "silu_mul_bf16", "gelu_mul_f32", "gelu_mul_bf16"):
        getattr(lib, name).restype, getattr(lib, name).argtypes = None, [p] * 2 + [i32] * 2
    for name in ("rope_store_f32", "rope_store_bf16"):
        getattr(lib, name).restype = None
        getattr(lib, name).argtypes = [p] * 6 + [i32] * 4 + [ctypes.c_long, i32]
    for name in ("q8_matmul", "q8q8_matmul", "q6q8_matmul", "q6kq8_matmul", "q4_matmul", "q4f_matmul",
                 "q4q8_matmul", "q5q8_matmul", "q40q8_matmul", "q4kq8_matmul",
                 "q5kq8_matmul"):  # (x, q, coef, y, rows, in, out, threads) -> status
        getattr(lib, name).restype, getattr(lib, name).argtypes = ctypes.c_int, [p] * 4 + [i32] * 4
    lib.f32_matmul.restype, lib.f32_matmul.argtypes = None, [p] * 3 + [i32] * 4
    for name in ("q4_available", "q4q8_vector", "q6kq8_vector", "kernels_pool_workers"):
        getattr(lib, name).restype, getattr(lib, name).argtypes = ctypes.c_int, []
    for name in ("product_kinds", "layer_slots"):
        getattr(lib, name).restype, getattr(lib, name).argtypes = ctypes.c_char_p, []
    lib.decode_model_bytes.restype, lib.decode_model_bytes.argtypes = ctypes.c_int, []
    lib.decode_layers.restype = ctypes.c_int
    lib.decode_layers.argtypes = [p, p, i32, p, i32] + [p] * 4 + [i32]
    if lib.decode_model_bytes() != ctypes.sizeof(DecodeModel):
        raise BuildError(f"the kernels' decode_model_t is {lib.decode_model_bytes()} bytes and kernels.DecodeModel "
                         f"{ctypes.sizeof(DecodeModel)}: csrc/kernels.h and kernels.py disagree")
    return lib


@lru_cache(maxsize=None)
def _load(path: str, compiler: str) -> tuple[ctypes.CDLL, str, str]:
    built = build(path, compiler)
    try:
        lib = _bind(ctypes.CDLL(str(built)))
    except (OSError, AttributeError) as e:
        raise BuildError(f"the {path} build of {CSRC.name}/ does not load here: {e}") from None
    isa = lib.kernels_isa().decode()
    if isa not in _expected_isa(path):
        raise BuildError(f"the {path} build came out as {isa}: this CPU or compiler cannot run the {path} path")
    return lib, isa, str(built)


def requested_path() -> str | None:
    """The path forced by $SPECDECODE_KERNELS, or None; an unknown name is an error."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in PATHS:
        raise ValueError(f"{ENV}={value!r} is not a kernel path; choose one of auto, {', '.join(PATHS)}")
    return value


@lru_cache(maxsize=None)
def _plan(forced: str | None, compiler: str | None) -> tuple[KernelPlan, ctypes.CDLL | None]:
    if forced is not None:
        if forced == "torch":
            return KernelPlan("torch", "pytorch", f"forced by {ENV}"), None
        if compiler is None:
            raise BuildError(f"{ENV}={forced} needs a C compiler, and none was found (set CC)")
        if forced not in runnable_paths():
            raise BuildError(f"{ENV}={forced}: this CPU ({cpu_name()}) cannot run the {forced} path; it runs "
                             f"{', '.join(runnable_paths())}")
        lib, isa, built = _load(forced, compiler)
        return KernelPlan(forced, isa, f"forced by {ENV}", built), lib
    failures = []
    for path in runnable_paths():
        if path == "torch":
            break
        if compiler is None:
            failures.append("no C compiler found (set CC)")
            break
        try:
            lib, isa, built = _load(path, compiler)
        except BuildError as e:
            failures.append(str(e))
            continue
        reason = "the best path this CPU runs" if not failures else f"fallback: {'; '.join(failures)}"
        return KernelPlan(path, isa, reason, built), lib
    reason = f"fallback: {'; '.join(failures)}"
    warnings.warn(f"native kernels: running PyTorch ops, slower ({reason})", RuntimeWarning, stacklevel=3)
    return KernelPlan("torch", "pytorch", reason), None


def kernel_plan() -> tuple[KernelPlan, ctypes.CDLL | None]:
    """The plan for this process (from $SPECDECODE_KERNELS and $CC) and its library (None: torch)."""
    plan, lib = _plan(requested_path(), c_compiler())
    if plan.reason.startswith("fallback") and plan.path != "torch":
        warnings.warn(f"native kernels: {plan}", RuntimeWarning, stacklevel=2)
    return plan, lib


def clear() -> None:
    """Forget built plans (after changing $CC, $SPECDECODE_KERNELS or the cache directory)."""
    _plan.cache_clear()
    _load.cache_clear()
