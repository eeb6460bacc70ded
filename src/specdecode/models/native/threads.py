"""Who gets the cores during a decode step: the C kernels' thread pool, not PyTorch's.

A decode step where the C kernels run every layer (`decode_layers`) and the LM head leaves PyTorch
only small ops, and a few over the whole vocabulary (the argmax, the sampling). Those go parallel
on PyTorch's OpenMP team, whose workers then spin on the cores the kernels' own pool needs next
(`benchmarks/results/thread_placement.md`). So such a model, once loaded, runs PyTorch's ops on one
thread and keeps the thread count it was given for its kernels; a forward that does run PyTorch's
products (a prefill through the bf16 copies) lends the threads back for its duration.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

_lowered_from: int | None = None  # PyTorch's thread count before a native model took the cores


def cores(asked: int | None = None) -> int:
    """The threads a native model's kernels run on: `asked`, else PyTorch's count, or where a native
    model lowered it to one (and nobody has changed it since), the count it had before."""
    if asked is not None and asked < 1:
        raise ValueError(f"threads must be >= 1, got {asked}")
    current = torch.get_num_threads()
    return asked or (_lowered_from if _lowered_from is not None and current == 1 else current)


def hand_to_kernels() -> None:
    """PyTorch's intra-op threads down to one (remembering the count they had)."""
    global _lowered_from
    _lowered_from = cores()
    torch.set_num_threads(1)


@contextmanager
def lent_to_torch(threads: int):
    """PyTorch's ops on `threads` threads inside, one again after."""
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(1)
