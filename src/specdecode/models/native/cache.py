"""The native backend's static KV cache: preallocated, trimmed by moving a length counter."""

from __future__ import annotations

import torch

from ..base import check_trim


class NativeCache:
    """Preallocated keys and values; the first `length` positions are valid."""

    def __init__(self, layers: int, kv_heads: int, positions: int, head_dim: int, dtype: torch.dtype) -> None:
        # never read before written: positions past `length` are not attended to
        self.k = torch.empty(layers, kv_heads, positions, head_dim, dtype=dtype)
        self.v = torch.empty(layers, kv_heads, positions, head_dim, dtype=dtype)
        self.layer_k, self.layer_v = self.k.unbind(0), self.v.unbind(0)  # per-layer views, made once
        self.length = 0

    def __len__(self) -> int:
        return self.length

    def trim(self, n: int) -> None:
        check_trim(n, self.length)
        self.length -= n
