"""Every sampling control clients send, exact under speculation: logit_bias, presence, frequency and
repetition penalties and min_p. The ones that depend on the tokens before a position are applied to
each verified position with the history its own prefix implies (`Decoding.adjusted`), so speculative
samples follow the controlled target's distribution over whole sequences, chains and trees alike;
a loop that applies them once a step, from the step's start, is caught."""

from __future__ import annotations

import pytest
import torch

from specdecode import ModelDrafter, PromptLookupDrafter, SamplingParams, autoregressive_decode, speculative_decode
from specdecode.decode import Decoding
from specdecode.lossless import toy_world, whole_sequence_pvalue
from test_lossless import RandomTreeDrafter

CONTROLS = {
    "presence 1.2": SamplingParams(presence_penalty=1.2),
    "frequency 0.9": SamplingParams(frequency_penalty=0.9),
    "repetition 2": SamplingParams(repetition_penalty=2.0),
    "repetition 2, last 2": SamplingParams(repetition_penalty=2.0, repeat_last_n=2),
    "logit_bias": SamplingParams(logit_bias={1: 1.5, 2: -0.7}),
    "min_p 0.3": SamplingParams(min_p=0.3),
    "all, temperature 0.8": SamplingParams(temperature=0.8, presence_penalty=0.6, frequency_penalty=0.4,
                                           repetition_penalty=1.3, logit_bias={0: 0.5}, min_p=0.05),
}


def test_the_controls_follow_openais_and_vllms_definitions():
    params = SamplingParams(logit_bias={3: 2.0}, presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=2.0)
    logits = torch.tensor([[1.0, -1.0, 2.0, 0.0, 3.0]] * 2)
    out = params.adjust(logits, prompt=[4], outputs=[[], [2, 2, 1]])
    # row 0: the bias on 3; the prompt's token 4 repeated: 3 / 2 (positive: divided)
    assert out[0].tolist() == [1.0, -1.0, 2.0, 2.0, 1.5]
    # row 1: 2 twice (2 / 2 - 0.25 * 2 - 0.5), 1 once (-1 * 2, negative: multiplied, - 0.25 - 0.5)
    assert out[1].tolist() == pytest.approx([1.0, -2.75, 0.0, 2.0, 1.5])
    probs = SamplingParams(min_p=0.5).probs(torch.tensor([0.0, -0.5, -1.0, 2.0]))
    assert (probs > 0).tolist() == [False, False, False, True]  # e^0 / e^2 < 0.5
    for bad in (dict(presence_penalty=3), dict(repetition_penalty=0), dict(min_p=1.5), dict(logit_bias={1: 200}),
                dict(repeat_last_n=-2), dict(repeat_last_n=1.5)):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


def test_a_repetition_window_reads_the_last_tokens_of_prompt_and_output_before_each_row():
    params = SamplingParams(repetition_penalty=2.0, repeat_last_n=2)
    logits = torch.tensor([[2.0, 2.0, 2.0, 2.0, -2.0]] * 3)
    out = params.adjust(logits, prompt=[4, 3], outputs=[[], [1], [1, 2]])
    assert out.tolist() == [[2.0, 2.0, 2.0, 1.0, -4.0],  # the prompt's last two: 4 and 3
                            [2.0, 1.0, 2.0, 1.0, -2.0],  # 3 and 1: 4 has left the window
                            [2.0, 1.0, 1.0, 2.0, -2.0]]  # 1 and 2
    assert SamplingParams(repetition_penalty=2.0, repeat_last_n=0).adjust(logits, [4, 3], [[], [1], [1, 2]]).equal(logits)


@pytest.mark.parametrize("last_n", [3, -1])
def test_the_repetition_penalty_is_llama_cpps(last_n):
    """llama.cpp's own penalties sampler (prompt tokens accepted first, as llama-server feeds it) and
    ours give the same logits, over a window and over everything (its -1: the whole context)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    import ctypes

    gen = torch.Generator().manual_seed(3)
    V, tokens = 40, torch.randint(0, 12, (30,), generator=gen).tolist()
    logits = torch.randn(V, generator=gen) * 4
    sampler = llama_cpp.llama_sampler_init_penalties(V, last_n if last_n > 0 else len(tokens), 1.3, 0.0, 0.0)
    for token in tokens:
        llama_cpp.llama_sampler_accept(sampler, token)
    data = (llama_cpp.llama_token_data * V)(*[llama_cpp.llama_token_data(i, float(x), 0.0) for i, x in enumerate(logits)])
    array = llama_cpp.llama_token_data_array(data, V, -1, False)
    llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
    llama_cpp.llama_sampler_free(sampler)
    theirs = torch.tensor([data[i].logit for i in range(V)])
    ours = SamplingParams(repetition_penalty=1.3, repeat_last_n=last_n).adjust(logits[None], tokens[:20], [tokens[20:]])[0]
    assert torch.equal(ours, theirs)
    assert not torch.equal(ours, logits)


@pytest.mark.statistical
@pytest.mark.parametrize("control", CONTROLS)
def test_speculative_samples_follow_the_controlled_target_over_whole_sequences(control):
    world = toy_world()
    assert whole_sequence_pvalue(ModelDrafter(world.draft), world.target, 3, CONTROLS[control]) > 1e-3


@pytest.mark.statistical
@pytest.mark.parametrize("control", ["presence 1.2", "repetition 2", "repetition 2, last 2", "all, temperature 0.8"])
def test_draft_trees_follow_the_controlled_target_over_whole_sequences(control):
    world = toy_world()
    assert whole_sequence_pvalue(RandomTreeDrafter(), world.target, 4, CONTROLS[control]) > 1e-3


@pytest.mark.statistical
@pytest.mark.parametrize("control", ["presence 1.2", "repetition 2, last 2"])
def test_penalties_applied_from_the_steps_start_are_caught(monkeypatch, control):
    """The engines' mistake: every row of a call scored with the counts (or the window) at the
    step's start, as if the drafted tokens before it had not been emitted."""
    def from_the_start(self, logits, draft):
        output = self.context[self.prompt_length:]
        return self.params.adjust(logits[0], self.context[: self.prompt_length], [output] * logits.shape[1])[None]

    monkeypatch.setattr(Decoding, "adjusted", from_the_start)
    world = toy_world()
    assert whole_sequence_pvalue(ModelDrafter(world.draft), world.target, 3, CONTROLS[control]) < 1e-6


# each with a prompt under which it moves the toy's greedy choices (a presence penalty only once the
# output holds some of the three tokens and not others, a repetition penalty where the prompt does not
# hold all three already)
GREEDY = {"presence": (dict(presence_penalty=2.0), [2, 1, 0]), "frequency": (dict(frequency_penalty=1.0), [0, 0, 0]),
          "repetition": (dict(repetition_penalty=5.0), [0, 0, 0]), "logit_bias": (dict(logit_bias={1: 2.0}), [0]),
          "repetition, last 2": (dict(repetition_penalty=5.0, repeat_last_n=2), [0, 0, 0])}


@pytest.mark.parametrize("control", GREEDY)
def test_greedy_output_under_each_control_is_the_same_with_and_without_speculation(control):
    world = toy_world()
    controls, prompt = GREEDY[control]
    params = SamplingParams(temperature=0, **controls)
    plain = [t for s in autoregressive_decode(world.target, prompt, params=params, max_new_tokens=20)
             for t in s.tokens]
    for drafter in (ModelDrafter(world.draft), PromptLookupDrafter(), RandomTreeDrafter()):
        steps = list(speculative_decode(world.target, drafter, prompt, gamma=3, params=params, max_new_tokens=20))
        assert [t for s in steps for t in s.tokens] == plain, (control, type(drafter).__name__)
    unpenalised = [t for s in autoregressive_decode(world.target, prompt, params=SamplingParams(temperature=0),
                                                   max_new_tokens=20) for t in s.tokens]
    assert plain != unpenalised  # the control changes the output: the comparison is not vacuous


class _VaryingGuesser:
    """A deterministic drafter whose guesses' length depends on the context (1..gamma tokens)."""

    vocab, proposes_trees, samples_trees = None, False, False

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size, self.lengths = vocab_size, []

    def reset(self, params, generator): pass
    def begin(self, prompt): pass
    def attach(self, cache): pass
    def source(self, context): return None
    def accept(self, num_accepted): pass

    def propose(self, context, gamma):
        from specdecode.drafters.base import Draft

        n = min(gamma, sum(context) % 4 + 1)
        self.lengths.append(n)
        return Draft(torch.tensor([[(sum(context) + 3 * i) % self.vocab_size for i in range(n)]]))


def test_llama_servers_n_max_and_n_min_cap_and_drop_drafts_without_changing_greedy_output():
    world = toy_world()
    prompt, params = [0, 1, 2], SamplingParams(temperature=0)
    plain = [t for s in autoregressive_decode(world.target, prompt, params=params, max_new_tokens=20) for t in s.tokens]
    for max_draft, min_draft in ((None, 0), (2, 0), (0, 0), (None, 3)):
        guesser = _VaryingGuesser(world.target.vocab_size)
        steps = list(speculative_decode(world.target, guesser, prompt, gamma=4, params=params, max_new_tokens=20,
                                        max_draft=max_draft, min_draft=min_draft))
        assert [t for s in steps for t in s.tokens] == plain
        verified = [len(s.proposed) for s in steps if s.proposed]
        if max_draft == 0:
            assert not verified and not guesser.lengths  # never asked to draft
        elif max_draft == 2:
            assert verified and max(verified) <= 2
        elif min_draft == 3:
            assert verified and min(verified) >= 3 and min(guesser.lengths) < 3  # short ones were dropped
    with pytest.raises(ValueError, match="max_draft"):
        Decoding(world.target, _VaryingGuesser(8), prompt, gamma=4, max_draft=-1)


@pytest.mark.statistical
def test_dropping_short_deterministic_drafts_keeps_sampling_exact():
    """n_min's choice depends on the context alone (a deterministic draft): the output is still the
    target's distribution over whole sequences, with the draft length capped too."""
    world = toy_world()
    guesser = _VaryingGuesser(world.target.vocab_size)
    assert whole_sequence_pvalue(guesser, world.target, 4, SamplingParams(temperature=0.9), min_draft=3,
                                 max_draft=3) > 1e-3
