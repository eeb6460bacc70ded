"""Drafters and their sizing, replayed on recorded greedy outputs under the target's measured
costs: what each gains per Spec-Bench category, without the host's run-to-run noise.

Each prompt's greedy output is recorded once with the real target (plain decoding; the prompt's
prefill timed). Then the real decode loop (drafters, gamma policies, verification) runs against a
target that replays the record: its logits put the recorded next token first wherever the context
is the record's prefix, so greedy acceptance is exactly what the real target's would be. Its
forwards cost, on a clock, what the target's profile measured: T(k) for k rows after the context
(`Profile.verify_ratios`, `row_position_seconds`), the recorded prefill for the prompt. Drafting,
checking and the loop itself run for real and count as they take. Plain decoding is replayed the
same way, so each configuration's speedup is over the same replayed plain.

    python benchmarks/draft_replay.py --per-category 2 --drafts lookup auto pool oracle \
        --out benchmarks/results/draft_replay.md

`oracle` is prompt lookup cut, at every call, to exactly the tokens the target will accept (none
where it accepts none): the most that sizing lookup's proposals could give. `oracle-all` takes at
every call the proposal, among every model-free source's (lookup, the shared n-gram pool, suffix
drafting, lookup continued by the pool), that the target accepts furthest, cut alike.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from specdecode.formulas import verify_curve

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import SPEC_BENCH, cpu_model, publish  # noqa: E402

CATEGORIES = ["writing", "reasoning", "coding", "translation", "summarization", "qa", "math_reasoning", "rag"]


class Clock:
    """perf_counter plus what the replayed forwards cost beyond what they took."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.perf_counter() + self.offset


def forward_cost(profile):
    """(rows, cached) -> seconds of a forward over `rows` new rows after `cached` positions: the
    profile's T(k), extended past the measured k as the gamma policy extends it."""
    curve = verify_curve(profile.verify_ratios)

    def cost(rows: int, cached: int) -> float:
        return profile.step_seconds * curve(rows) + rows * profile.row_position_seconds * max(0, cached - profile.context)

    return cost


def followed(tokens: list[int], seq: list[int], t: int) -> int:
    """How many of `tokens`, proposed at position t, the sequence `seq` goes on with."""
    n = 0
    while n < len(tokens) and t + n < len(seq) and tokens[n] == seq[t + n]:
        n += 1
    return n


class ReplayTarget:
    """A target that replays one recorded greedy sequence (prompt + output) at measured costs."""

    def __init__(self, real, profile, record: list[int], prompt_length: int, prefill_seconds: float,
                 clock: Clock) -> None:
        self.name, self.vocab, self.eos_token_ids = real.name, real.vocab, real.eos_token_ids
        self.max_positions, self.device, self.tokenizer = None, "cpu", None
        self.size = real.vocab.size
        self.record, self.prompt_length, self.prefill_seconds = record, prompt_length, prefill_seconds
        self.clock, self.cost = clock, forward_cost(profile)
        self.calls, self.modeled = 0, 0.0  # forwards, and the seconds they are costed at

    def new_cache(self):
        from specdecode.lossless import ToyCache

        return ToyCache()

    def forward(self, tokens: torch.Tensor, cache, num_logits: int | None = None) -> torch.Tensor:
        began = time.perf_counter()
        new, start = tokens[0].tolist(), len(cache)
        cache.tokens.extend(new)
        rows = num_logits or len(new)
        logits = torch.zeros(1, rows, self.size)
        seq, record = cache.tokens, self.record
        for r in range(rows):
            end = len(seq) - rows + r + 1  # the prefix this row predicts after
            if end >= len(record) or seq[end - 1] != record[end - 1] or seq[:end] != record[:end]:
                break  # off the record (after a rejected draft token): rows left at zero
            logits[0, r, record[end]] = 30.0
        if start == 0 and len(new) >= self.prompt_length:
            seconds = self.prefill_seconds
        else:
            seconds = self.cost(len(new), start)
        self.clock.offset += seconds - (time.perf_counter() - began)
        self.calls, self.modeled = self.calls + 1, self.modeled + seconds
        return logits


class Oracle:
    """Prompt lookup's proposal cut to what the recorded output accepts; with `shared` (an n-gram
    pool and a suffix cache fed by every prompt), the proposal of whichever model-free source the
    output accepts furthest (lookup, the pool, suffix drafting, lookup continued by the pool; each
    uncut by its own estimates), cut alike."""

    vocab = None
    proposes_trees = samples_trees = False

    def __init__(self, record: list[int], shared=None) -> None:
        from specdecode import PromptLookupDrafter
        from specdecode.drafters.pool import PoolDrafter
        from specdecode.drafters.suffix import SuffixDrafter

        self.lookup, self.record = PromptLookupDrafter(), record
        self.pool = self.suffix = None
        if shared is not None:
            self.pool = PoolDrafter(shared[0], min_reach=0.0)
            self.suffix = SuffixDrafter(shared[1], trees=False)

    def reset(self, params, generator) -> None:
        for drafter in (self.lookup, self.pool, self.suffix):
            if drafter is not None:
                drafter.reset(params, generator)

    def begin(self, prompt) -> None:
        for drafter in (self.pool, self.suffix):
            if drafter is not None:
                drafter.begin(prompt)

    def attach(self, cache) -> None:
        pass

    def source(self, context):
        return None

    def propose(self, context, gamma):
        from specdecode.drafters.base import Draft

        copied = self.lookup.match(context, gamma)[1]
        proposals = [copied]
        if self.pool is not None:
            proposals.append(self.pool.candidate(context, gamma)[0])
            proposals.append(self.suffix.propose(context, gamma).tokens[0].tolist())
            if copied and len(copied) < gamma:
                tail = list(context[-self.pool.pool.orders[0]:]) + copied
                proposals.append(copied + self.pool.continuation(tail, gamma - len(copied), 0.0)[0])
        best = max((t[: followed(t, self.record, len(context))] for t in proposals), key=len)
        return Draft(torch.tensor([best], dtype=torch.long).reshape(1, -1))

    def accept(self, n) -> None:
        pass


def copy_runs(records: list[dict], longest: int = 16) -> list[str]:
    """What the outputs copy of their context: at each output position where prompt lookup finds a
    match, by the match's length, how often, how often its first token is the output's next, and
    how many of its tokens the output follows on average (what the best-sized lookup draft would
    get accepted there)."""
    from specdecode import PromptLookupDrafter

    by_length: dict = {}  # 1, 2, 3 (3 or more) -> [positions, first right, tokens followed]
    for rec in records:
        seq, lookup = rec["prompt"] + rec["output"], PromptLookupDrafter()
        for t in range(len(rec["prompt"]), len(seq)):
            n, tokens = lookup.match(seq[:t], longest)
            if tokens:
                run = followed(tokens, seq, t)
                row = by_length.setdefault(min(n, 3), [0, 0, 0])
                row[0], row[1], row[2] = row[0] + 1, row[1] + (run > 0), row[2] + run
    outputs = sum(len(r["output"]) for r in records)
    return [f"Prompt lookup's matches in the {outputs} output tokens (up to {longest} tokens copied):", "",
            "| match length | positions | first token right | tokens the output follows, mean |", "|---|---|---|---|",
            *(f"| {'3+' if n == 3 else n} | {c} | {right / c:.2f} | {run / c:.2f} |"
              for n, (c, right, run) in sorted(by_length.items()))]


def hindsight_rules(records: list[dict], cost) -> list[str]:
    """The best fixed rule for sizing prompt lookup's proposals, chosen knowing the outputs: verify
    `gamma` copied tokens wherever lookup matches at least `min_match` tokens, none elsewhere; each
    rule's speedup over plain decoding, prefill included, its forwards costed by `cost(rows, cached)`
    (the replayed target's) with no loop time. Where the best rule gains little, so does any policy
    over these proposals that does not know the target's answer."""
    from specdecode import PromptLookupDrafter

    def rate(min_match: int, gamma: int) -> float:
        tokens = seconds = 0.0
        for rec in records:
            seq, start, lookup = rec["prompt"] + rec["output"], len(rec["prompt"]), PromptLookupDrafter()
            seconds, tokens, t = seconds + rec["prefill_seconds"], tokens + 1, start + 1  # the prefill's token
            while t < len(seq):
                n, copied = lookup.match(seq[:t], gamma)
                copied = copied if gamma and n >= min_match else []
                run = followed(copied, seq, t)
                seconds += cost(len(copied) + 1, t)
                step = min(run + 1, len(seq) - t)
                tokens, t = tokens + step, t + step
        return tokens / seconds

    plain = rate(1, 0)
    rules = {(m, g): rate(m, g) / plain for m in (1, 2, 3) for g in (1, 2, 4, 8)}
    best = max(rules, key=rules.get)
    return ["The best fixed rule for lookup's proposals, chosen in hindsight (`hindsight_rules`; speedup over "
            "plain, prefill included, no loop time): "
            f"gamma {best[1]} wherever lookup matches {best[0]}+ tokens, {rules[best]:.3f}x. Rows: the match "
            "lookup needs; columns: gamma.", "",
            "| match | " + " | ".join(f"gamma {g}" for g in (1, 2, 4, 8)) + " |", "|---|---|---|---|---|",
            *(f"| {m}+ | " + " | ".join(f"{rules[(m, g)]:.3f}x" for g in (1, 2, 4, 8)) + " |" for m in (1, 2, 3))]


def record_outputs(target, prompts, params, max_new_tokens: int, path: Path) -> list[dict]:
    from specdecode import autoregressive_decode, encode_prompt

    if path.exists():
        return json.loads(path.read_text())
    records = []
    for prompt in prompts:
        ids = encode_prompt(target.tokenizer, prompt.text)
        best = float("inf")
        for _ in range(3):  # the prompt's prefill, quickest of three
            cache = target.new_cache()
            began = time.perf_counter()
            target.forward(torch.tensor([ids]), cache, num_logits=1)
            best = min(best, time.perf_counter() - began)
        steps = autoregressive_decode(target, ids, params=params, max_new_tokens=max_new_tokens)
        output = [t for step in steps for t in step.tokens]
        records.append({"category": prompt.category, "prompt": ids, "output": output, "prefill_seconds": best})
    path.write_text(json.dumps(records))
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default=str(SPEC_BENCH))
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--categories", nargs="*", default=CATEGORIES)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--drafts", nargs="+", default=["lookup", "auto", "pool", "oracle"])
    parser.add_argument("--repetition-penalty", type=float, default=0.0,
                        help="greedy under this repetition penalty (0: none), recorded and replayed")
    parser.add_argument("--repeat-last-n", type=int, default=-1,
                        help="the tokens the penalty reads: -1 prompt and output (vLLM's), n the last n (llama.cpp's)")
    parser.add_argument("--records", default=None,
                        help="the recorded outputs (made on the first run, reused after; default in /tmp)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from specdecode import SamplingParams, autoregressive_decode
    from specdecode.bench.prompts import load_prompts
    from specdecode.decode import speculative_decode
    from specdecode import defaults
    from specdecode.drafters.spec import built_in, make_drafter
    from specdecode.gamma import AUTO, FixedGamma, as_policy
    from specdecode.models.load import load_model
    from specdecode.models.profile import profile_model

    real = load_model(None, backend="native")
    profile = profile_model(real)
    prompts = load_prompts(args.prompts, categories=args.categories, per_category=args.per_category)
    penalty = args.repetition_penalty
    window = args.repeat_last_n
    controls = {"repetition_penalty": penalty, **({"repeat_last_n": window} if window >= 0 else {})} if penalty else {}
    greedy = SamplingParams(temperature=0, **controls)
    records = args.records or f"/tmp/draft_replay-{len(prompts)}-{args.max_new_tokens}-{penalty:g}-{window}.json"
    records = record_outputs(real, prompts, greedy, args.max_new_tokens, Path(records))

    template = as_policy(AUTO, real)  # what `--gamma auto` plans with, made afresh for each prompt
    kinds = {name: built_in(name) for name in args.drafts if not name.startswith("oracle")}
    # what a server's requests share (the n-gram pool, earlier outputs): made once, fed by every prompt
    memory = {name: kind.memory(real, defaults.MAX_GAMMA) if kind.memory else None for name, kind in kinds.items()}
    from specdecode.drafters.pool import NgramPool
    from specdecode.drafters.suffix import SuffixCache

    shared = (NgramPool(), SuffixCache())  # oracle-all's: fed by every prompt, as a server's

    results = {name: {} for name in ["plain", *args.drafts]}  # name -> category -> [tokens, seconds]
    loop = {name: [0, 0.0] for name in results}  # name -> [target calls, seconds outside the forwards]
    for rec in records:
        record = rec["prompt"] + rec["output"]
        for name in results:
            clock = Clock()
            target = ReplayTarget(real, profile, record, len(rec["prompt"]), rec["prefill_seconds"], clock)
            start = clock()
            if name == "plain":
                steps = autoregressive_decode(target, rec["prompt"], params=greedy, max_new_tokens=args.max_new_tokens)
            else:
                if name.startswith("oracle"):
                    drafter, gamma = Oracle(record, shared if name == "oracle-all" else None), FixedGamma(16)
                else:
                    drafter, gamma = make_drafter(name, real, memory=memory[name]), template.fresh()
                steps = speculative_decode(target, drafter, rec["prompt"], gamma=gamma, params=greedy,
                                           max_new_tokens=args.max_new_tokens, clock=clock)
            tokens = [t for step in steps for t in step.tokens]
            seconds = clock() - start
            if tokens != rec["output"]:
                raise SystemExit(f"{name}: the replayed output differs from the record")
            total = results[name].setdefault(rec["category"], [0, 0.0])
            total[0] += len(tokens)
            total[1] += seconds
            loop[name][0] += target.calls
            loop[name][1] += seconds - target.modeled

    def rate(name, category=None):
        rows = results[name].values() if category is None else [results[name][category]]
        return sum(r[0] for r in rows) / sum(r[1] for r in rows)

    names = list(results)
    lines = [f"Command: `python benchmarks/draft_replay.py {' '.join(sys.argv[1:])}`", "",
             f"Host: {cpu_model()}; target {real.name}, kernels {real.kernel_plan}; profile T(1) "
             f"{1e3 * profile.step_seconds:.2f} ms, T(k)/T(1) k = 2..8: "
             + " ".join(f"{r:.2f}" for r in profile.verify_ratios[2:9])
             + f"; {len(records)} Spec-Bench prompts, greedy"
             + (f" under a repetition penalty of {penalty:g} over "
                + ("prompt and output" if window < 0 else f"the last {window} tokens") if penalty else "") + f", {args.max_new_tokens} tokens; {time.strftime('%Y-%m-%d')}.",
             "", "Replayed tokens/s (prefill included) and each draft's over replayed plain:", "",
             "| category | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for category in [*dict.fromkeys(r["category"] for r in records), None]:
        plain = rate("plain", category)
        cells = [f"{plain:.1f}"] + [f"{rate(n, category) / plain:.2f}x" for n in names[1:]]
        lines.append(f"| {category or 'all'} | " + " | ".join(cells) + " |")
    lines += ["", "The loop's own time a target call (drafting, controls, verification, bookkeeping: everything "
              "but the replayed forward), microseconds: "
              + ", ".join(f"{n} {1e6 * loop[n][1] / loop[n][0]:.0f}" for n in names) + ".", "", *copy_runs(records), "",
              *hindsight_rules(records, forward_cost(profile))]
    publish(lines, args.out)


if __name__ == "__main__":
    main()
