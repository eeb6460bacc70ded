"""The text layer: chat template in, the decode stream out as text pieces, with incremental
detokenisation and stop strings.

Everything that shows a generation (the CLI, the renderer, benchmarks, the server) consumes `generate()`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, Sequence

from .decode import Step, autoregressive_decode, speculative_decode
from .drafters.base import Drafter
from .gamma import GammaPolicy
from .grammar import Grammar, constraint_for
from .checks import check_prompt_text, check_stop
from .sampling import SamplingParams
from .stats import Stats


def encode_prompt(tokenizer, prompt: str, chat: bool = True) -> list[int]:
    """Token ids for a plain prompt; with `chat` the tokenizer's chat template wraps it as a user turn."""
    check_prompt_text(prompt)
    if chat and getattr(tokenizer, "chat_template", None):
        return encode_chat(tokenizer, [{"role": "user", "content": prompt}])
    return tokenizer.encode(prompt, add_special_tokens=True)


def encode_chat(tokenizer, messages: Sequence[dict], tools: list | None = None) -> list[int]:
    """Token ids of a conversation ({"role", "content"} turns) through the tokenizer's chat
    template, ending with the assistant's turn opened; `tools` (OpenAI's function specs) for a
    template that reads them."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template; send a plain prompt instead")
    extra = {"tools": tools} if tools else {}
    ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True,
                                        return_dict=False, **extra)
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # some tokenizers return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


@dataclass
class TextStep:
    """One target call, as text. The three pieces render the paper's Figure 1: `accepted_text`
    (draft tokens kept), `rejected_text` (draft tokens thrown away; not part of the output), then
    `target_text` (the target's corrected or bonus token)."""

    step: Step
    accepted_text: str
    rejected_text: str
    target_text: str
    finish_reason: str | None  # "eos", "length", "stop" or None


def generate(
    target,
    prompt_ids: Sequence[int],
    drafter: Drafter | None = None,
    *,
    gamma: int | str | GammaPolicy = "auto",
    params: SamplingParams = SamplingParams(),
    max_new_tokens: int = 128,
    lenience: float = 1.0,
    seed: int | None = None,
    stop: Sequence[str] = (),
    stats: Stats | None = None,
    grammar: Grammar | None = None,
) -> Iterator[TextStep]:
    """Decode (speculatively, or autoregressively when `drafter` is None) and yield text pieces.

    `target` needs a `tokenizer`. Stop strings end the stream; the returned text stops before them.
    Pass a `Stats` to have it filled in as the stream is consumed. `grammar` (`grammar.Grammar`: a
    JSON schema, a regular expression, a Lark grammar): the output follows it, exactly as the target
    restricted to it would sample.
    """
    stop = check_stop(stop)
    tokenizer = target.tokenizer
    stats = stats if stats is not None else Stats()
    constraint = constraint_for(grammar, target)
    if drafter is None:
        steps = autoregressive_decode(target, prompt_ids, params=params, max_new_tokens=max_new_tokens, seed=seed,
                                      constraint=constraint)
    else:
        steps = speculative_decode(
            target, drafter, prompt_ids, gamma=gamma, params=params,
            max_new_tokens=max_new_tokens, lenience=lenience, seed=seed, constraint=constraint,
        )
    pieces = TextPieces(tokenizer, stop, stats)
    try:
        for step in steps:
            piece = pieces.add(step)
            yield piece
            if piece.finish_reason:
                return
    finally:
        stats.wall_seconds = time.perf_counter() - pieces.start
        steps.close()


class TextPieces:
    """Turns one request's decode steps into text pieces: incremental detokenisation, partial
    characters held back, stop strings cut. `generate` feeds it from one decode stream; a batch
    feeds one per request. Fills `stats` as steps arrive."""

    def __init__(self, tokenizer, stop: Sequence[str], stats: Stats) -> None:
        self.tokenizer, self.stop, self.stats = tokenizer, stop, stats
        self.shown = ""  # text handed out so far
        self.text = IncrementalText(tokenizer, stats.tokens)
        self.start = time.perf_counter()

    def add(self, step: Step) -> TextStep:
        stats, stop, shown, text = self.stats, self.stop, self.shown, self.text
        stats.add(step)
        stats.wall_seconds = time.perf_counter() - self.start
        if stats.target_calls == 1:
            stats.prefill_seconds = stats.wall_seconds
        split = len(stats.tokens) - len(step.tokens) + step.num_accepted  # accepted | target token
        with_accepted = _stable(text.upto(split), shown)
        full = text.upto(len(stats.tokens))
        finish = step.finish_reason
        cut = _find_stop(full, stop, max(0, len(shown) - max((len(s) for s in stop), default=0)))
        if cut is not None:
            full, finish = full[:cut], "stop"
            with_accepted = with_accepted[:cut]
        # A partial character is never shown: held back until the next token completes it, and
        # dropped when the reply ends first. The start of a stop string waits for the next token.
        full = _stable(full, shown)
        if not finish:
            full = full[: max(len(shown), len(full) - _partial_stop(full, stop))]
        with_accepted = with_accepted[: len(full)]
        piece = TextStep(
            step=step,
            accepted_text=with_accepted[len(shown):],
            rejected_text=self.tokenizer.decode(step.rejected, skip_special_tokens=True) if step.rejected else "",
            target_text=full[max(len(shown), len(with_accepted)):],
            finish_reason=finish,
        )
        self.shown = full if len(full) > len(shown) else shown
        text.advance(len(stats.tokens))
        stats.finish_reason = finish
        return piece


class IncrementalText:
    """The text of a growing token list at a cost per call that does not grow with it.

    Decoding is not concatenative token by token (a character can span tokens, and some tokenizers
    drop or add a space depending on what precedes), so each call decodes a short window: the
    tokens since the last-but-one `advance`, for left context, and the text they are known to
    produce is subtracted (the scheme of vLLM's and TGI's incremental detokenisers). Where a
    tokenizer breaks that assumption it falls back to decoding everything.
    """

    def __init__(self, tokenizer, tokens: list[int]) -> None:
        self.tokenizer = tokenizer
        self.tokens = tokens  # read, never written: the caller appends to it
        self.prefix = 0  # the window starts here
        self.read = 0  # text of tokens[:read] is known and final
        self.read_text = ""

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def upto(self, end: int) -> str:
        """Text of tokens[:end], for end >= the last `advance`."""
        if end < self.read:
            return self._decode(self.tokens[:end])
        known = self._decode(self.tokens[self.prefix : self.read])
        window = self._decode(self.tokens[self.prefix : end])
        if not window.startswith(known):
            return self._decode(self.tokens[:end])
        return self.read_text + window[len(known):]

    def advance(self, end: int) -> None:
        """Fix the text of tokens[:end] (unless it ends inside a character) and slide the window."""
        text = self.upto(end)
        if end > self.read and not text.endswith("\ufffd"):
            self.prefix, self.read, self.read_text = self.read, end, text


def _stable(text: str, shown: str) -> str:
    """Hold back a trailing partial character (a token that ends mid-UTF-8 sequence)."""
    while text.endswith("\ufffd") and len(text) > len(shown):
        text = text[:-1]
    return text


def _partial_stop(text: str, stop: Sequence[str]) -> int:
    """The longest end of `text` that begins a stop string (and may complete it with the next token)."""
    return max((k for s in stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


def _find_stop(text: str, stop: Sequence[str], start: int) -> int | None:
    hits = [i for s in stop if (i := text.find(s, start)) >= 0]
    return min(hits) if hits else None
