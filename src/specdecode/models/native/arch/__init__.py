"""The architectures the native path runs, one module each (`llama`, `qwen2`, `qwen3`, `gemma3`).

An `Architecture` declares what llama.cpp's loader reads for it and the native model computes: its
layers' tensors (required and optional), the tensors outside the layers it may have, the GGUF keys
of its own it implements, whether llama.cpp's converter interleaved its q and k rows, and its
hyper-parameters beyond the ones every architecture reads (`hyper`: `source.Hyper` fields from the
file's keys). Strict reading (`reading`), the GGUF loader (`source.GGUFSource`) and `specdecode
info` read it from here; the model and the C layers take what it produces (a `Hyper`, a layer's
optional tensors, NULL where it has none). So an architecture that is a Llama plus one piece is a
module here plus the kernels that compute the piece.
"""

from __future__ import annotations

from . import gemma3, llama, qwen2, qwen3
from .base import QKV_BIASES, Architecture

ARCHITECTURES: dict[str, Architecture] = {m.ARCHITECTURE.name: m.ARCHITECTURE for m in (llama, qwen2, qwen3, gemma3)}
__all__ = ["ARCHITECTURES", "Architecture", "QKV_BIASES"]
