"""One entry point for every backend: transformers ("hf"), llama.cpp, or the native PyTorch Llama.

"auto": transformers for anything but a Llama-family model on the CPU; for such a model the native
backend, or, where the model is a GGUF file and llama-cpp-python is installed, whichever of the two
is measured faster on this machine (`choose.py`; `model.backend_choice` says why)."""

from __future__ import annotations

from .. import defaults

import gc
import json
from pathlib import Path

from ..progress import waiting

BACKENDS = ("auto", "hf", "llama.cpp", "native")


def resolve_backend(path: str | None, backend: str = "auto", device: str | None = None) -> str:
    """The concrete backend "auto" stands for on this model and device: on the CPU the native backend
    for an architecture it runs; for any other GGUF file llama.cpp where it is installed; else
    transformers."""
    return backend if backend != "auto" else auto_backend(path, device)[0]


def auto_backend(path: str | None, device: str | None = None) -> tuple[str, str]:
    """(the backend --backend auto picks before any measurement, why) for this model and device."""
    from .default import default_target_path
    from .draftnet import is_draftnet
    from .files import is_gguf
    from .native.source import native_reading

    path = Path(path or default_target_path()).expanduser()
    if is_draftnet(path) or not path.exists():
        return "hf", "--backend auto"  # a draft network loads the same way whatever the backend; a bad path errors there
    import torch

    on_cpu = device == "cpu" or (device is None and not torch.cuda.is_available())
    if is_gguf(path):
        architecture, refused = native_reading(path)
        if architecture is not None and refused is None and on_cpu:
            from .native.arch import ARCHITECTURES

            summary = ARCHITECTURES[architecture].summary
            return "native", f"--backend auto: a {architecture} GGUF on the CPU" + (f" ({summary})" if summary else "")
        if on_cpu and _llamacpp_runs(path):
            why = refused or "the native reader cannot read its header"
            return "llama.cpp", f"--backend auto: llama.cpp, since the native backend refuses it: {why}"
        return "hf", "--backend auto"
    config = path / "config.json"
    model_type = json.loads(config.read_text()).get("model_type") if config.exists() else None
    if model_type == "llama" and on_cpu:
        return "native", "--backend auto: a Llama directory on the CPU"
    return "hf", "--backend auto"


def load_model(path: str | None = None, backend: str = "auto", dtype: str = "auto", device: str | None = None,
               threads: int | None = None, n_ctx: int = defaults.CONTEXT, choose_by_speed: bool = True,
               measure_again: bool = False):
    """Load a model by path (None: the embedded default target) on the chosen backend.

    `choose_by_speed` (with backend and dtype "auto"): between the native backend and llama.cpp, the
    one measured faster here (`choose.py`); `measure_again` ignores a cached choice.

    dtype "auto": on the native backend 4-bit products where the weights are 4-bit groups (a Q4_1
    GGUF, see `native.Int4Linear`), else bf16; bf16 on transformers; llama.cpp runs the GGUF's own."""
    from ..checks import check_device
    from .draftnet import is_draftnet
    from .files import existing_model_path

    check_device(device)  # before anything slow: a device this torch cannot use, a path that is not a model
    if not isinstance(n_ctx, int) or n_ctx < 1:
        raise ValueError(f"the context (--ctx-size, n_ctx) must be a whole number of positions >= 1, got {n_ctx!r}")
    if path is not None and not is_draftnet(path):
        existing_model_path(path)
    with waiting(f"loading {Path(path).name if path else 'the embedded model'}"):
        model = _load(path, backend, dtype, device, threads, n_ctx, choose_by_speed, measure_again)
    settle_garbage()
    return model


def settle_garbage() -> None:
    """Collect once and freeze what survives (a loaded model's many Python objects), so that later
    collections, set off by a drafter's or the decode loop's allocations, scan only what came after
    (a full collection over a loaded model's objects costs many times a drafter's own work)."""
    gc.collect()
    gc.freeze()


def _load(path: str | None, backend: str, dtype: str, device: str | None, threads: int | None, n_ctx: int,
          choose_by_speed: bool, measure_again: bool):
    from .default import default_target_path

    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    chosen_by_measurement = choose_by_speed and backend == "auto" and dtype == "auto"
    backend = resolve_backend(path, backend, device)
    path = path or default_target_path()
    if chosen_by_measurement and backend == "native" and _llamacpp_runs(path):
        return _measured_choice(Path(path).expanduser(), threads, n_ctx, measure_again)
    from .draftnet import is_draftnet, load_draftnet

    # A trained draft network runs on PyTorch whatever the backend, its products on int8 copies of its
    # weights on a CPU (DraftNetModel chooses the precision, not --dtype).
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
        return load_native(path, dtype=dtype, max_positions=n_ctx, n_threads=threads)
    if dtype == "int4":
        raise ValueError("--dtype int4 runs on the native backend only (--backend native, a Llama-family model "
                         "on the CPU)")
    from .hf import load_hf

    return load_hf(path, dtype="bfloat16" if dtype == "auto" else dtype, device=device)


def _llamacpp_runs(path) -> bool:
    """Whether llama.cpp can run this model here: a .gguf file, llama-cpp-python installed."""
    from importlib.util import find_spec

    from .files import is_gguf

    return is_gguf(Path(path)) and find_spec("llama_cpp") is not None


def _measured_choice(path: Path, threads: int | None, n_ctx: int, measure_again: bool = False):
    """The native backend or llama.cpp, whichever is measured faster here (cached per machine)."""
    from importlib.metadata import version

    from .choose import choice_path, choose
    from .native import load_native
    from .native.plan import kernel_plan
    from .native.threads import cores
    from .llamacpp import LlamaCppModel

    threads = cores(threads)
    plan, _ = kernel_plan()
    signature = f"{plan.path}:{Path(plan.library).name if plan.library else '-'}|llama_cpp {version('llama_cpp_python')}"
    loaders = {"native": lambda: load_native(path, max_positions=n_ctx, n_threads=threads),
               "llama.cpp": lambda: LlamaCppModel(path, n_threads=threads, n_ctx=n_ctx)}
    choice, model = choose(path, threads, signature, loaders, refresh=measure_again)
    model.backend_choice = choice
    model.backend_choice_file = choice_path(path, threads, signature)  # what a first-token snapshot checks
    return model
