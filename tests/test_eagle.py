"""The feature draft (EAGLE): the target's kept features, the draft on the native kernels against its
PyTorch network, exact output through the decode loop (greedy identity, whole-sequence chi-square at
temperature > 0, with a broken verifier caught), the draft cache after rejections, training, and
the CLI. On a tiny random Llama (Q8_0) and a draft trained on it here."""

import json
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import run_cli

from specdecode import SamplingParams, autoregressive_decode, speculative_decode
from specdecode.bench.random_model import quantize, write_llama
from specdecode.drafters.eagle import EagleDrafter, FeatureDraft, head_rows
from specdecode.drafters.spec import DraftSpec
from specdecode.lossless import accept_everything, chi2_pvalue
from specdecode.models.base import ForwardCall
from specdecode.models.eagle import EagleConfig, EagleNet, load_eagle, save_eagle

pytest.importorskip("llama_cpp")

from specdecode.distill.eagle import (FeatureCorpus, _batches, _load_corpus, _resumable, choose_kept,  # noqa: E402
                                      distill_eagle, generate_features, refeature, train_eagle)
from specdecode.models.native import load_native  # noqa: E402

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(target, its feature corpus, a draft trained on it, the draft's file)."""
    root = tmp_path_factory.mktemp("eagle")
    target = load_native(quantize(write_llama(root / "tiny.gguf"), "Q8_0"))
    if target.c_layers is None:
        pytest.skip("the C kernels do not run this target's layers here")
    corpus = generate_features(target, 600, concurrent=8, max_new_tokens=32, seed=0, log=lambda m: None,
                               max_sequences=16)
    kept = choose_kept(corpus, 512, target.eos_token_ids)
    net, record = train_eagle(target, corpus, kept, 1200, hidden=256, lr=3e-3, window=64, max_steps=60,
                              evaluations=1, held_out=0.1, log=lambda m: None)
    path = save_eagle(root / "draft", net, record)
    return target, corpus, net, path, record


def prompts(corpus, n=3):
    return [corpus.tokens[corpus.offsets[i]:corpus.answer_starts[i]].tolist() for i in range(n)]


@pytest.mark.slow
def test_training_raises_agreement_with_the_target(world):
    """The learning curve starts at chance and the kept draft agrees with the target's argmax more."""
    curve = world[4]["curve"]
    assert curve[0]["tokens"] == 0 and curve[-1]["tokens"] > 0
    assert world[4]["best_alpha"] >= curve[0]["alpha"]
    assert max(r["greedy"] for r in curve) > curve[0]["greedy"] + 0.05


@pytest.mark.slow
def test_the_cache_keeps_each_positions_final_norm_output(world):
    """Features read out by the head give the forward's own logits, and positions fed one call at a
    time hold the same features as one call over them all (then a trim and a refill). Decode
    numerics throughout: on a path whose prompts take the prefill products, those differ in bits."""
    target = world[0]
    ids = torch.tensor([prompts(world[1], 1)[0]])
    T = ids.shape[1]
    whole = target.new_cache(64)
    whole.keep_features(target.dim)
    logits = target.forward(ids, whole, num_logits=T, prefill=False)
    assert torch.equal(target.head(whole.features[:T]), logits[0])
    pieces = target.new_cache(64)
    pieces.keep_features(target.dim)
    target.forward(ids[:, :T - 3], pieces, prefill=False)
    target.forward(torch.tensor([[7, 8, 9]]), pieces)
    pieces.trim(3)
    for t in range(T - 3, T):
        target.forward(ids[:, t:t + 1], pieces)
    assert torch.equal(pieces.features[:T], whole.features[:T])


@pytest.mark.slow
@pytest.mark.parametrize("bits", [8, 4])
def test_the_native_draft_computes_the_torch_network(world, bits):
    """FeatureDraft (4- or 8-bit weights, 8-bit activations, C layers) against EagleNet in float32 on
    the same inputs: the predicted features agree in direction, and the head's argmax mostly."""
    target, corpus, net = world[:3]
    ids = torch.tensor(prompts(corpus, 1)[0])
    cache = target.new_cache(64)
    cache.keep_features(target.dim)
    target.forward(ids[None], cache)
    T = len(ids) - 1
    features = cache.features[:T]  # f_0 .. f_{T-1}, paired with x_1 .. x_T
    draft = FeatureDraft(net, target, bits=bits)
    dcache = draft.new_cache(64)
    native = torch.cat([draft.step(ids[t + 1:t + 2], features[t:t + 1], dcache)[0] for t in range(T)])
    with torch.no_grad():
        embeds = target.embedding(ids[1:]).float()[None]
        reference = net(embeds, features[None], target.cos[:T].float(), target.sin[:T].float(),
                        target.attention_scale)[0]
    cosine = torch.nn.functional.cosine_similarity(native, reference, dim=-1)
    assert cosine.min() > (0.99 if bits == 8 else 0.95), cosine
    agree = draft.head(native).argmax(-1) == (reference @ head_rows(target, draft.kept_ids).T).argmax(-1)
    assert agree.float().mean() >= (0.9 if bits == 8 else 0.75)


@pytest.mark.slow
@pytest.mark.parametrize("trees", [False, True])
def test_greedy_output_is_plain_decoding_and_drafts_are_accepted(world, trees):
    """Chains, or the chain with its runners-up as leaves (verified as a tree), at a fixed gamma and
    with the adaptive policy sizing the tree."""
    target, corpus, net = world[:3]
    draft = FeatureDraft(net, target)
    accepted, shapes = 0, set()
    for prompt, gamma in zip(prompts(corpus, 4), [4, 4, "auto", "auto"]):
        plain = [t for s in autoregressive_decode(target, prompt, params=GREEDY, max_new_tokens=40) for t in s.tokens]
        steps = list(speculative_decode(target, EagleDrafter(draft, trees=trees, min_reach=0.01), prompt,
                                        gamma=gamma, params=GREEDY, max_new_tokens=40))
        assert [t for s in steps for t in s.tokens] == plain
        accepted += sum(s.num_accepted for s in steps)
        shapes |= {s.tree for s in steps if s.proposed}
    assert accepted > 0 and shapes == {trees}


@pytest.mark.slow
def test_a_cut_head_and_a_late_start_keep_greedy_output_plain(world):
    """A head cut to the most frequent tokens reads out the same logits for them; a draft starting
    from the prompt's last pairs only still gives plain output, and its cache holds only those."""
    target, corpus, net = world[:3]
    whole, cut = FeatureDraft(net, target, head_tokens=None), FeatureDraft(net, target, head_tokens=64)
    assert torch.equal(cut.kept_ids, net.kept_ids[:64]) and len(whole.kept_ids) == net.config.kept
    f = torch.randn(1, target.dim)
    assert torch.equal(cut.head(f), whole.head(f)[:, :64])
    prompt = prompts(corpus, 1)[0]
    assert len(prompt) > 6
    plain = [t for s in autoregressive_decode(target, prompt, params=GREEDY, max_new_tokens=24) for t in s.tokens]
    drafter = EagleDrafter(cut, context=4)
    steps = speculative_decode(target, drafter, prompt, gamma=3, params=GREEDY, max_new_tokens=24)
    first = [next(steps), next(steps)]  # the prefill, then the first proposal
    assert drafter.start == len(prompt) - 4 and len(drafter.cache) <= 4 + 3
    assert [t for s in first + list(steps) for t in s.tokens] == plain


@pytest.mark.slow
def test_the_draft_cache_after_rejections_equals_one_pass_over_the_kept_pairs(world):
    """Speculative rows are dropped and the real features replace them: after a decoding with
    rejections the draft cache's keys and values are those of one pass over the real pairs."""
    target, corpus, net = world[:3]
    drafter = EagleDrafter(FeatureDraft(net, target))
    prompt = prompts(corpus, 1)[0]
    steps = list(speculative_decode(target, drafter, prompt, gamma=3, params=GREEDY, max_new_tokens=40))
    assert any(s.rejected for s in steps) and any(s.num_accepted for s in steps)
    drafter.propose(prompt + [t for s in steps for t in s.tokens], 2)  # feeds the last iteration's pairs
    fed, context = drafter.fed, prompt + [t for s in steps for t in s.tokens]
    fresh = drafter.draft.new_cache(drafter.cache.positions)
    drafter.draft.step(torch.tensor(context[1:fed + 1]), drafter.target_cache.features[:fed], fresh)
    assert torch.equal(drafter.cache.k[:, :, :fed], fresh.k[:, :, :fed])
    assert torch.equal(drafter.cache.v[:, :, :fed], fresh.v[:, :, :fed])


def _samples(target, drafter_for, prompt, params, length, samples, seed=0):
    gen = torch.Generator().manual_seed(seed)
    with torch.inference_mode():  # as the kit's own loop (`lossless.whole_sequence_pvalue`)
        return [tuple(t for s in speculative_decode(target, drafter_for(), prompt, gamma=3, params=params,
                                                    max_new_tokens=length, generator=gen, eos_token_ids=[])
                      for t in s.tokens) for _ in range(samples)]


def _exact(target, prompt, params, length):
    """The target's probability of every continuation of `prompt` of `length` tokens."""
    dist = {}

    def walk(seq, mass):
        if len(seq) == length:
            dist[seq] = mass
            return
        logits = target.forward(torch.tensor([prompt + list(seq)]), target.new_cache(64), num_logits=1)[0, -1]
        for token, p in enumerate(params.probs(logits[None])[0].tolist()):
            if p > 0:
                walk(seq + (token,), mass * p)

    walk((), 1.0)
    return dist


@pytest.mark.statistical
def test_sampled_output_matches_the_target_over_whole_sequences_and_a_broken_verifier_is_caught(world):
    """Top-k 3 at temperature 1 (27 sequences of 3 tokens): speculative samples through the feature
    draft against the target's exact distribution; the same test with a verifier that accepts every
    draft token fails."""
    target, corpus, net = world[:3]
    params, prompt, length = SamplingParams(temperature=1.0, top_k=3), prompts(corpus, 1)[0], 3
    draft = FeatureDraft(net, target)
    exact = _exact(target, prompt, params, length)
    samples = _samples(target, lambda: EagleDrafter(draft), prompt, params, length, 1500)
    assert chi2_pvalue(samples, exact) > 1e-3
    with accept_everything():
        broken = _samples(target, lambda: EagleDrafter(draft), prompt, params, length, 1500, seed=1)
    assert chi2_pvalue(broken, exact) < 1e-6
    assert len(Counter(samples)) > 3


def test_a_saved_feature_draft_loads_as_it_was_and_bad_specs_are_refused(tmp_path):
    net = EagleNet(EagleConfig(64, 2, 2, 32, 128, 1e-5, 16, "tiny"))
    net.kept_ids.copy_(torch.arange(16) * 3)
    loaded, meta = load_eagle(save_eagle(tmp_path / "d", net, {"note": 1}))
    assert loaded.config == net.config and meta == {"note": 1} and torch.equal(loaded.kept_ids, net.kept_ids)
    assert torch.equal(loaded.fc.weight, net.fc.weight.half().float())
    with pytest.raises(FileNotFoundError, match="distill --eagle"):
        load_eagle(tmp_path / "nothing")
    with pytest.raises(ValueError, match="eagle: needs"):
        DraftSpec("eagle:")
    assert DraftSpec("eagle").is_eagle and DraftSpec("lookup+eagle:x").model_path is None  # nothing to load


def test_training_packs_windows_by_length_and_corpora_join():
    """Every window is in one batch a epoch, no batch's padded size passes the budget, and sorting
    by length keeps the padding small; joined corpora keep each sequence whole; the kept tokens come
    most frequent first, end-of-turn tokens before all."""
    rng = np.random.default_rng(0)
    windows = [(300 * i, int(n)) for i, n in enumerate(rng.integers(1, 257, 500))]
    batches = _batches(windows, 1024, rng)
    assert sorted(w for b in batches for w in b) == sorted(windows)
    padded = [len(b) * max(n for _, n in b) for b in batches]
    assert max(padded) <= 1024 and sum(padded) < 1.2 * sum(n for _, n in windows)

    def corpus(tokens, starts):
        offsets = np.cumsum([0] + [len(t) for t in tokens])
        flat = np.concatenate(tokens).astype(np.int32)
        return FeatureCorpus(flat, offsets, offsets[:-1] + np.array(starts),
                             np.arange(len(flat) * 2, dtype=np.float16).reshape(-1, 2))

    a, b = corpus([[1, 2, 3], [4, 5, 5, 5]], [1, 1]), corpus([[6, 7, 5, 7], [8, 9]], [1, 1])
    joined = FeatureCorpus.concat([a, b])
    assert joined.num_sequences == 4 and joined.num_answer_tokens == a.num_answer_tokens + b.num_answer_tokens
    assert joined.tokens[joined.offsets[2]:joined.offsets[3]].tolist() == [6, 7, 5, 7]
    assert joined.answer_starts[2] == 7 + 1 and torch.equal(torch.from_numpy(joined.features[7:]),
                                                            torch.from_numpy(b.features))
    assert choose_kept(joined, 3, always=[9]).tolist() == [9, 5, 7]


@pytest.mark.slow
def test_a_feature_draft_refuses_what_it_cannot_follow(world):
    target, net = world[0], world[2]
    drafter = EagleDrafter(FeatureDraft(net, target))
    cache = target.new_cache(32)
    target.forward(torch.tensor([[1, 2, 3]]), cache)
    with pytest.raises(ValueError, match="first position"):
        drafter.attach(cache)
    other = EagleNet(EagleConfig(64, 2, 2, 32, 128, 1e-5, 16, "another"))
    with pytest.raises(ValueError, match="trained for another"):
        FeatureDraft(other, target)
    with pytest.raises(ValueError, match="4- or 8-bit"):
        FeatureDraft(net, target, bits=6)
    with pytest.raises(ValueError, match="at least one token"):
        FeatureDraft(net, target, head_tokens=0)
    with pytest.raises(ValueError, match="at least one pair"):
        EagleDrafter(FeatureDraft(net, target), context=0)


@pytest.mark.slow
def test_the_cli_trains_a_feature_draft_and_generates_with_it(world, capsys, tmp_path):
    target_file = world[0].name
    root = world[3].parent
    out = tmp_path / "cli-draft"
    code, out_text, err = run_cli(capsys, "distill", "--eagle", "--target", str(root / target_file), "--out", str(out),
                                  "--data-minutes", "10", "--train-minutes", "10", "--data-batches", "6",
                                  "--train-steps", "3", "--kept", "256", "--answer-tokens", "24")
    assert code == 0, err
    assert "eagle: written to" in out_text and load_eagle(out)[0].config.kept == 256
    more = tmp_path / "cli-draft-more"  # trained on from the first, on a new corpus and the first's
    code, out_text, err = run_cli(capsys, "distill", "--eagle", "--target", str(root / target_file), "--out",
                                  str(more), "--init", str(out), "--also", f"{out}.features.npz", "--kept", "128",
                                  "--data-minutes", "10", "--train-minutes", "10", "--data-batches", "6",
                                  "--train-steps", "3", "--answer-tokens", "24", "--seed", "1")
    assert code == 0, err
    resumed, meta = load_eagle(more)
    assert torch.equal(resumed.kept_ids, load_eagle(out)[0].kept_ids[:128]) and meta["init"] == str(out)
    assert meta["sequences"] == 12
    code, _, err = run_cli(capsys, "distill", "--target", str(root / target_file), "--out", str(tmp_path / "x"),
                           "--init", str(out))
    assert code != 0 and "need --eagle" in err
    code, out_text, err = run_cli(capsys, "generate", "--target", str(root / target_file), "--backend", "native",
                                  "--draft", f"eagle:{out}", "--max-new-tokens", "16", "--json", "--gamma", "3",
                                  "--compare", "Hello")
    assert code == 0, err
    assert json.loads(out_text)["compare"]["identical"] is True


@pytest.mark.slow
def test_batched_requests_with_a_reused_prefix_give_plain_decoding(world):
    """Through the batch engine (the server's): requests that share a prompt prefix reuse its keys,
    values and features, and each gives its own plain greedy output."""
    from specdecode.batch import Batch

    target, corpus, net = world[:3]
    draft = FeatureDraft(net, target)
    first = prompts(corpus, 1)[0]
    asked = [first, first + [11, 12], prompts(corpus, 2)[1]]
    batch = Batch(target, max_batch=1)  # one after another: the second reuses the first's prompt
    requests = [batch.submit(p, EagleDrafter(draft), gamma=3, params=GREEDY, max_new_tokens=24) for p in asked]
    got = {r.id: [] for r in requests}
    for request, piece in batch.run():
        got[request.id] += piece.step.tokens
    for r, p in zip(requests, asked):
        plain = [t for s in autoregressive_decode(target, p, params=GREEDY, max_new_tokens=24) for t in s.tokens]
        assert got[r.id] == plain
    if target.row_invariant_prompts:
        assert batch.prefixes.reused_tokens > 0


@pytest.fixture(scope="module")
def layered(world):
    """The trained draft grown to read the target's residual stream after its first layer too
    (EAGLE-3's fused features), its fuse then moved off the final-norm features alone."""
    target, net = world[0], world[2]
    grown = _resumable(net, target, net.config.kept, (1,))
    with torch.no_grad():
        grown.fuse.weight[:, :target.dim] = 0.05 * torch.randn(target.dim, target.dim,
                                                               generator=torch.Generator().manual_seed(0))
    return grown


@pytest.mark.slow
def test_a_cache_keeps_the_residual_stream_after_the_layers_a_draft_reads(world, monkeypatch):
    """With layers asked for, the logits and the final-norm features are those of a cache that keeps
    the final-norm features alone (the C layers split at the tap give the same bits), the tap is the
    residual stream the layer-by-layer loop computes, and a batch mixing the two kinds of cache gives
    each its own; asking one cache for other layers is refused."""
    target, corpus = world[:2]
    ids = torch.tensor([prompts(corpus, 1)[0]])
    T, D = ids.shape[1], target.dim
    plain, tapped = target.new_cache(64), target.new_cache(64)
    plain.keep_features(D)
    tapped.keep_features(D, (1,))
    assert tapped.features.shape == (64, 2 * D)
    assert torch.equal(target.forward(ids, plain, prefill=False), target.forward(ids, tapped, prefill=False))
    assert torch.equal(tapped.features[:T, D:], plain.features[:T])
    step = torch.tensor([[5]])
    both = target.forward_batch([ForwardCall(step, plain, 1), ForwardCall(step, tapped, 1)])
    assert torch.equal(both[0], both[1]) and torch.equal(tapped.features[T, D:], plain.features[T])
    monkeypatch.setattr(target, "c_layers", None)  # the same call, one operation at a time
    loop = target.new_cache(64)
    loop.keep_features(D, (1,))
    target.forward(ids, loop, prefill=False)
    torch.testing.assert_close(loop.features[:T], tapped.features[:T], rtol=1e-4, atol=1e-4)
    assert loop.features[:T, :D].abs().max() > 0
    with pytest.raises(ValueError, match="keeps the features of layers"):
        tapped.keep_features(D)


@pytest.mark.slow
def test_a_grown_draft_starts_as_it_was_and_runs_natively(world, layered):
    """Grown to read a layer, a draft's fuse passes the final-norm features alone (the same output
    as before); with its fuse moved, FeatureDraft on the C kernels computes EagleNet's network from
    the target's kept features."""
    target, corpus, net = world[:3]
    ids = torch.tensor(prompts(corpus, 1)[0])
    cache = target.new_cache(64)
    cache.keep_features(target.dim, (1,))
    target.forward(ids[None], cache)
    T = len(ids) - 1
    features = cache.features[:T]  # [T, 2D]: after layer 1, then the final norm
    embeds = target.embedding(ids[1:]).float()[None]
    cos, sin = target.cos[:T].float(), target.sin[:T].float()
    with torch.no_grad():
        fresh = _resumable(net, target, net.config.kept, (1,))
        before = net(embeds, features[None, :, target.dim:], cos, sin, target.attention_scale)
        after = fresh(embeds, fresh.fuse_features(features[None]), cos, sin, target.attention_scale)
        torch.testing.assert_close(after, before)
        reference = layered(embeds, layered.fuse_features(features[None]), cos, sin, target.attention_scale)[0]
    assert not torch.allclose(reference, before[0], atol=1e-3)  # the moved fuse reads the layer
    draft = FeatureDraft(layered, target, bits=8)
    dcache = draft.new_cache(64)
    native = torch.cat([draft.step(ids[t + 1:t + 2], features[t:t + 1], dcache)[0] for t in range(T)])
    assert torch.nn.functional.cosine_similarity(native, reference, dim=-1).min() > 0.99
    with pytest.raises(ValueError, match="2 features of"):
        draft.step(ids[1:2], features[:1, :target.dim + 1], dcache)


@pytest.mark.slow
def test_a_draft_reading_layers_keeps_greedy_output_plain_alone_and_in_a_batch(world, layered):
    """Greedy decoding with the layered draft is plain decoding, with rejections, its cache after them
    one pass over the real pairs; in the batch engine a reused prefix keeps its features of one width
    only for the caches that keep the same."""
    from specdecode.batch import Batch

    target, corpus = world[:2]
    draft = FeatureDraft(layered, target)
    prompt = prompts(corpus, 1)[0]
    plain = [t for s in autoregressive_decode(target, prompt, params=GREEDY, max_new_tokens=40) for t in s.tokens]
    drafter = EagleDrafter(draft)
    steps = list(speculative_decode(target, drafter, prompt, gamma=3, params=GREEDY, max_new_tokens=40))
    assert [t for s in steps for t in s.tokens] == plain and any(s.rejected for s in steps)
    context = prompt + plain
    drafter.propose(context, 2)
    fresh = draft.new_cache(drafter.cache.positions)
    draft.step(torch.tensor(context[1:drafter.fed + 1]), drafter.target_cache.features[:drafter.fed], fresh)
    assert torch.equal(drafter.cache.k[:, :, :drafter.fed], fresh.k[:, :, :drafter.fed])
    batch = Batch(target, max_batch=1)  # the second request reuses the first's prompt, the third the second's
    one_width = FeatureDraft(world[2], target)
    asked = [(prompt, EagleDrafter(one_width)), (prompt + [11], EagleDrafter(draft)), (prompt + [11, 12],
                                                                                       EagleDrafter(draft))]
    requests = [batch.submit(p, d, gamma=3, params=GREEDY, max_new_tokens=16) for p, d in asked]
    got = {r.id: [] for r in requests}
    for request, piece in batch.run():
        got[request.id] += piece.step.tokens
    for r, (p, _) in zip(requests, asked):
        assert got[r.id] == [t for s in autoregressive_decode(target, p, params=GREEDY, max_new_tokens=16)
                             for t in s.tokens]


@pytest.mark.slow
def test_a_corpus_gets_the_features_of_layers_teacher_forced_once(world, tmp_path):
    """`refeature` gives the generated corpus's own final-norm features at the answers' positions (both
    decode numerics: the same bits where rows are computed alone) and the tapped layer's beside them;
    the copy is written beside the corpus and read back the next time; corpora of other layers do not
    join, a draft cannot go on reading others."""
    target, corpus, net = world[:3]
    D = target.dim
    few = FeatureCorpus(corpus.tokens[:corpus.offsets[3]], corpus.offsets[:4], corpus.answer_starts[:3],
                        corpus.features[:corpus.offsets[3]])
    layered_corpus = refeature(target, few, (1,), log=lambda m: None)
    assert layered_corpus.layers == (1,) and layered_corpus.features.shape == (len(few.tokens), 2 * D)
    answers = np.concatenate([np.arange(a, b - 1) for a, b in zip(few.answer_starts, few.offsets[1:])])
    got, generated = layered_corpus.features[answers, D:], few.features[answers]
    if target.row_invariant_prompts:  # rows computed alone: the same bits whatever shares the call
        assert np.array_equal(got, generated)
    else:  # plain C dot products sum a row in a batch differently
        np.testing.assert_allclose(got.astype(np.float32), generated.astype(np.float32), rtol=1e-2, atol=1e-2)
    assert np.abs(layered_corpus.features[answers, :D]).max() > 0
    path = few.save(tmp_path / "few.features.npz")
    said = []
    first = _load_corpus(path, target, (1,), said.append)
    assert (tmp_path / "few.features.layers.1.npz").is_file() and any("teacher-forced" in m for m in said)
    said.clear()
    again = _load_corpus(path, target, (1,), said.append)
    assert np.array_equal(again.features, first.features) and again.layers == (1,)
    assert said and said[0].startswith("reusing")
    with pytest.raises(ValueError, match="different layers"):
        FeatureCorpus.concat([few, layered_corpus])
    grown = _resumable(net, target, net.config.kept, (1,))
    with pytest.raises(ValueError, match="reads the features of layers"):
        _resumable(grown, target, net.config.kept, ())
    with pytest.raises(ValueError, match="reads the outputs of layers"):
        FeatureDraft(EagleNet(replace(grown.config, layers=(2,))), target)
    for bad in [(2,), (0,), (1, 1)]:
        with pytest.raises(ValueError, match="rising layer counts"):
            distill_eagle(target, tmp_path / "out", tmp_path / "none.npz", 1, 1, layers=bad)
    assert not (tmp_path / "none.npz").exists()


def test_a_layered_draft_saves_its_layers_and_the_cli_checks_them(tmp_path, capsys):
    net = EagleNet(EagleConfig(64, 2, 2, 32, 128, 1e-5, 16, "tiny", (3, 9)))
    loaded = load_eagle(save_eagle(tmp_path / "d", net))[0]
    assert loaded.config == net.config and loaded.config.layers == (3, 9)
    assert torch.equal(loaded.fuse.weight, net.fuse.weight.half().float())
    code, _, err = run_cli(capsys, "distill", "--target", "x.gguf", "--out", str(tmp_path / "x"),
                           "--feature-layers", "3")
    assert code != 0 and "need --eagle" in err
