"""Token ids to text as they arrive: incremental detokenisation with partial characters held back."""

from __future__ import annotations


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


def stable(text: str, shown: str) -> str:
    """Hold back a trailing partial character (a token that ends mid-UTF-8 sequence)."""
    while text.endswith("\ufffd") and len(text) > len(shown):
        text = text[:-1]
    return text
