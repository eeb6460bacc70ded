"""Prompt prefix reuse: the keys and values of recent prompts, copied into a new request's cache
for the longest prefix it shares with one of them (a chat template's system turn, a repeated
prompt), so only the rest of its prompt is computed.

Exact, not approximate: it is used only where the target computes prompt rows row-invariantly
(`row_invariant_prompts`), where a position's keys and values depend on the tokens up to it and
nothing else, so the copied entries are bit for bit the ones the request would compute itself.
Bounded in memory: least recently used prompts are dropped past `max_bytes`.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import torch


class PrefixCache:
    """Keys and values of recent prompts (native caches: k, v [layers, Hkv, positions, hd]), and their
    final-norm features where the cache kept them (a feature draft reads them: `drafters.eagle`)."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        if not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes must be an integer >= 0, got {max_bytes!r}")
        self.max_bytes = max_bytes
        # prompt -> (its ids, k, v, features or None, their bytes)
        self._entries: OrderedDict[tuple[int, ...], tuple] = OrderedDict()
        self.nbytes = 0
        self.reused_tokens = 0  # prompt tokens not computed, over the cache's life

    def __len__(self) -> int:
        return len(self._entries)

    def fill(self, prompt: Sequence[int], cache) -> int:
        """Copy the longest stored prefix of `prompt` (all but its last token at most: the request
        still needs its logits) into the empty `cache`; returns its length (0: nothing shared)."""
        if len(cache) or not self._entries or len(prompt) < 2:
            return 0
        ids = torch.tensor(prompt[:-1])
        wanted = getattr(cache, "features", None)
        best, best_key = 0, None
        for key, (tokens, _, _, features, _) in self._entries.items():
            # not kept with this entry, or others than the cache keeps (another draft's layers)
            if wanted is not None and (features is None or features.shape[1] != wanted.shape[1]):
                continue
            n = min(len(tokens), len(ids))
            same = tokens[:n] == ids[:n]
            shared = n if bool(same.all()) else int(same.to(torch.uint8).argmin())
            if shared > best:
                best, best_key = shared, key
        if best_key is None:
            return 0
        _, k, v, features, _ = self._entries[best_key]
        self._entries.move_to_end(best_key)
        cache.k[:, :, :best] = k[:, :, :best]
        cache.v[:, :, :best] = v[:, :, :best]
        if wanted is not None:
            cache.features[:best] = features[:best]
        cache.length = best
        self.reused_tokens += best
        return best

    def store(self, prompt: Sequence[int], cache) -> None:
        """Keep the keys and values of `prompt`, which `cache` holds (its first len(prompt) positions)."""
        key = tuple(prompt)
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        n = len(key)
        parts = [cache.k[:, :, :n], cache.v[:, :, :n]]
        if getattr(cache, "features", None) is not None:
            parts.append(cache.features[:n])
        size = sum(part.nbytes for part in parts)  # before copying anything
        if size > self.max_bytes or len(cache) < n:
            return
        k, v, *features = (part.clone() for part in parts)
        self._entries[key] = (torch.tensor(key), k, v, features[0] if features else None, size)
        self.nbytes += size
        while self.nbytes > self.max_bytes:
            self.nbytes -= self._entries.popitem(last=False)[1][-1]
