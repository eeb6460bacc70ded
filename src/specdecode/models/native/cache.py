"""The native backend's static KV cache: preallocated, trimmed by moving a length counter."""

from __future__ import annotations

import torch

from ..base import check_trim


class NativeCache:
    """Preallocated keys and values for `positions` positions (its capacity, at most the model's
    context); the first `length` are valid."""

    def __init__(self, layers: int, kv_heads: int, positions: int, head_dim: int, dtype: torch.dtype) -> None:
        self.positions = positions
        # never read before written: positions past `length` are not attended to
        self.k = torch.empty(layers, kv_heads, positions, head_dim, dtype=dtype)
        self.v = torch.empty(layers, kv_heads, positions, head_dim, dtype=dtype)
        self.layer_k, self.layer_v = self.k.unbind(0), self.v.unbind(0)  # per-layer views, made once
        self.length = 0
        # [positions, (len(feature_layers) + 1) D]: at each cached position, the residual stream after
        # each of `feature_layers` layers, then the model's final-norm output, where a feature draft
        # (`drafters.eagle`) asked for them with `keep_features`; None otherwise
        self.features: torch.Tensor | None = None
        self.feature_layers: tuple[int, ...] = ()

    def keep_features(self, dim: int, layers: tuple[int, ...] = (), dtype: torch.dtype = torch.float32) -> None:
        """From now on the model also stores each new position's features in `features`: its residual
        stream after each of the first `layers` layers (EAGLE-3's low and middle features), then its
        final-norm output. A cache keeps one set: asking again for another is refused."""
        layers = tuple(int(n) for n in layers)
        if self.features is None:
            self.features = torch.empty(self.positions, (len(layers) + 1) * dim, dtype=dtype)
            self.feature_layers = layers
        elif layers != self.feature_layers or self.features.shape[1] != (len(layers) + 1) * dim:
            raise ValueError(f"this cache keeps the features of layers {self.feature_layers} and the final norm; "
                             f"a draft asked for layers {layers}")

    def __len__(self) -> int:
        return self.length

    @property
    def nbytes(self) -> int:
        """The bytes its keys and values take (allocated whole, whatever `length` is)."""
        return self.k.nbytes + self.v.nbytes

    def trim(self, n: int) -> None:
        check_trim(n, self.length)
        self.length -= n

    def keep(self, start: int, slots: list[int]) -> None:
        """After a draft tree's forward: keep the nodes in `slots` (a root-to-leaf path, slots >= start)
        as positions start.., and drop the rest."""
        if not all(start <= a < self.length for a in slots) or slots != sorted(set(slots)):
            raise ValueError(f"cannot keep slots {slots} of {self.length} positions from {start}")
        if slots != list(range(start, start + len(slots))):
            index = torch.tensor(slots)
            self.k[:, :, start : start + len(slots)] = self.k[:, :, index]
            self.v[:, :, start : start + len(slots)] = self.v[:, :, index]
            if self.features is not None:
                self.features[start : start + len(slots)] = self.features[index]
        self.length = start + len(slots)
