"""The text layer: stop strings, text pieces for rendering, statistics."""

import pytest

from specdecode import ModelDrafter, SamplingParams, Stats, generate
from specdecode.render import format_summary, no_gain, render_step
from toy import ToyModel

GREEDY = SamplingParams(temperature=0)


class LetterTokenizer:
    """Token i is the i-th letter."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join("abcdef"[i] for i in ids)


def toy_target():
    target = ToyModel(6, seed=11)
    target.tokenizer = LetterTokenizer()
    return target, ToyModel(6, seed=12, scale=0.7, base=target)


def test_pieces_concatenate_to_the_output_and_split_at_the_draft_boundary():
    target, draft = toy_target()
    stats = Stats()
    pieces = list(generate(target, [0], ModelDrafter(draft), gamma=3, params=GREEDY, max_new_tokens=30, stats=stats))
    text = "".join(p.accepted_text + p.target_text for p in pieces)
    assert text == LetterTokenizer().decode(stats.tokens) and len(text) == 30
    for piece in pieces:
        assert len(piece.accepted_text) == piece.step.num_accepted
        assert len(piece.target_text) == len(piece.step.tokens) - piece.step.num_accepted
        assert piece.rejected_text == LetterTokenizer().decode(piece.step.rejected)


def test_stop_string_ends_generation_before_it():
    target, draft = toy_target()
    full = "".join(p.accepted_text + p.target_text for p in generate(target, [0], ModelDrafter(draft), params=GREEDY,
                                                                        max_new_tokens=30))
    stop = full[12:14]
    first = full.index(stop)
    stats = Stats()
    pieces = list(generate(target, [0], ModelDrafter(draft), params=GREEDY, max_new_tokens=30, stop=[stop],
                           stats=stats))
    assert "".join(p.accepted_text + p.target_text for p in pieces) == full[:first]
    assert pieces[-1].finish_reason == "stop" and stats.finish_reason == "stop"


def test_empty_stop_string_is_refused():
    target, draft = toy_target()
    with pytest.raises(ValueError, match="stop strings"):
        next(generate(target, [0], ModelDrafter(draft), stop=[""]))


def test_stats_and_summary_of_a_baseline_run():
    target, _ = toy_target()
    stats = Stats()
    list(generate(target, [0], None, params=GREEDY, max_new_tokens=9, stats=stats))
    assert (stats.new_tokens, stats.target_calls, stats.tokens_per_call) == (9, 9, 1.0)
    assert stats.acceptance_rate is None and stats.finish_reason == "length"
    summary = format_summary(stats)
    assert "9 tokens" in summary and "9 target calls" in summary and "acceptance n/a" in summary


def test_render_colours_the_three_kinds_of_token():
    target, draft = toy_target()
    pieces = list(generate(target, [0], ModelDrafter(draft), gamma=3, params=GREEDY, max_new_tokens=30))
    piece = next(p for p in pieces if p.rejected_text and p.accepted_text)
    answer = piece.accepted_text + piece.target_text
    styled = render_step(piece, color=True, show_rejected=True)
    styles = {str(span.style) for span in styled.spans}
    assert {"green", "red strike", "blue"} <= styles
    assert styled.plain == piece.accepted_text + piece.rejected_text + piece.target_text
    # by default the answer is its own text, coloured or not: rejected proposals only when asked
    assert render_step(piece, color=True).plain == render_step(piece, color=False).plain == answer
    assert {str(span.style) for span in render_step(piece, color=True).spans} == {"green", "blue"}
    marked = render_step(piece, color=False, show_rejected=True)
    assert marked.plain == f"{piece.accepted_text}[-{piece.rejected_text}-]{piece.target_text}" and not marked.spans


def test_incremental_text_equals_decoding_everything_for_a_real_tokenizer():
    """Multi-byte characters split across tokens, special tokens and random ids (broken UTF-8):
    the windowed decoding gives exactly the full decoding at every length."""
    import random

    from transformers import AutoTokenizer

    from specdecode.detokenize import IncrementalText
    from specdecode.models.default import trained_draft_path

    tokenizer = AutoTokenizer.from_pretrained(trained_draft_path())
    text = "Héllo wörld! 你好，世界。 Emoji 🤖🎨 and code:\n    def f(x):\n        return x ** 2  # ☃\n<|im_end|> done"
    rng = random.Random(0)
    sequences = [tokenizer.encode(text)] + [[rng.randrange(len(tokenizer)) for _ in range(60)] for _ in range(20)]
    for sequence in sequences:
        tokens: list[int] = []
        incremental = IncrementalText(tokenizer, tokens)
        while len(tokens) < len(sequence):
            tokens.extend(sequence[len(tokens) : len(tokens) + rng.randint(1, 5)])
            for end in range(incremental.read, len(tokens) + 1):
                assert incremental.upto(end) == tokenizer.decode(tokens[:end], skip_special_tokens=True)
            incremental.advance(len(tokens))
        assert incremental.read > len(tokens) // 2  # the window really slides


def test_a_run_where_speculation_did_not_pay_says_why():
    from specdecode.stats import Stats

    stats = Stats(proposed=40, accepted=1, target_calls=30, new_tokens=31, draft_seconds=0.3, wall_seconds=1.0)
    assert no_gain(stats).startswith("speculation did not pay here: the target accepted 2% of 40 drafted tokens")
    assert "drafting took 30% of the time" in no_gain(stats)
    assert "proposed nothing" in no_gain(Stats(target_calls=3, new_tokens=3, wall_seconds=1.0))
