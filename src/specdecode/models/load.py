"""One entry point for every backend: transformers ("hf"), llama.cpp, or the native PyTorch Llama;
"auto" picks native for a Llama-family model on the CPU and transformers otherwise."""

from __future__ import annotations

import json
from pathlib import Path

BACKENDS = ("auto", "hf", "llama.cpp", "native")


def resolve_backend(path: str | None, backend: str = "auto", device: str | None = None) -> str:
    """The concrete backend "auto" stands for on this model and device."""
    if backend != "auto":
        return backend
    from .default import default_target_path
    from .draftnet import is_draftnet
    from .hf import convert_gguf

    path = Path(path or default_target_path()).expanduser()
    if is_draftnet(path) or not path.exists():
        return "hf"  # a draft network loads the same way whatever the backend; a bad path errors there
    directory = convert_gguf(path) if path.is_file() and path.suffix == ".gguf" else path
    config = directory / "config.json"
    model_type = json.loads(config.read_text()).get("model_type") if config.exists() else None
    import torch

    on_cpu = device == "cpu" or (device is None and not torch.cuda.is_available())
    return "native" if model_type == "llama" and on_cpu else "hf"


def load_model(path: str | None = None, backend: str = "auto", dtype: str = "auto", device: str | None = None,
               threads: int | None = None, n_ctx: int = 4096):
    """Load a model by path (None: the embedded default target) on the chosen backend.

    dtype "auto": on the native backend 4-bit products where the weights are 4-bit groups (a Q4_1
    GGUF, see `native.Int4Linear`), else bf16; bf16 on transformers; llama.cpp runs the GGUF's own."""
    from .default import default_target_path

    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    backend = resolve_backend(path, backend, device)
    path = path or default_target_path()
    from .draftnet import is_draftnet, load_draftnet

    # A trained draft network runs on PyTorch whatever the backend, in float32 (its wrapper keeps
    # only the output head in bf16 on a CPU: the precision is chosen there, not by --dtype).
    draftnet = is_draftnet(path)
    if backend == "llama.cpp" and not draftnet:
        from .llamacpp import LlamaCppModel

        return LlamaCppModel(path, n_threads=threads, n_ctx=n_ctx)
    import torch

    if threads:
        torch.set_num_threads(threads)
    if draftnet:
        return load_draftnet(path, device=device)
    if backend == "native":
        from .native import load_native

        if device not in (None, "cpu"):
            raise ValueError(f"the native backend runs on the CPU; got --device {device}")
        return load_native(path, dtype=dtype, max_positions=n_ctx)
    if dtype == "int4":
        raise ValueError("--dtype int4 runs on the native backend only (--backend native, a Llama-family model "
                         "on the CPU)")
    from .hf import load_hf

    return load_hf(path, dtype="bfloat16" if dtype == "auto" else dtype, device=device)
