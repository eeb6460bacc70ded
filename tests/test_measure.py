"""Measuring alpha and costs; loading prompt sets."""

import json

import pytest
import torch

from specdecode import ModelDrafter, PromptLookupDrafter, SamplingParams
from specdecode.analysis.measure import (drafter_step_seconds, measure_alpha, position_betas, profile_model,
                                         summarize_betas)
from specdecode.bench.prompts import load_prompts
from toy import ToyModel


def toy_pair():
    target = ToyModel(5, seed=21)
    return target, ToyModel(5, seed=22, scale=1.0, base=target)


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.5, top_k=3)])
def test_betas_are_sum_min_of_target_and_draft_at_each_position(params):
    target, draft = toy_pair()
    prompt, generated = [1, 2], [3, 0, 4, 4, 1]
    betas = position_betas(target, ModelDrafter(draft), prompt, generated, params)
    seq = prompt + generated
    for i, beta in enumerate(betas):
        prefix = tuple(seq[: len(prompt) + i])
        p, q = params.probs(target.logits_for(prefix)), params.probs(draft.logits_for(prefix))
        assert beta == pytest.approx(torch.minimum(p, q).sum().item(), abs=1e-6)


def test_lookup_beta_is_the_target_probability_of_the_copied_token():
    target, _ = toy_pair()
    prompt, generated = [1, 2, 3, 1], [2, 0]
    params = SamplingParams()
    betas = position_betas(target, PromptLookupDrafter(), prompt, generated, params)
    # after [.., 1] lookup copies 2; after [.., 1, 2] it copies 3
    assert betas[0] == pytest.approx(params.probs(target.logits_for((1, 2, 3, 1)))[2].item(), abs=1e-6)
    assert betas[1] == pytest.approx(params.probs(target.logits_for((1, 2, 3, 1, 2)))[3].item(), abs=1e-6)


def test_measured_alpha_matches_the_acceptance_rate_of_real_speculative_runs():
    """alpha measured without speculation predicts the per-token acceptance seen when speculating."""
    from specdecode import speculative_decode

    target, draft = toy_pair()
    params = SamplingParams()
    estimate = measure_alpha(target, ModelDrafter(draft), [[1], [2], [3], [4]] * 5, params, max_new_tokens=60)
    accepted = proposed = 0
    for seed in range(20):
        for step in speculative_decode(target, ModelDrafter(draft), [seed % 5], gamma=1, params=params, seed=seed,
                                       max_new_tokens=60):
            accepted += step.num_accepted
            proposed += len(step.proposed)
    assert abs(accepted / proposed - estimate.alpha) < 4 * estimate.stderr + 0.03
    assert 0 < estimate.stderr < 0.1 and estimate.positions == 20 * 60 and estimate.prompts == 20


def test_summarize_betas_clusters_by_prompt():
    estimate = summarize_betas([[1.0, 1.0], [0.0, 0.0]])
    assert estimate.alpha == 0.5 and estimate.stderr == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no positions"):
        summarize_betas([[], []])


def test_profile_is_measured_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    target, draft = toy_pair()
    target.name = "toy-target"
    profile = profile_model(target, max_k=4, context=8, repeats=3)
    assert len(profile.verify_ratios) == 5 and profile.verify_ratios[1] == 1.0 and profile.step_seconds > 0
    files = list((tmp_path / "profiles").glob("toy-target-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["verify_ratios"] == profile.verify_ratios
    calls = target.calls
    assert profile_model(target, max_k=4, context=8, repeats=3) == profile and target.calls == calls

    class OtherBackend(type(target)):  # the same model file on another backend is measured anew
        pass

    other = OtherBackend(3, seed=1, name="toy-target")
    profile_model(other, max_k=4, context=8, repeats=3)
    assert other.calls > 0 and len(list((tmp_path / "profiles").glob("toy-target-*.json"))) == 2
    assert drafter_step_seconds(ModelDrafter(draft), list(range(5)), repeats=3) > 0


def test_load_prompts_spec_bench_layout(tmp_path):
    path = tmp_path / "q.jsonl"
    rows = [dict(question_id=i, category=c, turns=[f"q{i}", "second turn"])
            for i, c in enumerate(["writing", "roleplay", "rag", "rag", "rag"])]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    prompts = load_prompts(path)
    assert [p.text for p in prompts] == ["q0", "q1", "q2", "q3", "q4"]
    assert [p.task for p in prompts][:3] == ["mt_bench", "mt_bench", "rag"]
    assert [p.id for p in load_prompts(path, ["rag"], per_category=2)] == ["2", "3"]
    assert [p.id for p in load_prompts(path, ["mt_bench"])] == ["0", "1"]
    with pytest.raises(ValueError, match="unknown categories \\['math'\\]"):
        load_prompts(path, ["math"])


def test_load_prompts_text_and_bad_files(tmp_path):
    text = tmp_path / "prompts.txt"
    text.write_text("first prompt\n\nsecond prompt\n")
    assert [p.text for p in load_prompts(text)] == ["first prompt", "second prompt"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{not json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: not valid JSON"):
        load_prompts(bad)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_prompts(tmp_path / "missing.jsonl")
