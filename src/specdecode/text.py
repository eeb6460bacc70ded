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
from .checks import check_stop
from .detokenize import IncrementalText, stable
from .sampling import SamplingParams
from .stats import Stats


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
        with_accepted = stable(text.upto(split), shown)
        full = text.upto(len(stats.tokens))
        finish = step.finish_reason
        cut = _find_stop(full, stop, max(0, len(shown) - max((len(s) for s in stop), default=0)))
        if cut is not None:
            full, finish = full[:cut], "stop"
            with_accepted = with_accepted[:cut]
        # A partial character is never shown: held back until the next token completes it, and
        # dropped when the reply ends first. The start of a stop string waits for the next token.
        full = stable(full, shown)
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


def _partial_stop(text: str, stop: Sequence[str]) -> int:
    """The longest end of `text` that begins a stop string (and may complete it with the next token)."""
    return max((k for s in stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


def _find_stop(text: str, stop: Sequence[str], start: int) -> int | None:
    hits = [i for s in stop if (i := text.find(s, start)) >= 0]
    return min(hits) if hits else None
