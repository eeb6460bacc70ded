"""Drafts from a model with another tokenizer (a draft from another family than the target's).

The draft reads the context as text: the target's tokens are decoded and re-tokenised with the
draft's tokenizer, and its cache keeps whatever prefix of that still matches (`DraftContext`).
Two ways to turn its guesses into target tokens, both exact:

- `SharedVocabDrafter` (TLI, Timor et al., arXiv 2502.05202, ICML 2025): the draft samples only
  among the tokens both vocabularies hold with the same bytes (its distribution restricted to them
  and renormalised), and each draft id is mapped to the target's id with those bytes. The q it
  reports is that restricted distribution over target ids, exactly what its token was drawn from,
  so speculative sampling keeps the target's distribution at any temperature.
- `TextDrafter` (Universal Assisted Generation): the draft writes a few tokens greedily in its
  own vocabulary, the text is re-tokenised with the target's tokenizer, and those target tokens
  are a deterministic draft (q a point mass), verified as prompt lookup's are: exact at any
  temperature too. It can accept more where the shared vocabulary is small.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Sequence

import torch

from ..models.base import Model
from ..sampling import SamplingParams, draw, sample
from .base import BaseDrafter, Draft

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the printable character that stands for each byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return {c: b for b, c in enumerate(chars)}


def token_bytes(tokenizer) -> list[bytes | None]:
    """The bytes each token id stands for in text, or None for a special token (control tokens mean
    nothing across vocabularies). Byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM) and SentencePiece
    pieces ('▁' for a space, <0xNN> byte tokens: Llama 2, Gemma, Mistral) are read exactly; any
    other tokenizer's tokens by decoding each alone."""
    size = len(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(size)))
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = json.loads(backend.decoder.__getstate__()) if backend is not None and backend.decoder else {}
    kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", [])}
    if "ByteLevel" in kinds:
        table = _byte_decoder()

        def to_bytes(piece: str) -> bytes | None:
            try:
                return bytes(table[c] for c in piece)
            except KeyError:  # an added token written as plain text
                return piece.encode()
    elif "ByteFallback" in kinds or "Replace" in kinds:
        def to_bytes(piece: str) -> bytes | None:
            byte = _BYTE_TOKEN.fullmatch(piece)
            return bytes([int(byte[1], 16)]) if byte else piece.replace("\u2581", " ").encode()
    else:
        def to_bytes(piece: str) -> bytes | None:
            return None

    out: list[bytes | None] = []
    for i, piece in enumerate(pieces):
        if i in special or piece is None:
            out.append(None)
            continue
        text = to_bytes(piece)
        out.append(text if text is not None else tokenizer.decode([i]).encode())
    return out


@dataclass(frozen=True)
class VocabMap:
    """Draft token ids -> target token ids with the same bytes.

    to_target: [V_draft] int64, the target id of each draft id, -1 where the target has no token
    with its bytes (or it is a special token). Each draft end-of-sequence id maps to the target's
    first one: both mean the text ends.
    """

    to_target: torch.Tensor
    target_size: int
    target_bytes: list  # each target id's bytes (None for a special token): the context's text, read incrementally

    @property
    def shared(self) -> int:
        return int((self.to_target >= 0).sum())

    @classmethod
    def from_tokenizers(cls, target_tokenizer, draft_tokenizer, target_eos: Sequence[int] = (),
                        draft_eos: Sequence[int] = ()) -> VocabMap:
        target_ids: dict[bytes, int] = {}
        target_bytes = token_bytes(target_tokenizer)
        for i, text in enumerate(target_bytes):
            if text:  # the first id with these bytes: regular tokens come before byte-fallback duplicates
                target_ids.setdefault(text, i)
        draft = token_bytes(draft_tokenizer)
        to_target = torch.tensor([target_ids.get(text, -1) if text else -1 for text in draft], dtype=torch.long)
        if target_eos:
            for i in draft_eos:
                if i < len(to_target):
                    to_target[i] = min(target_eos)
        return cls(to_target, len(target_tokenizer), target_bytes)

    @classmethod
    def between(cls, target: Model, draft: Model) -> VocabMap:
        """The map between two loaded models' tokenizers, built once per pair of vocabularies (a
        server makes a drafter per request); refused where one has no tokenizer."""
        key = (target.vocab.fingerprint, draft.vocab.fingerprint, target.eos_token_ids, draft.eos_token_ids)
        if key not in _MAPS:
            _MAPS[key] = cls._build(target, draft)
        return _MAPS[key]

    @classmethod
    def _build(cls, target: Model, draft: Model) -> VocabMap:
        for role, model in (("target", target), ("draft", draft)):
            if getattr(model, "tokenizer", None) is None:
                raise ValueError(f"the {role} {model.name} has no tokenizer: a draft with another vocabulary "
                                 "reads the context as text, which needs both models' tokenizers")
        vmap = cls.from_tokenizers(target.tokenizer, draft.tokenizer, sorted(target.eos_token_ids),
                                   sorted(draft.eos_token_ids))
        if vmap.shared <= sum(1 for i in draft.eos_token_ids if i < len(vmap.to_target)):  # end of text alone
            raise ValueError(f"the draft shares no token with the target (target vocabulary {target.vocab}, draft "
                             f"vocabulary {draft.vocab}): nothing it proposes could be checked by the target")
        return vmap


_MAPS: dict[tuple, VocabMap] = {}


class DraftContext:
    """The draft model's cache kept in step with the target's context, through text: the context's
    target ids are read as text, tokenised with the draft's tokenizer, and the cache is trimmed to
    the longest prefix it holds of those draft ids before the rest is fed.

    The text grows as the context does: each new target token's bytes are appended, and only the
    text from a few draft tokens before the old end is tokenised again (a token there may merge with
    what follows), so reading costs the same however long the context (re-reading it whole took
    0.55 ms a step at 200 tokens of Gemma context, and grows with it). Where the draft would tokenise
    the whole text otherwise, its guesses are only less likely accepted: verification stays exact."""

    REREAD = 16  # characters before the old end from which the text is tokenised again
    # Past CATCH_UP unseen draft tokens (speculation was off for a while: the policy only probes the
    # draft now and then), the cache starts again from the last WINDOW: a probe then costs a short
    # prefill, not one as long as the stretch since the last probe, so probing a draft that does
    # not pay stays within its budget. The draft conditions on less text there; q is still the
    # distribution its tokens are drawn from, so verification stays exact.
    CATCH_UP, WINDOW = 48, 32

    def __init__(self, model: Model, vmap: VocabMap) -> None:
        self.model, self.target_bytes = model, vmap.target_bytes
        self.cache = None
        self.fed: list[int] = []  # the draft ids the cache holds, in order
        self.start = 0  # where in the context's draft ids the cache begins

    def reset(self) -> None:
        self.cache, self.fed, self.start = self.model.new_cache(), [], 0
        self.reset_text()

    def draft_ids(self, context: Sequence[int]) -> list[int]:
        seen = self._seen
        if len(context) < len(seen) or (seen and (context[len(seen) - 1] != seen[-1] or context[0] != seen[0])):
            self.reset_text()
            seen = self._seen
        for t in context[len(seen):]:
            if t < len(self.target_bytes) and self.target_bytes[t]:  # special tokens have no text
                self._bytes += self.target_bytes[t]
        seen.extend(context[len(seen):])
        text = self._bytes.decode("utf-8", errors="replace")
        tokenizer = self.model.tokenizer
        if not self._ids:
            encoding = tokenizer(text, return_offsets_mapping=True)  # the draft's own special tokens (its BOS) too
            self._ids, self._ends = list(encoding["input_ids"]), [end for _, end in encoding["offset_mapping"]]
            return self._ids
        keep = len(self._ids)
        while keep > 0 and self._ends[keep - 1] > self._ends[-1] - self.REREAD:
            keep -= 1
        start = self._ends[keep - 1] if keep else 0
        encoding = tokenizer(text[start:], add_special_tokens=False, return_offsets_mapping=True)
        self._ids = self._ids[:keep] + list(encoding["input_ids"])
        self._ends = self._ends[:keep] + [start + end for _, end in encoding["offset_mapping"]]
        return self._ids

    def reset_text(self) -> None:
        self._seen: list[int] = []  # the target ids read so far
        self._bytes = bytearray()  # their text
        self._ids: list[int] = []  # the draft's tokens of that text
        self._ends: list[int] = []  # the character where each of those tokens ends

    def logits(self, context: Sequence[int]) -> torch.Tensor:
        """The draft's logits [1, V_draft] after the context (as draft ids), the cache holding it."""
        if self.cache is None:
            raise RuntimeError("reset() must be called before proposing")
        ids = self.draft_ids(context)
        if not ids:
            ids = [self.model.tokenizer.eos_token_id or 0]  # an empty context: start from a neutral token
        if self.start >= len(ids):
            self.start = 0
        keep = 0
        for held, new in zip(self.fed, ids[self.start:]):
            if held != new:
                break
            keep += 1
        if len(ids) - self.start - keep > self.CATCH_UP:  # a long stretch unseen: start again near its end
            keep, self.start = 0, len(ids) - self.WINDOW
        keep = min(keep, len(ids) - self.start - 1)  # feed at least one token: its logits are the next distribution
        self.cache.trim(len(self.cache) - keep)
        self.fed = ids[self.start:]
        return self.feed(self.fed[keep:])

    def feed(self, ids: Sequence[int]) -> torch.Tensor:
        """Append draft ids (already in `fed` or added here by the caller) -> logits [1, V] after them."""
        return self.model.forward(torch.tensor([list(ids)]), self.cache, num_logits=1)[:, -1].float()

    def step(self, token: int) -> torch.Tensor:
        self.fed.append(token)
        return self.feed([token])


class SharedVocabDrafter(BaseDrafter):
    """TLI: the draft's distribution restricted to the shared tokens, proposed as target ids (see the
    module docstring). q over the target's ids is the restricted q scattered through the map (summed
    where two draft ids share one target id: the chance of proposing that target id)."""

    def __init__(self, model: Model, vmap: VocabMap) -> None:
        self.model, self.vmap = model, vmap
        self.context = DraftContext(model, vmap)
        self.shared_ids = (vmap.to_target >= 0).nonzero().squeeze(-1)  # [S] draft ids
        self.shared_targets = vmap.to_target[self.shared_ids]  # [S] their target ids
        self.vocab = None  # it proposes the target's own ids (mapped)

    def reset(self, params: SamplingParams, generator: torch.Generator | None) -> None:
        self.params, self.generator = params, generator
        self.context.reset()

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        logits = self.context.logits(context)  # [1, V_draft]
        greedy = self.params.is_greedy
        tokens, probs = [], []
        for i in range(gamma):
            restricted = logits[:, self.shared_ids]  # [1, S]: the shared tokens' logits
            if greedy:
                x = int(self.shared_ids[int(draw(restricted, self.params))])
            else:
                q = self.params.probs(restricted)  # [1, S]
                x = int(self.shared_ids[int(sample(q, self.generator))])
                q_target = torch.zeros(1, self.vmap.target_size)  # [1, V_target]
                q_target.index_add_(1, self.shared_targets, q)
                probs.append(q_target)
            tokens.append(int(self.vmap.to_target[x]))
            if i + 1 < gamma:
                logits = self.context.step(x)
        if not tokens:
            return Draft(torch.empty(1, 0, dtype=torch.long))
        return Draft(torch.tensor([tokens]), torch.stack(probs, dim=1) if probs else None)  # [1, g], [1, g, V]


class TextDrafter(BaseDrafter):
    """The draft's greedy text, re-tokenised for the target, as a deterministic draft (see the
    module docstring). The last target token of the text is left out: the draft's text may end
    inside a word the target would split otherwise."""

    def __init__(self, model: Model, target_tokenizer, vmap: VocabMap) -> None:
        self.model, self.target_tokenizer = model, target_tokenizer
        self.context = DraftContext(model, vmap)
        self.greedy = SamplingParams(temperature=0)
        self.vocab = None

    def reset(self, params: SamplingParams, generator: torch.Generator | None) -> None:
        self.context.reset()

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        logits = self.context.logits(context)
        written: list[int] = []
        eos = self.model.eos_token_ids
        for i in range(gamma + 1):  # one extra: the last target token is dropped
            x = int(draw(logits, self.greedy))
            if x in eos:
                break
            written.append(x)
            if i < gamma:
                logits = self.context.step(x)
        text = self.model.tokenizer.decode(written, skip_special_tokens=True)
        ids = self.target_tokenizer.encode(text, add_special_tokens=False)[:-1][:gamma] if text else []
        return Draft(torch.tensor([ids], dtype=torch.long).view(1, len(ids)))


class CrossVocabDrafter(BaseDrafter):
    """A draft with another tokenizer, drafting the way that accepts more for each request's sampling:
    its re-tokenised text (`TextDrafter`) when greedy, the shared tokens (`SharedVocabDrafter`)
    otherwise. On Spec-Bench with Gemma 3 270M drafted by SmolLM2-135M the text was accepted at
    alpha 0.78 greedy against 0.44 for the shared tokens, and at 0.30 against 0.40 at temperature 1
    (`benchmarks/results/cross_vocab.md`)."""

    def __init__(self, model: Model, target_tokenizer, vmap: VocabMap) -> None:
        self.text = TextDrafter(model, target_tokenizer, vmap)
        self.shared = SharedVocabDrafter(model, vmap)
        self.active: BaseDrafter = self.shared
        self.vocab = None

    def reset(self, params: SamplingParams, generator: torch.Generator | None) -> None:
        self.active = self.text if params.is_greedy else self.shared
        self.active.reset(params, generator)

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        return self.active.propose(context, gamma)

    def accept(self, num_accepted: int) -> None:
        self.active.accept(num_accepted)
