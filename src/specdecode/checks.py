"""Checks of the values a caller hands to the library, each written once.

The decode loop, the verifier, the CLI and the server call these where a value enters; the CLI
calls them before loading any model, so a bad option costs no loading time.
"""

from __future__ import annotations

import re

from typing import Sequence


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def option_name(field: str) -> str:
    """A setting as the command line spells it: max_body_bytes is --max-body-bytes."""
    return "--" + field.replace("_", "-")


def check_positive_settings(settings, *fields: str) -> None:
    """Each of these attributes of `settings` (parsed arguments, an options object) that is set (not
    None) is an integer >= 1; else ValueError naming the first that is not, as the command line
    spells it."""
    for field in fields:
        if getattr(settings, field) is not None:
            check_positive(option_name(field), getattr(settings, field))


def check_gamma(gamma, name: str = "gamma") -> int:
    """gamma: draft tokens per iteration, an integer >= 0 (0 = plain decoding)."""
    if not _is_int(gamma) or gamma < 0:
        raise ValueError(f"{name} must be an integer >= 0 or 'auto', got {gamma!r}")
    return gamma


def check_lenience(lenience, name: str = "lenience") -> float:
    """lenience l in (0, 1]: accept when l*q(x) <= p(x); 1 is exact."""
    if isinstance(lenience, bool) or not isinstance(lenience, (int, float)) or not (0.0 < lenience <= 1.0):
        raise ValueError(f"{name} must be in (0, 1] (1 = exact), got {lenience!r}")
    return float(lenience)


def check_max_new_tokens(max_new_tokens, name: str = "max_new_tokens") -> int:
    return check_positive(name, max_new_tokens)


def check_queue_size(name: str, value) -> int:
    """How many requests may wait behind the running one: an integer >= 0."""
    if not _is_int(value) or value < 0:
        raise ValueError(f"{name} must be >= 0 (an integer), got {value!r}")
    return value


def check_positive(name: str, value) -> int:
    """An integer setting that must be >= 1 (thread counts, max_gamma, repeats, ...)."""
    if not _is_int(value) or value < 1:
        raise ValueError(f"{name} must be >= 1 (an integer), got {value!r}")
    return value


def check_prompt_text(prompt) -> str:
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("the prompt is empty")
    return prompt


def check_prompt_ids(prompt: Sequence[int]) -> None:
    if len(prompt) == 0:
        raise ValueError("the prompt has no tokens; at least one is needed to condition on")


def check_stop(stop: Sequence[str]) -> tuple[str, ...]:
    if isinstance(stop, str) or any(not isinstance(s, str) or not s for s in stop):
        raise ValueError("stop strings must be a list of non-empty strings")
    return tuple(stop)



MAX_TOP_LOGPROBS = 20  # alternatives a token's log-probability may list (OpenAI's limit)


def check_logprobs(logprobs: int | None) -> int | None:
    """How many alternatives each token's log-probability lists (0..MAX_TOP_LOGPROBS), or None for none."""
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)
                                 or not 0 <= logprobs <= MAX_TOP_LOGPROBS):
        raise ValueError(f"logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}] or None, got {logprobs!r}")
    return logprobs


def check_device(device: str | None) -> None:
    """--device: cpu or cuda (cuda:N), and cuda only where this torch can use it."""
    if device in (None, "cpu"):
        return
    if not isinstance(device, str) or not re.fullmatch(r"cuda(:\d+)?", device):
        raise ValueError(f"--device must be cpu or cuda (cuda:N for one of several), got {device!r}")
    import torch

    if not torch.cuda.is_available():
        why = "has no CUDA (it is the CPU build)" if torch.version.cuda is None else "finds no CUDA device here"
        raise ValueError(f"--device {device}: torch {torch.__version__} {why}; use --device cpu")
