"""The distilled draft network: its cache, its reduced vocabulary, saving, training, and the
`specdecode distill` command."""

import json
import math

import numpy as np
import pytest
import torch

from specdecode import ModelDrafter, SamplingParams
from specdecode.cli import main
from specdecode.distill.data import Corpus
from specdecode.distill.train import choose_kept_ids, kept_coverage, train
from specdecode.models.base import Vocabulary
from specdecode.models.draftnet import (DraftNet, DraftNetCache, DraftNetConfig, DraftNetModel, Int8Linear,
                                        load_draftnet, save_draftnet)
from specdecode.models.load import load_model
from test_lossless import whole_sequence_pvalue


def tiny_net(vocab_size=100, kept=30, window=1024, layers=2, seed=0) -> DraftNet:
    torch.manual_seed(seed)
    cfg = DraftNetConfig(vocab_size=vocab_size, kept=kept, embed_dim=16, dim=32, layers=layers, heads=4, mlp_dim=48,
                         window=window)
    return DraftNet(cfg).eval()


@pytest.mark.parametrize("window", [1024, 5])
def test_cached_steps_and_rollback_equal_one_full_forward(window):
    net = tiny_net(window=window)
    x = torch.randint(0, 100, (1, 23))
    with torch.no_grad():
        full = net(x)  # [1, 23, 30]
        cache = DraftNetCache(net.cfg)
        pieces = [net(x[:, :7], cache)] + [net(x[:, i : i + 1], cache) for i in range(7, 15)] + [net(x[:, 15:], cache)]
        assert torch.allclose(torch.cat(pieces, 1), full, atol=1e-5)
        cache.trim(5)
        assert len(cache) == 18
        assert torch.allclose(net(x[:, 18:], cache), full[:, 18:], atol=1e-5)


def test_sliding_window_forgets_old_positions():
    net = tiny_net(window=4)
    a, b = torch.randint(0, 100, (1, 12)), torch.randint(0, 100, (1, 12))
    b[:, -4:] = a[:, -4:]  # same last 4 tokens, different history
    with torch.no_grad():
        assert not torch.allclose(net(a)[:, -1], net(b)[:, -1])  # positions differ: rotary phases agree, but
        # the window of 4 sees only the shared tokens, so the last logits must match
    net_w = tiny_net(window=1)
    with torch.no_grad():
        assert torch.allclose(net_w(a)[:, -1], net_w(b)[:, -1], atol=1e-5)


def test_model_wrapper_gives_minus_infinity_outside_the_kept_vocabulary():
    net = tiny_net()
    net.kept_ids.copy_(torch.arange(0, 60, 2))
    model = DraftNetModel(net, None, "toy", Vocabulary("toy", 100, "f"), [0])
    logits = model.forward(torch.tensor([[1, 2, 3]]), model.new_cache(), num_logits=2)  # [1, 2, 100]
    assert logits.shape == (1, 2, 100)
    assert torch.isfinite(logits[..., 0:60:2]).all()
    outside = torch.ones(100, dtype=torch.bool)
    outside[0:60:2] = False
    assert torch.isneginf(logits[..., outside]).all()


def test_int8_linear_is_close_to_the_float_product_and_refuses_shapes_its_kernel_does_not_serve():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48, bias=False)
    int8 = Int8Linear.quantize(linear)
    assert int8 is not None and int8.q.dtype == torch.int8 and int8.q.shape == (48, 64)
    x = torch.randn(2, 5, 64)
    with torch.no_grad():
        expected = linear(x)
    got = int8(x)
    assert got.shape == (2, 5, 48) and got.dtype == torch.float32
    assert (got - expected).abs().max() < 0.02 * expected.abs().max()
    assert Int8Linear.quantize(torch.nn.Linear(48, 16, bias=False)) is None  # its kernel needs in % 16 (we ask 32)
    assert Int8Linear.quantize(torch.nn.Linear(64, 16, bias=True)) is None


def test_int8_draft_quantises_a_copy_and_follows_the_float_one():
    net = tiny_net()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    int8 = DraftNetModel(net, None, "toy", Vocabulary("toy", 100, "f"), [0], weights="int8")
    floats = DraftNetModel(net, None, "toy", Vocabulary("toy", 100, "f"), [0], weights="float")
    quantised = [m for m in int8.net.modules() if isinstance(m, Int8Linear)]
    assert len(quantised) == 2 * 3 + 1  # qkv, out, gate_up per layer and the head (in 32); down (48), embed_proj (16) stay
    assert all(isinstance(m, torch.nn.Linear) for m in (net.head, net.layers[0].qkv))  # the caller's net untouched
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())
    x = torch.randint(0, 100, (1, 9))
    a = int8.forward(x, int8.new_cache())
    b = floats.forward(x, floats.new_cache())
    kept = torch.isfinite(b)
    assert torch.equal(torch.isfinite(a), kept)
    assert (a[kept] - b[kept]).abs().max() < 0.05 * b[kept].abs().max()
    assert int8.weights == "int8" and floats.weights == "float"


def test_auto_draft_weights_are_float_where_pytorchs_kernels_are_not_vectorised(monkeypatch):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    model = DraftNetModel(tiny_net(), None, "toy", Vocabulary("toy", 100, "f"), [0])
    assert model.weights == "float" and not any(isinstance(m, Int8Linear) for m in model.net.modules())
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    model = DraftNetModel(tiny_net(), None, "toy", Vocabulary("toy", 100, "f"), [0])
    assert model.weights == "int8" and any(isinstance(m, Int8Linear) for m in model.net.modules())
    with pytest.raises(ValueError, match="auto, int8, float"):
        DraftNetModel(tiny_net(), None, "toy", Vocabulary("toy", 100, "f"), [0], weights="int4")


@pytest.mark.statistical
def test_a_reduced_vocabulary_draft_keeps_the_target_distribution_exact():
    """q(x) = 0 outside the kept tokens: speculative sampling must still give the target's
    distribution over whole sequences (a toy target with 3 tokens, the draft can emit 2 of them)."""

    def drafter_for(toy_draft):
        net = tiny_net(vocab_size=3, kept=2, seed=3)
        net.kept_ids.copy_(torch.tensor([0, 2]))
        with torch.no_grad():  # spread the draft's logits so acceptance is neither 0 nor 1
            net.head.weight.mul_(20)
        return ModelDrafter(DraftNetModel(net, None, "toy", toy_draft.vocab, []))

    # 1,000 sequences (outcomes expected fewer than 5 times pooled into one bin by chi2_pvalue)
    assert whole_sequence_pvalue(drafter_for, 3, SamplingParams(temperature=1.0), samples=1_000) > 1e-3


def test_save_and_load_round_trip(tmp_path):
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({f"w{i}": i for i in range(100)},
                                                                              unk_token="w0")))
    vocab = Vocabulary.from_tokens("toy", tok.get_vocab())
    net = tiny_net()
    net.kept_ids.copy_(torch.arange(70, 100))
    save_draftnet(tmp_path / "d", net, tok, vocab, [5], meta={"note": "test"})
    model = load_model(str(tmp_path / "d"), dtype="float32")
    assert isinstance(model, DraftNetModel) and model.vocab == vocab and model.eos_token_ids == {5}
    x = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        expected = net(x)
    got = model.forward(x, model.new_cache())[..., 70:]
    assert torch.allclose(got, expected, atol=2e-2)  # weights are stored in fp16
    assert torch.equal(model.net.kept_ids, torch.arange(70, 100))

    config = json.loads((tmp_path / "d" / "draftnet.json").read_text())
    config["vocab"]["fingerprint"] = "0" * 16
    (tmp_path / "d" / "draftnet.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="do not match the vocabulary"):
        load_draftnet(tmp_path / "d")


def successor_corpus(n_seq=60, vocab=50, seed=0) -> Corpus:
    """Answers that count up mod `vocab` from the prompt's last token; soft labels say so with
    certainty, and the runner-up is one token further."""
    rng = np.random.default_rng(seed)
    tokens, offsets, starts, ids, lps = [], [0], [], [], []
    for _ in range(n_seq):
        prompt = rng.integers(0, vocab, 6).tolist()
        answer = [(prompt[-1] + i) % vocab for i in range(1, 11)]
        starts.append(offsets[-1] + len(prompt))
        tokens += prompt + answer
        offsets.append(len(tokens))
        ids += [[t, (t + 1) % vocab] for t in answer]
        lps += [[np.log(0.9), np.log(0.1)]] * len(answer)
    return Corpus(np.array(tokens, np.int32), np.array(offsets), np.array(starts), np.array(ids, np.int32),
                  np.array(lps, np.float16))


def test_training_learns_the_target_distribution():
    corpus = successor_corpus()
    kept = choose_kept_ids(corpus, 50)
    assert kept_coverage(corpus, kept) == 1.0
    net = tiny_net(vocab_size=50, kept=50, layers=1)
    net.kept_ids.copy_(kept)
    result = train(net, corpus, seconds=math.inf, lr=1e-2, tokens_per_batch=256, held_out=0.2, max_steps=150,
                   log=lambda m: None)
    assert result["held_out_before"]["greedy"] < 0.2
    assert result["held_out"]["greedy"] > 0.9
    assert result["held_out"]["overlap"] > 0.8  # sum min(p, q) over the top-K: close to the ideal 1.0


def test_kept_vocabulary_prefers_target_mass_and_keeps_end_tokens():
    corpus = successor_corpus(vocab=50)
    kept = choose_kept_ids(corpus, 5, always=[49])
    assert len(kept) == 5 and 49 in kept.tolist()
    assert kept_coverage(corpus, kept) < 1.0


def test_corpus_round_trip_and_bad_file(tmp_path):
    corpus = successor_corpus(n_seq=3)
    loaded = Corpus.load(corpus.save(tmp_path / "c.npz"))
    assert np.array_equal(loaded.answer(2), corpus.answer(2)) and loaded.num_answer_tokens == 30
    np.savez(tmp_path / "bad.npz", tokens=np.zeros(3))
    with pytest.raises(ValueError, match="not a distillation corpus"):
        Corpus.load(tmp_path / "bad.npz")


def test_distill_refuses_to_overwrite_and_bad_sizes(tmp_path, capsys):
    out = tmp_path / "draft"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["distill", "--out", str(out)]) == 2
    assert "nothing was overwritten" in capsys.readouterr().err
    assert (out / "keep.txt").read_text() == "mine"
    assert main(["distill", "--out", str(tmp_path / "new"), "--layers", "0"]) == 2
    assert "--layers must be >= 1" in capsys.readouterr().err


@pytest.mark.slow
def test_distill_command_runs_end_to_end_on_a_tiny_budget(tmp_path, capsys):
    out = tmp_path / "draft"
    # bounded by counts, not time: the same work on a slow host as on a fast one
    code = main(["distill", "--out", str(out), "--dtype", "float32", "--data-minutes", "60", "--data-batches", "1",
                 "--train-minutes", "60", "--train-steps", "3", "--gen-batch", "2", "--answer-tokens", "12", "--layers", "1", "--dim", "32", "--heads", "2",
                 "--mlp-dim", "64", "--embed-dim", "16", "--kept", "512"])
    assert code == 0
    log = capsys.readouterr().out
    assert "kept vocabulary: 512 tokens" in log and "written to" in log
    assert (tmp_path / "draft.corpus.npz").is_file()
    meta = json.loads((out / "draftnet.json").read_text())["meta"]
    assert meta["steps"] == 3 and meta["corpus_answer_tokens"] >= 2
    # The trained draft drives greedy speculative decoding to exactly the target's own output.
    args = ["generate", "Name three colours.", "--dtype", "float32", "--temperature", "0", "--max-new-tokens", "16",
            "--json"]
    assert main(args + ["--baseline"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(args + ["--draft", str(out), "--gamma", "3"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["text"] == plain["text"] and spec["proposed"] > 0
