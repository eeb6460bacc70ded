"""The model protocol shared by targets and drafts, and the vocabulary identity check.

A model appends new positions to a cache it owns and returns logits for them. Rolling back
after a rejection is `cache.trim(n)`: a slice, never a recomputation of the prefix. A model
whose cache cannot be trimmed is refused when its cache is made, not silently recomputed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields
from typing import Protocol, Sequence, runtime_checkable

import torch


class Cache(Protocol):
    def __len__(self) -> int:
        """Number of positions held."""

    def trim(self, n: int) -> None:
        """Drop the last n positions."""


@dataclass(frozen=True)
class Vocabulary:
    """What makes two models' token ids mean the same thing."""

    name: str  # human-readable, e.g. the tokenizer's model name
    size: int  # number of token ids the tokenizer defines
    fingerprint: str  # hash of the token -> id mapping

    @classmethod
    def from_tokens(cls, name: str, token_to_id: dict[str, int]) -> "Vocabulary":
        digest = hashlib.sha256()
        for token, idx in sorted(token_to_id.items(), key=lambda item: item[1]):
            digest.update(f"{idx}\t{token}\n".encode("utf-8", "surrogatepass"))
        return cls(name=name, size=len(token_to_id), fingerprint=digest.hexdigest()[:16])

    def __str__(self) -> str:
        return f"{self.name} ({self.size} tokens, {self.fingerprint})"


class VocabularyMismatch(ValueError):
    def __init__(self, target: Vocabulary, draft: Vocabulary):
        super().__init__(
            f"draft and target use different vocabularies: target vocabulary {target}, "
            f"draft vocabulary {draft}. Speculative decoding needs the draft to propose the "
            f"target's own token ids; pick a draft with the target's tokenizer"
        )


@runtime_checkable
class Model(Protocol):
    name: str  # for messages, profiles and caches
    vocab: Vocabulary
    eos_token_ids: frozenset[int]
    max_positions: int | None
    device: torch.device | str  # where its logits live; sampling and verification follow them
    tokenizer: object  # a transformers tokenizer (text in and out, chat template); None for a bare model
    # optional: the attributes `Capabilities` lists, and forward_batch(calls) (see `forward_batch`)

    def new_cache(self) -> Cache:
        ...

    def forward(self, tokens: torch.Tensor, cache: Cache, num_logits: int | None = None) -> torch.Tensor:
        """tokens [B, T] -> logits [B, T, V] (or only the last num_logits positions), float32, on
        `device`. Appends the T positions to `cache`.
        """


@dataclass(frozen=True)
class Capabilities:
    """What a model can do beyond the protocol. A backend declares each as a class attribute of the
    same name (NativeLlama declares them all); one it does not declare, it lacks. `capabilities`
    reads them, so the loop and the batch ask here rather than probing the model."""

    supports_trees: bool = False  # forward(..., parents=...) verifies a draft tree in one call
    row_invariant_prompts: bool = False  # prompt rows computed alone: pieces may share other requests' forwards
    sized_caches: bool = False  # new_cache(positions=n) sizes a cache to one request (a NativeCache)
    PREFILL_CHUNK: int | None = None  # a prompt may be fed in pieces of this many tokens (forward(prefill=True))


def capabilities(model) -> Capabilities:
    """The capabilities `model` declares (see `Capabilities`)."""
    return Capabilities(**{f.name: getattr(model, f.name, f.default) for f in fields(Capabilities)})


def request_cache(model, positions: int) -> Cache:
    """A cache for one request of `positions` positions: sized to it (at most the context) where the
    model sizes caches (`sized_caches`), else the model's own."""
    if not capabilities(model).sized_caches:
        return model.new_cache()
    return model.new_cache(positions=min(positions, model.max_positions) if model.max_positions else positions)


@dataclass
class ForwardCall:
    """One request's share of a batched forward: what `target.forward` would take alone."""

    tokens: torch.Tensor  # [1, T]
    cache: object
    num_logits: int
    parents: list[int] | None = None  # a draft tree (see NativeLlama.forward)


def forward_batch(target, calls: Sequence[ForwardCall]) -> list[torch.Tensor]:
    """Each call's logits [1, num_logits, V]: in one ragged forward where the target has
    `forward_batch` (its rows share the weights' reads), else one forward per call."""
    if hasattr(target, "forward_batch"):
        return target.forward_batch(calls)
    return [target.forward(c.tokens, c.cache, num_logits=c.num_logits,
                           **({} if c.parents is None else {"parents": c.parents})) for c in calls]


def check_same_vocab(target: Vocabulary, draft: Vocabulary) -> None:
    if target.fingerprint != draft.fingerprint:
        raise VocabularyMismatch(target, draft)


DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32,
          "float16": torch.float16, "fp16": torch.float16}


def check_trim(n: int, length: int) -> None:
    """Every cache's `trim(n)` refuses the same way: n in 0..length."""
    if n < 0 or n > length:
        raise ValueError(f"cannot trim {n} positions from a cache holding {length}")


def eos_ids(*sources) -> frozenset[int]:
    """The end-of-sequence ids a model stops on: each source an id, a list of ids, None, or an object
    (a tokenizer, a generation config) whose `eos_token_id` is one of these; negative ids dropped."""
    ids = set()
    for source in sources:
        if source is not None and not isinstance(source, (int, list, tuple, set, frozenset)):
            source = getattr(source, "eos_token_id", None)
        ids.update([source] if isinstance(source, int) else (source or []))
    return frozenset(i for i in ids if i >= 0)
