"""`--backend auto` between engines: the one measured faster wins, the choice is cached, and the
default gamma is the measured one."""

import pytest
import torch

from specdecode.gamma import AdaptiveGamma, as_policy
from specdecode.models import choose
from specdecode.models.profile import time_in_turns
from toy import SimulatedClock, ToyModel


class FakeEngine:
    """A model whose forward over k tokens costs step * (1 + per_row (k - 1)) seconds on `clock`."""

    def __init__(self, step: float, per_row: float, clock: SimulatedClock) -> None:
        self.step, self.per_row, self.clock = step, per_row, clock

    def new_cache(self):
        return FakeCache()

    def forward(self, tokens, cache, num_logits=None):
        k = tokens.shape[1]
        self.clock.advance(self.step * (1 + self.per_row * (k - 1)) if k <= 8 else 0)
        cache.length += k
        return torch.zeros(1, num_logits or k, 4)


class FakeCache:
    length = 0

    def __len__(self):
        return self.length

    def trim(self, n):
        self.length -= n


def test_the_faster_engine_is_chosen_once_and_remembered(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    model_file = tmp_path / "model.gguf"
    model_file.write_bytes(b"weights")
    loads = []

    def loader(name, engine):
        def load():
            loads.append(name)
            return engine
        return load

    # slow: a 4 ms step whose rows cost little; fast: a 2 ms step whose every row costs a whole step
    clock = SimulatedClock()
    loaders = {"slow": loader("slow", FakeEngine(0.004, 0.05, clock)), "fast": loader("fast", FakeEngine(0.002, 1.0, clock))}
    timer = lambda models: time_in_turns(models, choose.KS, choose.CONTEXT, choose.REPEATS, clock=clock)  # noqa: E731
    choice, model = choose.choose(model_file, 2, "kernels-a", loaders, timer=timer)
    assert choice.backend == "fast" and model is loaders["fast"]() and loads == ["slow", "fast", "fast"]
    assert choice.rates["fast"] > choice.rates["slow"] and "measured fastest here: fast" in choice.reason
    assert choice.step_ms == pytest.approx({"slow": 4.0, "fast": 2.0})
    assert choice.verify_8 == pytest.approx({"slow": 1.35, "fast": 8.0})

    def no_timing(models):
        raise AssertionError("a cached choice must not be measured again")

    loads.clear()
    again, _ = choose.choose(model_file, 2, "kernels-a", loaders, timer=no_timing)
    assert again == choice and loads == ["fast"]  # only the winner loads
    # new kernels, another thread count or a changed file: measured anew
    for args in ((model_file, 2, "kernels-b"), (model_file, 1, "kernels-a")):
        with pytest.raises(AssertionError, match="must not be measured again"):
            choose.choose(*args, loaders, timer=no_timing)


def test_the_choice_is_never_more_than_ten_percent_slower_than_the_best():
    """Whatever the curves, the chosen engine's predicted rate is the best one's."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        profiles = {}
        for name in ("a", "b", "c"):
            step = float(torch.rand(1, generator=gen)) * 0.02 + 0.002
            per_row = float(torch.rand(1, generator=gen)) * 1.2
            profiles[name] = (step, [0.0] + [1 + per_row * (k - 1) for k in range(1, 17)])
        choice = choose.pick(profiles)
        assert choice.rates[choice.backend] >= 0.9 * max(choice.rates.values())
        assert choice.rates[choice.backend] == max(choice.rates.values())


def test_a_flat_curve_is_worth_a_slower_step_only_as_far_as_the_cost_model_says():
    flat = (0.010, [0.0] + [1.0] * 16)  # 10 ms, verification free: (1 - 0.5^9)/0.5 tokens a call
    steep = (0.006, [0.0] + [float(k) for k in range(1, 17)])  # 6 ms, every row a whole step: plain decoding
    assert choose.predicted_rate(*steep) == pytest.approx(1 / 0.006)
    assert choose.predicted_rate(*flat) == pytest.approx((1 - 0.5 ** 16) / 0.5 / 0.010, rel=1e-3)
    assert choose.pick({"flat": flat, "steep": steep}).backend == "flat"
    assert choose.pick({"flat": (0.05, flat[1]), "steep": steep}).backend == "steep"


def test_gamma_auto_is_the_default_and_uses_the_measured_curve(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    target = ToyModel(vocab_size=1000, name="toy-default-gamma")
    policy = as_policy("auto", target, max_gamma=5)
    assert isinstance(policy, AdaptiveGamma) and policy.max_gamma == 5 and len(policy.verify_ratios) == 17
    assert list((tmp_path / "profiles").iterdir())  # measured once, cached for the next run
    with pytest.raises(ValueError, match="needs the target"):
        as_policy("auto")
    import inspect

    from specdecode import speculative_decode
    from specdecode.text import generate

    for fn in (speculative_decode, generate):
        assert inspect.signature(fn).parameters["gamma"].default == "auto"
