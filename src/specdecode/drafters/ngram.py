"""N-gram drafters: unigram, bigram and k-gram models with real draft distributions q (paper,
section 4: "from n-grams to ..."; it measured alpha ~0.2 for a bigram on translation).

q(x | context) interpolates the maximum-likelihood estimates of every order down to a uniform
floor (Jelinek-Mercer smoothing), so q is a full distribution and speculative sampling stays
exact at any temperature. Counts come from a token corpus (`specdecode ngram fit`), can be saved
and loaded as a small .npz file, and can grow online from the running context.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch

from ..models.base import Vocabulary
from ..sampling import SamplingParams, sample
from .base import BaseDrafter, Draft
from .tree import sample_tree


class NgramDrafter(BaseDrafter):
    """A k-gram model over token ids (order 1 = unigram, 2 = bigram, ...)."""

    def __init__(self, vocab: Vocabulary, order: int = 2, weights: Sequence[float] | None = None,
                 uniform: float = 1e-3, online: bool = False, trees: bool = False, width: int = 3) -> None:
        if order < 1:
            raise ValueError(f"order must be >= 1, got {order}")
        if not (0.0 < uniform < 1.0):
            raise ValueError(f"uniform weight must be in (0, 1), got {uniform}")
        self.vocab = vocab
        self.order = order
        # Interpolation weights, highest order first; renormalised to share 1 - uniform.
        weights = list(weights) if weights is not None else [2.0 ** -(i) for i in range(order)]
        if len(weights) != order or any(w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(f"need {order} non-negative weights (highest order first), got {weights}")
        total = sum(weights)
        self.weights = [(1 - uniform) * w / total for w in weights]
        self.uniform = uniform
        self.online = online
        if trees and width < 1:
            raise ValueError(f"a draft tree needs a width >= 1, got {width}")
        # trees: `width` children a node, sampled from q (their size is planned before drafting)
        self.proposes_trees = self.samples_trees = trees
        self.width = width
        # counts[n][context tuple of length n] -> Counter(next token); n = 0..order-1
        self.counts: list[dict[tuple[int, ...], Counter]] = [defaultdict(Counter) for _ in range(order)]
        # (n, context) -> (next-token ids, their relative frequencies), built from counts when first
        # read and dropped when they change: the unigram's alone holds thousands of ids
        self._estimates: dict[tuple[int, tuple[int, ...]], tuple[torch.Tensor, torch.Tensor]] = {}
        self._counted = 0  # context tokens already added online
        self.params = SamplingParams()
        self.generator = None

    # -- fitting -----------------------------------------------------------------------------
    def fit(self, sequences: Iterable[Sequence[int]]) -> "NgramDrafter":
        for seq in sequences:
            self._add(list(seq), 0)
        return self

    def _add(self, seq: list[int], start: int) -> None:
        """Count every token of seq from index `start` on, under each context length."""
        for i in range(start, len(seq)):
            if not (0 <= seq[i] < self.vocab.size):
                raise ValueError(f"token id {seq[i]} is outside the vocabulary ({self.vocab.size} ids)")
            for n in range(self.order):
                if i - n >= 0:
                    key = tuple(seq[i - n : i])
                    self.counts[n][key][seq[i]] += 1
                    self._estimates.pop((n, key), None)

    # -- the draft distribution --------------------------------------------------------------
    def distribution(self, context: Sequence[int]) -> torch.Tensor:
        """q(. | context) [V]: interpolated estimates of every order plus the uniform floor."""
        q = torch.full((self.vocab.size,), self.uniform / self.vocab.size)
        missing = 0.0
        for n in range(self.order - 1, -1, -1):
            weight = self.weights[self.order - 1 - n]
            key = tuple(context[len(context) - n :]) if n else ()
            counter = self.counts[n].get(key) if len(context) >= n else None
            if not counter:
                missing += weight  # unseen context: its weight goes to the lower orders
                continue
            ids, freq = self._estimate(n, key, counter)
            q.index_add_(0, ids, (weight + missing) * freq)
            missing = 0.0
        if missing:
            q += missing / self.vocab.size
        return q

    def _estimate(self, n: int, key: tuple[int, ...], counter: Counter) -> tuple[torch.Tensor, torch.Tensor]:
        """The maximum-likelihood estimate after `key` (order n): ids [k] and frequencies [k] summing to 1."""
        found = self._estimates.get((n, key))
        if found is None:
            freq = torch.tensor(list(counter.values()), dtype=torch.float32)
            found = self._estimates[(n, key)] = (torch.tensor(list(counter.keys())), freq / freq.sum())
        return found

    def _q(self, context: Sequence[int]) -> torch.Tensor:
        """The draft distribution under the sampling settings, the same transform as p: [V]."""
        return self.params.probs(self.distribution(context).log())

    # -- drafter protocol --------------------------------------------------------------------
    def reset(self, params: SamplingParams, generator: torch.Generator | None) -> None:
        self.params, self.generator = params, generator
        self._counted = 0

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        context = list(context)
        if self.online and len(context) > self._counted:
            self._add(context, self._counted)
            self._counted = len(context)
        if self.proposes_trees:
            return sample_tree(self._q, context, gamma, self.width, self.generator)
        tokens, probs = [], []
        for _ in range(gamma):
            q = self._q(context).unsqueeze(0)  # [1, V]
            x = sample(q, self.generator)  # [1]
            tokens.append(x)
            probs.append(q)
            context.append(int(x))
        if not tokens:
            return Draft(torch.empty(1, 0, dtype=torch.long), torch.empty(1, 0, self.vocab.size))
        return Draft(torch.stack(tokens, dim=1), torch.stack(probs, dim=1))  # [1, g], [1, g, V]

    def accept(self, num_accepted: int) -> None:
        pass  # stateless between calls; online counts are taken from the context itself

    # -- storage -----------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """A compact .npz: one (context..., next, count) table per order, plus the settings."""
        arrays = {}
        for n, table in enumerate(self.counts):
            rows = [(*ctx, nxt, c) for ctx, counter in table.items() for nxt, c in counter.items()]
            arrays[f"order{n}"] = np.array(rows, dtype=np.int64).reshape(-1, n + 2)
        meta = dict(order=self.order, weights=self.weights, uniform=self.uniform, vocab_name=self.vocab.name,
                    vocab_size=self.vocab.size, vocab_fingerprint=self.vocab.fingerprint)
        path = Path(path)
        np.savez_compressed(path, meta=np.array(json.dumps(meta)), **arrays)
        return path if path.suffix == ".npz" else path.with_suffix(path.suffix + ".npz")

    @classmethod
    def load(cls, path: str | Path, online: bool = False, trees: bool = False) -> "NgramDrafter":
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"n-gram file {str(path)!r} does not exist")
        try:
            data = np.load(path)
            meta = json.loads(str(data["meta"]))
        except (OSError, ValueError, KeyError) as err:
            raise ValueError(f"{str(path)!r} is not an n-gram file written by `specdecode ngram fit` ({err})") from None
        vocab = Vocabulary(meta["vocab_name"], meta["vocab_size"], meta["vocab_fingerprint"])
        total = 1 - meta["uniform"]
        drafter = cls(vocab, meta["order"], [w / total for w in meta["weights"]], meta["uniform"], online, trees)
        for n in range(meta["order"]):
            for row in data[f"order{n}"]:
                drafter.counts[n][tuple(int(t) for t in row[:n])][int(row[n])] = int(row[n + 1])
        return drafter
