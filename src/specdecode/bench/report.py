"""Benchmark aggregation and output: Markdown table, JSON, speedup bar chart, Figure-2 timeline."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..formulas import hardware_speedup, speedup
from ..analysis.measure import Profile
from .runner import Run

OVERALL = "overall"


@dataclass
class Row:
    task: str
    method: str  # label, e.g. "lookup g=4"
    temperature: float
    runs: int
    new_tokens: int
    tokens_per_second: float
    speedup: float
    tokens_per_call: float | None
    nodes_per_draft: float | None  # draft tokens (tree nodes) verified per call that verified any
    depth_per_draft: float | None  # of which accepted: the kept path's depth
    alpha: float | None
    cost_ratio: float | None
    predicted_speedup: float | None  # the paper's formula
    predicted_speedup_hw: float | None  # with the measured verification curve T(k)/T(1); for an
    # adaptive gamma what its cost model expected of the drafts and trees it chose
    decode_speedup: float | None  # measured after the first token (prefill excluded), over the baseline's
    identical: str | None  # greedy: "k/n" outputs equal to the baseline's


def _label(run: Run) -> str:
    return run.method if run.gamma is None else f"{run.method} g={run.gamma}"


def aggregate(runs: Sequence[Run], profile: Profile | None = None) -> list[Row]:
    groups: dict[tuple[str, str, float], list[Run]] = defaultdict(list)
    for run in runs:
        groups[(run.task, _label(run), run.temperature)].append(run)
        groups[(OVERALL, _label(run), run.temperature)].append(run)
    tps = {key: sum(r.new_tokens for r in rs) / sum(r.wall_seconds for r in rs) for key, rs in groups.items()}
    decode_tps = {key: _decode_rate(rs) for key, rs in groups.items()}
    rows = []
    for (task, label, temperature), rs in groups.items():
        base = tps.get((task, "baseline", temperature))
        calls = sum(r.target_calls or 0 for r in rs)
        beta_count = sum(r.beta_count or 0 for r in rs)
        proposed = sum(r.proposed or 0 for r in rs)
        drafts = sum(r.drafts or 0 for r in rs)
        alpha = sum(r.beta_sum or 0 for r in rs) / beta_count if beta_count else None
        cost = None
        if proposed and profile:
            cost = sum(r.draft_seconds or 0 for r in rs) / proposed / profile.step_seconds
        gamma = rs[0].gamma
        predicted = predicted_hw = None
        if alpha is not None and isinstance(gamma, int) and gamma and cost is not None:
            predicted = speedup(alpha, gamma, cost)
            predicted_hw = hardware_speedup(alpha, gamma, cost, profile.verify_ratios)
        forecast_steps = sum(r.forecast_steps or 0 for r in rs)
        if forecast_steps:
            predicted_hw = sum(r.forecast_tokens or 0 for r in rs) / forecast_steps
        base_decode, decode = decode_tps.get((task, "baseline", temperature)), decode_tps[(task, label, temperature)]
        greedy = [r for r in rs if r.identical is not None]
        rows.append(Row(
            task=task, method=label, temperature=temperature, runs=len(rs), new_tokens=sum(r.new_tokens for r in rs),
            tokens_per_second=tps[(task, label, temperature)],
            speedup=tps[(task, label, temperature)] / base if base else float("nan"),
            tokens_per_call=sum(r.new_tokens for r in rs) / calls if calls else None,
            nodes_per_draft=proposed / drafts if drafts else None,
            depth_per_draft=sum(r.accepted or 0 for r in rs) / drafts if drafts else None,
            alpha=alpha, cost_ratio=cost, predicted_speedup=predicted, predicted_speedup_hw=predicted_hw,
            decode_speedup=decode / base_decode if decode and base_decode else None,
            identical=f"{sum(r.identical for r in greedy)}/{len(greedy)}" if greedy and temperature == 0 else None,
        ))
    order = {t: i for i, t in enumerate(dict.fromkeys(r.task for r in runs))}
    order[OVERALL] = len(order)
    rows.sort(key=lambda r: (r.temperature, order[r.task], r.method != "baseline", r.method))
    return rows


def _decode_rate(runs: Sequence[Run]) -> float | None:
    """Tokens per second after each run's first token (None where runs did not time their prefill)."""
    if any(r.prefill_seconds is None for r in runs):
        return None
    seconds = sum(r.wall_seconds - r.prefill_seconds for r in runs)
    return sum(r.new_tokens - 1 for r in runs) / seconds if seconds > 0 else None


def _fmt(value, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def markdown(rows: Sequence[Row]) -> str:
    lines = [
        "| task | method | temp | runs | tokens | tokens/s | speedup | tokens/call | nodes/draft | depth/draft "
        "| alpha | c | predicted (paper) | predicted (T(k)) | decode speedup | identical |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.task} | {r.method} | {r.temperature:g} | {r.runs} | {r.new_tokens} | {r.tokens_per_second:.1f} "
            f"| {r.speedup:.2f}x | {_fmt(r.tokens_per_call)} | {_fmt(r.nodes_per_draft)} | {_fmt(r.depth_per_draft)} "
            f"| {_fmt(r.alpha)} | {_fmt(r.cost_ratio, '.3f')} "
            f"| {_fmt(r.predicted_speedup, '.2f', 'x')} | {_fmt(r.predicted_speedup_hw, '.2f', 'x')} "
            f"| {_fmt(r.decode_speedup, '.2f', 'x')} "
            f"| {r.identical or '-'} |"
        )
    unpaid = [r for r in rows if r.alpha is not None and r.speedup < 1]  # speculative rows slower than plain
    if unpaid:
        lines += ["", "Where speculation did not pay, and why:"]
        lines += [f"- {r.task}, {r.method}, temperature {r.temperature:g}: {r.speedup:.2f}x; alpha {r.alpha:.2f} and "
                  f"{_fmt(r.tokens_per_call)} tokens a call against a draft cost of c = {_fmt(r.cost_ratio, '.3f')} of "
                  f"a target step (the cost model foresaw {_fmt(r.predicted_speedup_hw, '.2f', 'x')})" for r in unpaid]
    return "\n".join(lines) + "\n"


def plot_speedups(rows: Sequence[Row], path: str | Path) -> Path:
    """Bar chart: speedup over the baseline per task, one panel per temperature."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    temperatures = sorted({r.temperature for r in rows})
    fig, axes = plt.subplots(1, len(temperatures), figsize=(7 * len(temperatures), 4.5), squeeze=False)
    for ax, temperature in zip(axes[0], temperatures):
        sub = [r for r in rows if r.temperature == temperature and r.method != "baseline"]
        tasks = list(dict.fromkeys(r.task for r in sub))
        methods = list(dict.fromkeys(r.method for r in sub))
        width = 0.8 / max(1, len(methods))
        for i, method in enumerate(methods):
            values = [next((r.speedup for r in sub if r.task == t and r.method == method), np.nan) for t in tasks]
            ax.bar(np.arange(len(tasks)) + i * width, values, width, label=method)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xticks(np.arange(len(tasks)) + width * (len(methods) - 1) / 2, tasks, rotation=20)
        ax.set(title=f"Speedup over autoregressive decoding, temperature {temperature:g}", ylabel="speedup")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_timeline(runs: Sequence[Run], path: str | Path) -> Path | None:
    """Figure-2 style: draft and target calls over time for one prompt, one row per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in runs if r.timeline]
    if not shown:
        return None
    fig, ax = plt.subplots(figsize=(12, 0.7 * len(shown) + 1.5))
    for row, run in enumerate(shown):
        t = 0.0
        for draft_s, target_s, proposed, emitted in run.timeline:
            if draft_s > 0 and proposed:
                ax.broken_barh([(t, draft_s)], (row - 0.35, 0.7), color="tab:orange")
            t += draft_s
            ax.broken_barh([(t, target_s)], (row - 0.35, 0.7), color="tab:blue", edgecolor="white", lw=0.3)
            if emitted > 1:
                ax.text(t + target_s / 2, row, str(emitted), ha="center", va="center", fontsize=6, color="white")
            t += target_s
    ax.set_yticks(range(len(shown)), [_label(r) for r in shown])
    ax.set_xlabel("seconds (orange: draft call, blue: target call; number: tokens it yielded)")
    ax.set_title(f"Timeline of one prompt ({shown[0].task}, id {shown[0].prompt_id}, temperature {shown[0].temperature:g})")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
