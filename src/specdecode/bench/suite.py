"""What a `specdecode bench` run compares and where its results go: the methods, one drafter factory
per method, the anchor models, and the written report (results.md / .json, two charts)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from ..drafters import LookupThenModelDrafter, ModelDrafter, PromptLookupDrafter, SuffixDrafter
from ..models.base import capabilities
from .report import markdown, plot_speedups, plot_timeline
from .runner import Method, run_record


@dataclass
class Suite:
    """methods: in run order, the baseline first; drafters: method name -> a fresh drafter (None:
    plain decoding) for every run; anchors: "hf" / "llama.cpp" -> the model the engine's own
    generate() runs on (absent: the target), "assistant" -> the draft for transformers' assisted
    generation; contexts: llama.cpp contexts the anchors open once, kept for the run."""

    methods: list[Method]
    drafters: dict[str, Callable[[], object]]
    anchors: dict[str, object] = field(default_factory=dict)
    contexts: dict = field(default_factory=dict)


def plan_suite(target, backend: str, gammas, draft_model=None, draft_spec: str | None = None,
               ngram: str | None = None, suffix: bool = False, eagle: str | None = None, anchors: bool = True,
               anchor_lookup_tokens: int = 10, load_anchor: Callable[[str], object] | None = None) -> Suite:
    """The methods for a target on `backend`: baseline, prompt lookup at each gamma, then suffix
    drafting (each run on its own), an n-gram file, the feature draft (`eagle`: a directory, or ""
    for the shipped one), a draft model (alone and after lookup), and the
    engines' own generate() as anchors. On
    the native backend the anchors run the same file on transformers and llama.cpp, loaded by
    `load_anchor(backend)`."""
    from ..drafters.spec import HYBRID, NGRAM, DraftSpec, make_drafter, model_drafter

    methods = [Method("baseline")] + [Method("lookup", g) for g in gammas]
    drafters: dict[str, Callable[[], object]] = {"baseline": lambda: None, "lookup": PromptLookupDrafter}
    if ngram:
        make_drafter(NGRAM + ngram, target)  # fail before any run on a bad file
        drafters["ngram"] = lambda: make_drafter(NGRAM + ngram, target)  # fresh counts for every run
        methods += [Method("ngram", g) for g in gammas]
    if suffix:
        trees = capabilities(target).supports_trees  # trees where the target verifies them, else chains
        drafters["suffix"] = lambda: SuffixDrafter(trees=trees)  # a fresh one a run: no memory of earlier prompts
        methods += [Method("suffix", g) for g in gammas]
    if eagle is not None:  # "" for the shipped feature draft; loaded once, a fresh drafter (cache) a run
        from ..drafters.eagle import EagleDrafter

        feature_draft = EagleDrafter.load(target, eagle or None).draft
        drafters["eagle"] = lambda: EagleDrafter(feature_draft)
        drafters["lookup+eagle"] = lambda: LookupThenModelDrafter(EagleDrafter(feature_draft))
        methods += [Method("eagle", g) for g in gammas] + [Method("lookup+eagle", g) for g in gammas]
    suite = Suite(methods, drafters)
    if draft_model is not None:
        drafters["draft"] = lambda: model_drafter(DraftSpec(draft_spec), target, draft_model)
        drafters["lookup+draft"] = lambda: make_drafter(HYBRID + draft_spec, target, draft_model=draft_model)
        methods += [Method("draft", g) for g in gammas] + [Method("lookup+draft", g) for g in gammas]
    if not anchors:
        return suite
    lookup = anchor_lookup_tokens
    if backend in ("hf", "native"):
        methods += [Method("hf")] + ([Method("hf-lookup", lookup)] if lookup else [])
        if draft_model is not None and hasattr(draft_model, "model"):  # a transformers draft: assisted decoding
            methods.append(Method("hf-assisted"))
            suite.anchors["assistant"] = draft_model
    if backend in ("llama.cpp", "native"):
        methods += [Method("llama.cpp")] + ([Method("llama.cpp-lookup", lookup)] if lookup else [])
    if backend == "native":  # the anchors run the same GGUF on their own runtimes
        suite.anchors.update({name: load_anchor(name) for name in ("hf", "llama.cpp")})
    return suite


def write_results(out: Path, runs, rows, meta: dict, header: str) -> str:
    """results.json (meta, rows, every run), results.md (header + table), speedup.png and
    timeline.png under `out`; returns the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(
        dict(meta=meta, rows=[asdict(r) for r in rows], runs=[run_record(r) for r in runs]), indent=1))
    text = header + markdown(rows)
    (out / "results.md").write_text(text)
    plot_speedups(rows, out / "speedup.png")
    plot_timeline(runs, out / "timeline.png")
    return text
