"""The paper's figures from the formulas (Leviathan et al. 2023, figures 3-5 style)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..formulas import expected_tokens, operations_increase, optimal_gamma, speedup


def plot_analysis(path: str | Path, cost_ratio: float = 0.05, gammas=(1, 2, 3, 5, 7, 10),
                  cost_ratios=(0.01, 0.02, 0.05, 0.1, 0.2, 0.5), alpha: float | None = None) -> Path:
    """Four panels: expected tokens vs alpha; speedup vs alpha (at `cost_ratio`); operations increase vs
    alpha (c_hat = `cost_ratio`); optimal gamma vs alpha for several c. `alpha` marks a measured value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    alphas = np.linspace(0.0, 0.99, 199)
    fig, axes = plt.subplots(2, 2, figsize=(11, 8.5))
    ax = axes[0, 0]
    for g in gammas:
        ax.plot(alphas, [expected_tokens(a, g) for a in alphas], label=f"gamma={g}")
    ax.set(title="Expected tokens per iteration", xlabel="alpha", ylabel="E[tokens]")
    ax = axes[0, 1]
    for g in gammas:
        ax.plot(alphas, [speedup(a, g, cost_ratio) for a in alphas], label=f"gamma={g}")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set(title=f"Walltime speedup (c={cost_ratio})", xlabel="alpha", ylabel="speedup")
    ax = axes[1, 0]
    for g in gammas:
        ax.plot(alphas, [operations_increase(a, g, cost_ratio) for a in alphas], label=f"gamma={g}")
    ax.set(title=f"Arithmetic operations increase (c_hat={cost_ratio})", xlabel="alpha", ylabel="ops factor")
    ax = axes[1, 1]
    for c in cost_ratios:
        ax.step(alphas, [optimal_gamma(a, c)[0] for a in alphas], where="mid", label=f"c={c}")
    ax.set(title="Optimal gamma", xlabel="alpha", ylabel="gamma", yscale="symlog")
    ax.set_yticks([0, 1, 2, 4, 8, 16, 32, 64], ["0", "1", "2", "4", "8", "16", "32", "64"])
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        if alpha is not None:
            ax.axvline(alpha, color="black", lw=0.8, ls=":")
    fig.suptitle("Speculative decoding: the paper's analysis (Leviathan et al. 2023, section 3)")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
