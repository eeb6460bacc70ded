"""One place that turns a draft spec into a drafter, for the CLI, the benchmark and the server.

    lookup            prompt lookup (copy from the context)
    suffix            suffix drafting: the most frequent continuation of the longest earlier match, in
                      the context or (with a shared cache) in earlier outputs
    ngram:FILE.npz    an n-gram model fitted with `specdecode ngram fit`
    trained           the draft network shipped for the embedded target
    PATH              a draft model: a .gguf file, a transformers directory, or a `distill` output
    lookup+MODEL      prompt lookup where the text repeats, MODEL (trained or a PATH) elsewhere
"""

from __future__ import annotations

from dataclasses import dataclass

from ..models.base import Model, capabilities, check_same_vocab

LOOKUP = "lookup"
SUFFIX = "suffix"
TRAINED = "trained"
HYBRID = "lookup+"
NGRAM = "ngram:"


@dataclass(frozen=True)
class DraftSpec:
    """How to build a drafter; a draft model loads with the target's settings unless `backend` says otherwise."""

    spec: str = LOOKUP
    backend: str | None = None  # the draft model's backend (default: the target's)
    min_confidence: float = 0.0  # a model drafter stops proposing below this top probability

    def __post_init__(self) -> None:
        if not isinstance(self.spec, str) or not self.spec.strip():
            raise ValueError("the draft spec is empty; use 'lookup', 'suffix', 'trained', 'ngram:FILE', lookup+MODEL "
                             "or a path")
        if self.spec.startswith(NGRAM) and not self.spec[len(NGRAM):]:
            raise ValueError("ngram: needs a file, e.g. ngram:bigram.npz")
        if self.spec.startswith(HYBRID) and not self.spec[len(HYBRID):]:
            raise ValueError("lookup+ needs a draft model, e.g. lookup+trained")
        if not (0.0 <= self.min_confidence < 1.0):
            raise ValueError(f"min_confidence must be in [0, 1), got {self.min_confidence}")

    @property
    def model_path(self) -> str | None:
        """The draft model this spec loads, or None for a drafter without one."""
        if self.spec in (LOOKUP, SUFFIX) or self.spec.startswith(NGRAM):
            return None
        path = self.spec[len(HYBRID):] if self.spec.startswith(HYBRID) else self.spec
        if path == TRAINED:
            from ..models.default import trained_draft_path

            return str(trained_draft_path())
        return path


def load_draft_model(path: str, target: Model, backend: str = "auto", dtype: str = "auto",
                     device: str | None = None, threads: int | None = None) -> Model:
    """A draft model by path ('trained' for the shipped one), checked against the target's vocabulary."""
    from ..models.load import load_model

    if path == TRAINED:
        path = DraftSpec(TRAINED).model_path
    draft = load_model(path, backend, dtype, device, threads, choose_by_speed=False)
    check_same_vocab(target.vocab, draft.vocab)
    return draft


def make_drafter(spec: DraftSpec | str, target: Model, draft_model: Model | None = None, *, backend: str = "auto",
                 dtype: str = "auto", device: str | None = None, threads: int | None = None,
                 suffix_cache=None):
    """The drafter a spec names. `draft_model` reuses an already loaded draft model (a server builds
    a fresh drafter per request around one loaded model); else it is loaded with these settings.
    `suffix_cache` (a `SuffixCache`) is the memory of earlier outputs a suffix drafter shares."""
    from . import LookupThenModelDrafter, ModelDrafter, NgramDrafter, PromptLookupDrafter, SuffixDrafter

    spec = spec if isinstance(spec, DraftSpec) else DraftSpec(spec)
    if spec.spec == LOOKUP:
        return PromptLookupDrafter()
    trees = capabilities(target).supports_trees  # where the target verifies them in one call, else chains
    if spec.spec == SUFFIX:
        return SuffixDrafter(suffix_cache, trees=trees)
    if spec.spec.startswith(NGRAM):
        return NgramDrafter.load(spec.spec[len(NGRAM):], trees=trees)
    if draft_model is None:
        draft_model = load_draft_model(spec.model_path, target, spec.backend or backend, dtype, device, threads)
    drafter = ModelDrafter(draft_model, min_confidence=spec.min_confidence)
    return LookupThenModelDrafter(drafter) if spec.spec.startswith(HYBRID) else drafter
