"""The `trace` extension: how each token of a reply came, target call by target call (the paper's
Figure 1), for clients that show it (the server's own page, `static/`).

Opt-in: a request with `"specdecode": {"trace": true}` gets, in each streamed chunk, a field

    "specdecode": {"trace": [{"call": 3, "accepted": ["Paris", "."], "target": " The",
                              "rejected": " It", "proposed": 3, "draft_ms": 0.4, "target_ms": 21.7}]}

with one entry per target call whose text the chunk carries (a call whose text is held back, a
partial character or a function call, rides on the next chunk; the last chunk carries any left):

    call       the target call's number in the request, from 1 (the first is the prompt's)
    accepted   the draft tokens the target kept, one string each (their text in order; a token that
               ends inside a character has "" and the next one carries the character)
    target     the target's own token: the correction of the first rejected proposal, or the bonus
               token after a fully accepted draft (with the tokens a grammar forced after it)
    rejected   the proposals the target threw away, as text (not part of the reply)
    proposed   how many tokens the drafter proposed for this call (0: a plain decoding step)
    draft_ms, target_ms  the drafting time and the target call's (with its verification)

`"".join(accepted) + target` over a reply's entries is its text, and the entries' accepted counts and
their number are `usage.speculative`'s `accepted_tokens` and `target_calls`. A reply without a stream
carries the whole list at `specdecode.trace` in its body (a list per choice where it has several).
Without `trace` a reply has no `specdecode` field.
"""

from __future__ import annotations

from ..text import TextStep

CONTEXT = 8  # earlier tokens decoded before a step's own, so that a token's text is what it adds there


class Tracer:
    """One request's trace entries, one per `TextStep` in order."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.calls, self.tail = tokenizer, 0, []

    def _text(self, ids: list[int]) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return text.rstrip("\ufffd")  # a partial character is not shown yet

    def _split(self, text: str, ids: list[int]) -> list[str]:
        """`text` (the accepted tokens' shown text) cut at the tokens' boundaries: one string per id,
        joined exactly `text`."""
        if not ids:
            return []
        before = len(self._text(self.tail))
        ends = [min(len(text), max(0, len(self._text(self.tail + ids[: i + 1])) - before)) for i in range(len(ids) - 1)]
        cuts, last = [], 0
        for end in ends:
            last = max(last, end)
            cuts.append(last)
        bounds = [0, *cuts, len(text)]
        return [text[a:b] for a, b in zip(bounds, bounds[1:])]

    def entry(self, piece: TextStep) -> dict:
        step = piece.step
        self.calls += 1
        out = {"call": self.calls, "accepted": self._split(piece.accepted_text, step.tokens[: step.num_accepted]),
               "target": piece.target_text, "rejected": piece.rejected_text, "proposed": len(step.proposed),
               "draft_ms": round(step.draft_seconds * 1e3, 3), "target_ms": round(step.target_seconds * 1e3, 3)}
        self.tail = (self.tail + step.tokens)[-CONTEXT:]
        return out
