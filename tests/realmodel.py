"""Shared pieces of the tests that run the embedded default model."""

from specdecode import SamplingParams

GREEDY = SamplingParams(temperature=0)
# An instruction whose answer copies most of the prompt: prompt lookup has something to find.
COPY_PROMPT = ("Rewrite the following sentence in the past tense: 'The committee reviews the budget, approves the "
               "new library, and announces the decision to the whole town on Friday.'")


def tokens_of(steps):
    return [t for step in steps for t in step.tokens]
