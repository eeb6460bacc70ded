"""One place that turns a draft spec into a drafter, for the CLI, the benchmark and the server.

    lookup            prompt lookup (copy from the context)
    auto              the model-free source that prices best before each call, chosen per call: prompt
                      lookup, the shared n-gram pool, or lookup continued by the pool (`drafters.auto`)
    pool              the n-gram pool every request feeds and drafts from: long chains where earlier
                      requests or this one repeat (`drafters.pool`; llama.cpp's ngram-mod family)
    suffix            suffix drafting: the most frequent continuation of the longest earlier match, in
                      the context or (with a shared cache) in earlier outputs
    ngram:FILE.npz    an n-gram model fitted with `specdecode ngram fit`
    trained           the draft network shipped for the embedded target
    eagle             the feature draft shipped for the embedded target (native backend: it reads the
                      target's own features, `drafters.eagle`)
    eagle:PATH        a feature draft trained by `specdecode distill --eagle`
    PATH              a draft model: a .gguf file, a transformers directory, or a `distill` output; one
                      with another tokenizer than the target's drafts its text re-tokenised for the
                      target when greedy, among the tokens both share when sampling
                      (`cross.CrossVocabDrafter`)
    text:PATH         a draft model with another tokenizer whose greedy text is re-tokenised for the
                      target whatever the sampling (`cross.TextDrafter`)
    lookup+MODEL      prompt lookup where the text repeats, MODEL (trained, eagle[:PATH] or a PATH) elsewhere
    module:Name       a drafter of your own: `Name` in an importable module (the current directory
                      is searched first), a class or function called with the target model (with
                      nothing where it has no required argument) that returns a `Drafter`
    NAME              a drafter a package registers under the `specdecode.drafters` entry point group
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the command line's parser reads this module's names without importing torch
    from ..models.base import Model

LOOKUP = "lookup"
SUFFIX = "suffix"
AUTO = "auto"
POOL = "pool"
REMEMBERS = (SUFFIX, POOL, AUTO)  # drafters whose memory of earlier requests a server shares among requests
MODEL_FREE = (LOOKUP, AUTO, POOL, SUFFIX)
TRAINED = "trained"
EAGLE = "eagle"
HYBRID = "lookup+"
NGRAM = "ngram:"
TEXT = "text:"
ENTRY_POINTS = "specdecode.drafters"
DRAFTER_NAMES = ("lookup, auto, pool, suffix, trained, eagle, eagle:DIR, ngram:FILE.npz, lookup+MODEL, text:PATH, "
                 "module:Name, or a draft model's path (a .gguf file or a transformers directory)")
_USER = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")  # module:Name (or module:Class.method)


def _names_eagle(spec: str) -> bool:
    return spec == EAGLE or spec.startswith(EAGLE + ":")


def _registered(name: str):
    """The entry point a package registered under `name` in the `specdecode.drafters` group, or None."""
    return next((ep for ep in entry_points(group=ENTRY_POINTS) if ep.name == name), None)


def user_drafter_factory(spec: str):
    """The callable a `module:Name` spec or a registered entry-point name names."""
    if ":" not in spec:
        return _registered(spec).load()
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"cannot import the drafter module {module_name!r} of --draft {spec}: {err}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"--draft {spec}: {module_name} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"--draft {spec}: {attr} is not a class or function")  # noqa: TRY004 (a bad option)
    return obj


def build_user_drafter(spec: str, target: Model):
    """A user's drafter: its factory called with the target where it has a required argument, else
    with nothing; checked against the `Drafter` protocol."""
    factory = user_drafter_factory(spec)
    try:
        takes_target = any(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                           for p in inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):  # a builtin or C callable: assume it takes the target
        takes_target = True
    drafter = factory(target) if takes_target else factory()
    from .base import check_drafter

    try:
        check_drafter(drafter)
    except TypeError as err:
        raise ValueError(f"--draft {spec}: {err}") from None
    return drafter


@dataclass(frozen=True)
class DraftSpec:
    """How to build a drafter; a draft model loads with the target's settings unless `backend` says otherwise."""

    spec: str = LOOKUP
    backend: str | None = None  # the draft model's backend (default: the target's)
    min_confidence: float = 0.0  # a model drafter stops proposing below this top probability

    def __post_init__(self) -> None:
        if not isinstance(self.spec, str) or not self.spec.strip():
            raise ValueError("the draft spec is empty; use 'lookup', 'auto', 'pool', 'suffix', 'trained', 'ngram:FILE', "
                             "lookup+MODEL or a path")
        if self.spec.startswith(NGRAM) and not self.spec[len(NGRAM):]:
            raise ValueError("ngram: needs a file, e.g. ngram:bigram.npz")
        if self.spec.startswith(HYBRID) and not self.spec[len(HYBRID):]:
            raise ValueError("lookup+ needs a draft model, e.g. lookup+trained")
        if self.spec.startswith(EAGLE + ":") and not self.spec[len(EAGLE) + 1:]:
            raise ValueError("eagle: needs a feature draft directory, e.g. eagle:my-eagle (or 'eagle' for the "
                             "shipped one)")
        if self.spec.startswith(TEXT) and not self.spec[len(TEXT):]:
            raise ValueError("text: needs a draft model path, e.g. text:draft.gguf")
        if not (0.0 <= self.min_confidence < 1.0):
            raise ValueError(f"min_confidence must be in [0, 1), got {self.min_confidence}")
        path = self.model_path
        if path is not None and not os.path.exists(os.path.expanduser(path)):
            from ..models.files import existing_model_path

            try:
                existing_model_path(path)  # its sentence: no such path, or a hub id
            except FileNotFoundError as err:
                raise ValueError(f"--draft {self.spec}: no drafter has that name, and {err}. The drafters: "
                                 f"{DRAFTER_NAMES}") from None

    @property
    def is_eagle(self) -> bool:
        """The feature draft (shipped, or eagle:PATH)."""
        return _names_eagle(self.spec)

    @property
    def is_user(self) -> bool:
        """A drafter of the user's own (module:Name, or a registered entry-point name), not a path."""
        if self.spec in (*MODEL_FREE, TRAINED) or self.spec.startswith((NGRAM, HYBRID, TEXT)) or self.is_eagle:
            return False
        if os.path.exists(self.spec):
            return False
        return bool(_USER.fullmatch(self.spec)) or _registered(self.spec) is not None

    @property
    def model_path(self) -> str | None:
        """The draft model this spec loads, or None for a drafter without one."""
        if self.spec in MODEL_FREE or self.spec.startswith(NGRAM) or self.is_user:
            return None
        path = self.spec
        for prefix in (HYBRID, TEXT):
            path = path[len(prefix):] if path.startswith(prefix) else path
        if _names_eagle(path):  # eagle, lookup+eagle: no draft model to load
            return None
        if path == TRAINED:
            from ..models.default import trained_draft_path

            return str(trained_draft_path())
        return path


def load_draft_model(path: str, target: Model, backend: str = "auto", dtype: str = "auto",
                     device: str | None = None, threads: int | None = None) -> Model:
    """A draft model by path ('trained' for the shipped one). One with another vocabulary than the
    target's must be able to read text (both have tokenizers, and they share tokens)."""
    from ..models.load import load_model
    from .cross import VocabMap

    if path == TRAINED:
        path = DraftSpec(TRAINED).model_path
    draft = load_model(path, backend, dtype, device, threads, choose_by_speed=False)
    if draft.vocab.fingerprint != target.vocab.fingerprint:
        VocabMap.between(target, draft)  # refuses a pair that cannot draft for each other, naming why
    return draft


def model_drafter(spec: DraftSpec, target: Model, draft_model: Model):
    """The drafter around a loaded draft model: its own ids where it shares the target's vocabulary,
    else its re-tokenised text when greedy and the shared tokens (TLI) when sampling, or, for
    text:PATH, its re-tokenised text always."""
    from .cross import CrossVocabDrafter, TextDrafter, VocabMap
    from .model import ModelDrafter

    if spec.spec.removeprefix(HYBRID).startswith(TEXT):
        return TextDrafter(draft_model, target.tokenizer, VocabMap.between(target, draft_model))
    if draft_model.vocab.fingerprint == target.vocab.fingerprint:
        return ModelDrafter(draft_model, min_confidence=spec.min_confidence)
    return CrossVocabDrafter(draft_model, target.tokenizer, VocabMap.between(target, draft_model))


def make_drafter(spec: DraftSpec | str, target: Model, draft_model: Model | None = None, *, backend: str = "auto",
                 dtype: str = "auto", device: str | None = None, threads: int | None = None,
                 suffix_cache=None, pool=None, pricing=None):
    """The drafter a spec names. `draft_model` reuses an already loaded draft model (a server builds
    a fresh drafter per request around one loaded model); else it is loaded with these settings.
    `suffix_cache` (a `SuffixCache`) is the memory of earlier outputs a suffix drafter shares, `pool`
    (an `NgramPool`) the one a pool or auto drafter shares; `pricing` (an `AdaptiveGamma`) the
    verification curve auto prices its sources by (default: the target's, `gamma.as_policy`)."""
    from ..models.base import capabilities
    from . import LookupThenModelDrafter, NgramDrafter, PromptLookupDrafter, SuffixDrafter

    spec = spec if isinstance(spec, DraftSpec) else DraftSpec(spec)
    if spec.spec == LOOKUP:
        return PromptLookupDrafter()
    trees = capabilities(target).supports_trees  # where the target verifies them in one call, else chains
    if spec.spec == SUFFIX:
        return SuffixDrafter(suffix_cache, trees=trees)
    if spec.spec == POOL:
        from .pool import PoolDrafter

        return PoolDrafter(pool)
    if spec.spec == AUTO:
        from ..gamma import AUTO as MEASURED, as_policy
        from .auto import AutoDrafter

        return AutoDrafter(pool, pricing=pricing if pricing is not None else as_policy(MEASURED, target))
    if spec.spec.startswith(NGRAM):
        return NgramDrafter.load(spec.spec[len(NGRAM):], trees=trees)
    if spec.is_user:
        return build_user_drafter(spec.spec, target)
    inner = DraftSpec(spec.spec[len(HYBRID):]) if spec.spec.startswith(HYBRID) else spec
    if inner.is_eagle:
        from .eagle import EagleDrafter

        drafter = EagleDrafter.load(target, inner.spec[len(EAGLE) + 1:] or None)
        return LookupThenModelDrafter(drafter) if inner is not spec else drafter
    if draft_model is None:
        draft_model = load_draft_model(spec.model_path, target, spec.backend or backend, dtype, device, threads)
    drafter = model_drafter(spec, target, draft_model)
    return LookupThenModelDrafter(drafter) if spec.spec.startswith(HYBRID) else drafter
