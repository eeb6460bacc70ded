"""Shared pieces of the tests that run the embedded default model."""

from specdecode import (PromptLookupDrafter, SamplingParams, autoregressive_decode, encode_prompt,
                        speculative_decode)

GREEDY = SamplingParams(temperature=0)
# An instruction whose answer copies most of the prompt: prompt lookup has something to find.
COPY_PROMPT = ("Rewrite the following sentence in the past tense: 'The committee reviews the budget, approves the "
               "new library, and announces the decision to the whole town on Friday.'")


def tokens_of(steps):
    return [t for step in steps for t in step.tokens]


def lookup_and_plain_greedy(target, gamma: int, max_new_tokens: int = 40):
    """Greedy decoding of COPY_PROMPT with prompt lookup and plain: (speculative steps, plain tokens)."""
    ids = encode_prompt(target.tokenizer, COPY_PROMPT)
    expected = tokens_of(autoregressive_decode(target, ids, params=GREEDY, max_new_tokens=max_new_tokens))
    steps = list(speculative_decode(target, PromptLookupDrafter(), ids, gamma=gamma, params=GREEDY,
                                    max_new_tokens=max_new_tokens))
    return steps, expected
