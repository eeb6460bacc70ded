"""One entry point for every backend: transformers ("hf") or llama.cpp."""

from __future__ import annotations

BACKENDS = ("hf", "llama.cpp")


def load_model(path: str | None = None, backend: str = "hf", dtype: str = "bfloat16", device: str | None = None,
               threads: int | None = None, n_ctx: int = 4096):
    """Load a model by path (None: the embedded default target) on the chosen backend."""
    from .default import default_target_path

    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    path = path or default_target_path()
    from .draftnet import is_draftnet, load_draftnet

    # A trained draft network runs on PyTorch whatever the backend, in float32 (its wrapper keeps
    # only the output head in bf16 on a CPU: the precision is chosen there, not by --dtype).
    draftnet = is_draftnet(path)
    if backend == "llama.cpp" and not draftnet:
        from .llamacpp import LlamaCppModel

        return LlamaCppModel(path, n_threads=threads, n_ctx=n_ctx)
    import torch

    from .hf import load_hf

    if threads:
        torch.set_num_threads(threads)
    return load_draftnet(path, device=device) if draftnet else load_hf(path, dtype=dtype, device=device)
