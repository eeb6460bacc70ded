"""Run statistics over the decode stream: tokens, target calls, drafted and accepted tokens, alpha."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .decode import Step


@dataclass
class Stats:
    """Totals over one generation."""

    new_tokens: int = 0
    target_calls: int = 0
    drafts: int = 0  # target calls that verified a proposal
    tree_drafts: int = 0  # of those, proposals that were trees
    proposed: int = 0  # draft tokens proposed (a tree's: its nodes, all verified in one call)
    accepted: int = 0  # draft tokens accepted (a tree's: the depth of the path kept)
    # accepted_per_position[i]: proposals whose draft token i was accepted, for a tree: whose kept
    # path reached depth i+1 (vLLM's per-position acceptance; divided by `drafts` it is the
    # empirical P(at least i+1 tokens accepted), `acceptance_per_depth`)
    accepted_per_position: list[int] = field(default_factory=list)
    calls: list[tuple[int, int]] = field(default_factory=list)  # per call: (tokens verified, accepted)
    beta_sum: float = 0.0  # sum of per-position acceptance probabilities (see Step.betas)
    beta_count: int = 0
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    wall_seconds: float = 0.0  # prefill included
    prefill_seconds: float = 0.0  # until the first call's tokens (the prompt's forward)
    # the cost model's expectations summed over the calls it planned (Step.forecast): tokens and
    # cost in one-token steps; their ratio is the speedup over plain decoding it predicted
    forecast_tokens: float = 0.0
    forecast_steps: float = 0.0
    finish_reason: str | None = None
    tokens: list[int] = field(default_factory=list)

    def add(self, step: Step) -> None:
        self.new_tokens += len(step.tokens)
        self.target_calls += 1
        self.drafts += bool(step.proposed)
        self.tree_drafts += bool(step.proposed) and step.tree
        self.calls.append((len(step.proposed), step.num_accepted))
        self.proposed += len(step.proposed)
        self.accepted += step.num_accepted
        if len(self.accepted_per_position) < step.num_accepted:
            self.accepted_per_position += [0] * (step.num_accepted - len(self.accepted_per_position))
        for i in range(step.num_accepted):
            self.accepted_per_position[i] += 1
        self.beta_sum += sum(step.betas)
        self.beta_count += len(step.betas)
        self.draft_seconds += step.draft_seconds
        self.target_seconds += step.target_seconds
        self.tokens.extend(step.tokens)
        if step.forecast is not None:
            self.forecast_tokens += step.forecast[0]
            self.forecast_steps += step.forecast[1]

    @property
    def tokens_per_call(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / proposed draft tokens (None when nothing was proposed)."""
        return self.accepted / self.proposed if self.proposed else None

    @property
    def acceptance_per_depth(self) -> list[float]:
        """P(the kept run reached depth i+1), over the calls that verified a proposal."""
        return [count / self.drafts for count in self.accepted_per_position] if self.drafts else []

    @property
    def alpha(self) -> float | None:
        """Mean acceptance probability E[sum_x min(p, q)] over the positions drafted in this run."""
        return self.beta_sum / self.beta_count if self.beta_count else None

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def predicted_speedup(self) -> float | None:
        """The speedup over plain decoding that the cost model expected of the calls it planned."""
        return self.forecast_tokens / self.forecast_steps if self.forecast_steps else None

    def summary(self) -> dict:
        out = asdict(self)
        out.pop("tokens")
        out.update(
            tokens_per_call=self.tokens_per_call,
            acceptance_rate=self.acceptance_rate,
            acceptance_per_depth=self.acceptance_per_depth,
            alpha=self.alpha,
            tokens_per_second=self.tokens_per_second,
            predicted_speedup=self.predicted_speedup,
        )
        return out
