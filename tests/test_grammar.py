"""Grammars exact under speculation: whole sequences follow the constrained target's distribution
(p restricted to what the grammar allows after each prefix) for sampled chains, deterministic
chains cut at forbidden tokens, and trees; a verifier that ignores the grammar is caught; forced
tokens are emitted without a call of their own; greedy constrained output is the same with and
without speculation on the real model, and parses."""

from __future__ import annotations

import json

import pytest
import torch

from specdecode import ModelDrafter, PromptLookupDrafter, SamplingParams, autoregressive_decode, speculative_decode
from specdecode.grammar import Grammar, GrammarError, constraint_for
from specdecode.lossless import PROMPT, ToyModel, ToyTokenizer, sequence_distribution, whole_sequence_pvalue
from test_lossless import RandomTreeDrafter

pytest.importorskip("llguidance")

# a, b, c and an end-of-text token; "ab" pairs and lone c's: after an a, b is forced
PIECES = ("a", "b", "c", ".")
EOS = 3
PAIRS = Grammar.regex(r"(ab|c)*")
SAMPLES = 1000  # whole sequences a chi-square test draws (the grammar leaves few: 1,000 separate them well)


def world():
    target = ToyModel(4, seed=1, eos_token_ids=(EOS,), tokenizer=ToyTokenizer(PIECES))
    draft = ToyModel(4, seed=2, scale=1.0, base=target, eos_token_ids=(EOS,), tokenizer=ToyTokenizer(PIECES))
    return target, draft


class Copier:
    """A deterministic drafter that proposes the same tokens every time, whatever the grammar says:
    its forbidden tokens must be cut before verification."""

    vocab, proposes_trees, samples_trees = None, False, False

    def __init__(self, tokens):
        self.tokens = tokens

    def reset(self, params, generator):
        pass

    def begin(self, prompt):
        pass

    def attach(self, cache):
        pass

    def source(self, context):
        return None

    def propose(self, context, gamma):
        from specdecode.drafters.base import Draft

        return Draft(torch.tensor([self.tokens[:gamma]]))

    def accept(self, n):
        pass


def test_the_constrained_distribution_holds_only_what_the_grammar_allows():
    target, _ = world()
    dist = sequence_distribution(target, PROMPT, SamplingParams(), 6, frozenset({EOS}), PAIRS)
    assert sum(dist.values()) == pytest.approx(1.0)
    for seq in dist:
        text = "".join(PIECES[t] for t in seq).rstrip(".")
        assert text.replace("ab", "").replace("c", "") in ("", "a"), seq  # a pending a only at the cut
    assert any(seq[-1] == EOS for seq in dist)


@pytest.mark.statistical
@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.7, top_k=3)],
                         ids=["temperature 1", "temperature 0.7 top-k 3"])
def test_sampled_drafts_follow_the_constrained_target_over_whole_sequences(params):
    target, draft = world()
    assert whole_sequence_pvalue(ModelDrafter(draft), target, 3, params, eos=[EOS], grammar=PAIRS,
                                 samples=SAMPLES) > 1e-3


@pytest.mark.statistical
def test_deterministic_drafts_cut_at_forbidden_tokens_follow_it():
    target, _ = world()
    # "a c a b": its c after an a is forbidden (b is forced there): cut before it, every time
    for drafter, gamma in ((Copier([0, 2, 0, 1]), 4), (PromptLookupDrafter(), 3)):
        assert whole_sequence_pvalue(drafter, target, gamma, SamplingParams(), eos=[EOS], grammar=PAIRS,
                                     samples=SAMPLES) > 1e-3


@pytest.mark.statistical
def test_draft_trees_follow_it():
    target, _ = world()
    assert whole_sequence_pvalue(RandomTreeDrafter(), target, 4, SamplingParams(), eos=[EOS], grammar=PAIRS,
                                 samples=SAMPLES) > 1e-3


@pytest.mark.statistical
def test_a_verifier_that_ignores_the_grammar_is_caught(monkeypatch):
    from specdecode import decode
    from specdecode.grammar import Constraint

    def lenient(self, tokens):  # the matcher told of the tokens it allows only, so decoding goes on
        for token in tokens:
            if not self.matcher.is_stopped() and self.matcher.validate_tokens([token]):
                self.matcher.consume_token(token)

    monkeypatch.setattr(decode, "apply_masks", lambda logits, masks: logits)  # the target's rows unrestricted
    monkeypatch.setattr(Constraint, "consume", lenient)
    target, draft = world()
    assert whole_sequence_pvalue(ModelDrafter(draft), target, 3, SamplingParams(), eos=[EOS], grammar=PAIRS,
                                 samples=SAMPLES) < 1e-6


def test_forced_tokens_are_emitted_without_a_call_of_their_own():
    """After each sampled a, the grammar allows only b: it is emitted with the a and fed with the next
    call, so no call ever samples a b; the output follows the grammar."""
    target, _ = world()
    params = SamplingParams(logit_bias={0: 3.0})  # mostly a's, so many forced b's
    calls = target.calls
    steps = list(autoregressive_decode(target, PROMPT, params=params, max_new_tokens=40, seed=3,
                                       constraint=constraint_for(PAIRS, target)))
    tokens = [t for s in steps for t in s.tokens]
    text = "".join(PIECES[t] for t in tokens).rstrip(".")
    assert text.count("ab") >= 3 and text.replace("ab", "").replace("c", "") in ("", "a")
    assert sum(s.forced for s in steps) == text.count("ab")  # every b
    assert target.calls - calls == len(steps) == len(tokens) - sum(s.forced for s in steps)


def test_greedy_constrained_output_is_the_same_with_and_without_speculation_on_toys():
    target, draft = world()
    greedy = SamplingParams(temperature=0)
    plain = [t for s in autoregressive_decode(target, PROMPT, params=greedy, max_new_tokens=30,
                                              constraint=constraint_for(PAIRS, target)) for t in s.tokens]
    for drafter in (ModelDrafter(draft), Copier([0, 1, 2, 0, 2]), PromptLookupDrafter()):
        spec = [t for s in speculative_decode(target, drafter, PROMPT, gamma=4, params=greedy, max_new_tokens=30,
                                              constraint=constraint_for(PAIRS, target)) for t in s.tokens]
        assert spec == plain, type(drafter).__name__


def test_bad_grammars_are_named():
    with pytest.raises(GrammarError, match="JSON schema"):
        Grammar.json_schema("{not json")
    target, _ = world()
    with pytest.raises(GrammarError):
        constraint_for(Grammar.lark("start: undefined_rule"), target)


def test_logprobs_under_a_grammar_are_the_unconstrained_targets_for_every_token():
    """Asked for log-probabilities, a forced token is sampled like any other (its only value), so
    every token has the target's own row: the same tokens as without them, each with the raw
    log-softmax of the target's logits after its prefix, with and without speculation."""
    target, draft = world()
    greedy = SamplingParams(temperature=0, logit_bias={0: 2.0})  # a's, so b's are forced
    plain = [t for s in autoregressive_decode(target, PROMPT, params=greedy, max_new_tokens=20,
                                              constraint=constraint_for(PAIRS, target)) for t in s.tokens]
    for run in (lambda **k: autoregressive_decode(target, PROMPT, **k),
                lambda **k: speculative_decode(target, ModelDrafter(draft), PROMPT, gamma=3, **k)):
        steps = list(run(params=greedy, max_new_tokens=20, logprobs=2, constraint=constraint_for(PAIRS, target)))
        tokens = [t for s in steps for t in s.tokens]
        entries = [e for s in steps for e in s.logprobs]
        assert tokens == plain and "ab" in "".join(PIECES[t] for t in tokens)
        assert not any(s.forced for s in steps) and [e.token for e in entries] == tokens
        for i, entry in enumerate(entries):
            raw = torch.log_softmax(target.logits_for(tuple(PROMPT + tokens[:i])).double(), -1)
            assert entry.logprob == pytest.approx(raw[tokens[i]].item(), abs=1e-6)


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer"},
                                           "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
          "required": ["name", "age", "languages"], "additionalProperties": False}


@pytest.mark.slow
def test_greedy_json_on_the_real_model_parses_and_speculation_keeps_it():
    from specdecode.models.default import default_target_path
    from specdecode.models.native import load_native
    from specdecode.prompts import encode_prompt

    target = load_native(default_target_path())
    prompt = encode_prompt(target.tokenizer, "Describe a fictional programmer as JSON with name, age and languages.")
    grammar = Grammar.json_schema(SCHEMA)
    greedy = SamplingParams(temperature=0)
    plain_steps = list(autoregressive_decode(target, prompt, params=greedy, max_new_tokens=80,
                                             constraint=constraint_for(grammar, target)))
    plain = [t for s in plain_steps for t in s.tokens]
    reply = json.loads(target.tokenizer.decode(plain, skip_special_tokens=True))
    assert set(reply) == {"name", "age", "languages"} and isinstance(reply["age"], int)
    assert plain_steps[-1].finish_reason == "eos" and sum(s.forced for s in plain_steps) >= 5
    spec_steps = list(speculative_decode(target, PromptLookupDrafter(), prompt, params=greedy, max_new_tokens=80,
                                         constraint=constraint_for(grammar, target)))
    assert [t for s in spec_steps for t in s.tokens] == plain


@pytest.mark.slow
def test_generate_follows_a_json_schema_file_and_a_regex_from_the_cli(capsys, tmp_path):
    from conftest import run_cli

    schema = tmp_path / "city.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"name": {"type": "string"},
                                                                   "country": {"type": "string"}},
                                  "required": ["name", "country"], "additionalProperties": False}))
    code, out, _ = run_cli(capsys, "generate", "--json-schema", str(schema), "--temperature", "0", "--json",
                           "Describe Paris.")
    record = json.loads(out)
    assert code == 0 and set(json.loads(record["text"])) == {"name", "country"}
    code, out, _ = run_cli(capsys, "generate", "--regex", "(yes|no)", "--temperature", "0.9", "--seed", "1", "--json",
                           "Is the sky blue?")
    assert code == 0 and json.loads(out)["text"] in ("yes", "no")
    code, _, err = run_cli(capsys, "generate", "--json-schema", str(tmp_path / "missing.json"), "x")
    assert code == 2 and "missing.json" in err


def test_the_batch_engine_gives_each_request_its_own_matcher():
    """Three requests decoded together under one grammar: each follows it, and greedy each gets what
    it gets alone (a matcher shared between them would mix their states)."""
    from specdecode.batch import generate_batch

    target, draft = world()
    greedy = SamplingParams(temperature=0, logit_bias={0: 1.0})
    prompts = [PROMPT, PROMPT + [2], PROMPT + [0, 1]]
    alone = [[t for s in speculative_decode(target, ModelDrafter(draft), p, gamma=3, params=greedy, max_new_tokens=16,
                                            constraint=constraint_for(PAIRS, target)) for t in s.tokens]
             for p in prompts]
    together = generate_batch(target, prompts, lambda: ModelDrafter(draft), gamma=3, params=greedy,
                              max_new_tokens=16, grammar=PAIRS)
    assert [r.stats.tokens for r in together] == alone
