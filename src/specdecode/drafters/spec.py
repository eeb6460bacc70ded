"""One place that turns a draft spec into a drafter, for the CLI, the benchmark and the server.

`KINDS` is the table of what a spec can name: its spelling, one line on what it does, and, for a
drafter without a draft model, how it is built and what one server draft shares among its
requests. The command line's help, the error for an unknown name, the server's shared memories
and Ray's routing all read it; a new built-in drafter is one entry there.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Callable

from .. import defaults

if TYPE_CHECKING:  # the command line's parser reads this module's names without importing torch
    from ..models.base import Model

LOOKUP = "lookup"
SUFFIX = "suffix"
AUTO = "auto"
POOL = "pool"
TRAINED = "trained"
EAGLE = "eagle"
HYBRID = "lookup+"
NGRAM = "ngram:"
TEXT = "text:"
ENTRY_POINTS = "specdecode.drafters"


def _trees(target: Model) -> bool:
    """Whether the target verifies a tree in one call (else a drafter proposes chains)."""
    from ..models.base import capabilities

    return capabilities(target).supports_trees


def _lookup(argument: str, target: Model, memory):
    from .lookup import PromptLookupDrafter

    return PromptLookupDrafter()


def _suffix(argument: str, target: Model, memory):
    from .suffix import SuffixDrafter

    return SuffixDrafter(memory, trees=_trees(target))


def _suffix_memory(target: Model, max_gamma: int):
    from .suffix import SuffixCache

    return SuffixCache()


def _pool(argument: str, target: Model, memory):
    from .pool import PoolDrafter

    return PoolDrafter(memory)


def _pool_memory(target: Model, max_gamma: int):
    from .pool import NgramPool

    return NgramPool()


def _auto(argument: str, target: Model, memory):
    from ..gamma import AUTO as MEASURED, as_policy
    from .auto import AutoDrafter

    pool, pricing = memory if memory is not None else (None, as_policy(MEASURED, target))
    return AutoDrafter(pool, pricing=pricing)


def _auto_memory(target: Model, max_gamma: int):
    """The pool, and the target's verification curve (measured once) that prices auto's sources."""
    from ..gamma import AUTO as MEASURED, as_policy

    return _pool_memory(target, max_gamma), as_policy(MEASURED, target, max_gamma)


def _auto_alone(memory):
    """A request drafting from itself alone: a pool of its own, the shared curve (read only) to price by."""
    return None, memory[1]


def _ngram(argument: str, target: Model, memory):
    from .ngram import NgramDrafter

    return NgramDrafter.load(argument, trees=_trees(target))


@dataclass(frozen=True)
class Kind:
    """One kind of drafter a spec names.

    usage:   its spelling: a name ('lookup'), a prefix and its argument ('ngram:FILE.npz'), or a
             placeholder for what is matched last (PATH, module:Name, NAME)
    summary: what it does, in one line
    build:   (argument after the prefix, target, memory) -> Drafter, for a drafter without a draft
             model; None where the spec names a draft model or a drafter of the user's own
    memory:  (target, max_gamma) -> what every request of one server draft shares (earlier
             outputs, an n-gram pool); None for a drafter that remembers nothing between requests.
             `build` gets None in its place when a drafter keeps its own memory (library, CLI).
    alone:   (the shared memory) -> what `build` gets for a request that must draft from itself alone
             (none of what other requests left); None: None, a memory of its own.
    """

    usage: str
    summary: str
    build: Callable[[str, Model, Any], Any] | None = None
    memory: Callable[[Model, int], Any] | None = None
    alone: Callable[[Any], Any] | None = None

    @property
    def prefix(self) -> str | None:
        """'ngram:' for 'ngram:FILE.npz'; None for a plain name."""
        head, colon, _ = self.usage.partition(":")
        return head + colon if colon else None

    def matches(self, spec: str) -> bool:
        return spec.startswith(self.prefix) if self.prefix else spec == self.usage


KINDS: tuple[Kind, ...] = (
    Kind(LOOKUP, "prompt lookup: copies what followed the latest match of the context's last tokens", _lookup),
    Kind(AUTO, "the model-free source that prices best under the target's measured speed before each "
         "call: prompt lookup or the shared n-gram pool (the default)", _auto, _auto_memory, _auto_alone),
    Kind(POOL, "the n-gram pool every request feeds and drafts from: long chains where earlier requests "
         "or this one repeat (llama.cpp's ngram-mod family)", _pool, _pool_memory),
    Kind(SUFFIX, "suffix drafting: the most frequent continuation of the longest earlier match, in the "
         "context or (served) in earlier outputs", _suffix, _suffix_memory),
    Kind(NGRAM + "FILE.npz", "an n-gram model fitted with `specdecode ngram fit`", _ngram),
    Kind(TRAINED, "the draft network shipped for the embedded target"),
    Kind(EAGLE, "the feature draft shipped for the embedded target (native backend: it reads the "
         "target's own features)"),
    Kind(EAGLE + ":DIR", "a feature draft trained by `specdecode distill --eagle`"),
    Kind("PATH", "a draft model: a .gguf file, a transformers directory or a `distill` output; one with "
         "another tokenizer drafts its text re-tokenised when greedy, the tokens both share when sampling"),
    Kind(TEXT + "PATH", "a draft model with another tokenizer whose greedy text is re-tokenised for the "
         "target whatever the sampling"),
    Kind(HYBRID + "MODEL", "prompt lookup where the text repeats, MODEL (trained, eagle[:DIR] or a PATH) "
         "elsewhere, e.g. lookup+trained"),
    Kind("module:Name", "a drafter of your own: a class or function in an importable module (the current "
         "directory first), called with the target where it takes an argument, returning a Drafter"),
    Kind("NAME", "a drafter a package registers under the `specdecode.drafters` entry point group"),
)


def drafter_names() -> str:
    """Every spelling a spec may take, for messages that list them."""
    return ", ".join(kind.usage for kind in KINDS)


def built_in(spec: str) -> Kind | None:
    """The kind of a drafter without a draft model that `spec` names, or None."""
    return next((kind for kind in KINDS if kind.build is not None and kind.matches(spec)), None)


def remembers(spec: str) -> bool:
    """Whether a server shares this drafter's memory among the requests that use it."""
    kind = built_in(spec)
    return kind is not None and kind.memory is not None


def help_text() -> str:
    """The drafters as the command line's help lists them."""
    return "; ".join(f"{kind.usage}: {kind.summary}" for kind in KINDS)


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

    spec: str = defaults.DRAFT
    backend: str | None = None  # the draft model's backend (default: the target's)
    min_confidence: float = 0.0  # a model drafter stops proposing below this top probability

    def __post_init__(self) -> None:
        if not isinstance(self.spec, str) or not self.spec.strip():
            raise ValueError(f"the draft spec is empty; the drafters: {drafter_names()}")
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
                                 f"{drafter_names()}") from None

    @property
    def is_eagle(self) -> bool:
        """The feature draft (shipped, or eagle:PATH)."""
        return _names_eagle(self.spec)

    @property
    def is_user(self) -> bool:
        """A drafter of the user's own (module:Name, or a registered entry-point name), not a path."""
        if built_in(self.spec) or self.spec == TRAINED or self.spec.startswith((HYBRID, TEXT)) or self.is_eagle:
            return False
        if os.path.exists(self.spec):
            return False
        return bool(_USER.fullmatch(self.spec)) or _registered(self.spec) is not None

    @property
    def model_path(self) -> str | None:
        """The draft model this spec loads, or None for a drafter without one."""
        if built_in(self.spec) or self.is_user:
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
                 dtype: str = "auto", device: str | None = None, threads: int | None = None, memory=None):
    """The drafter a spec names. `draft_model` reuses an already loaded draft model (a server builds
    a fresh drafter per request around one loaded model); else it is loaded with these settings.
    `memory` is what the requests of one server draft share, made once by its kind's `memory`
    (None: the drafter keeps its own)."""
    from .hybrid import LookupThenModelDrafter

    spec = spec if isinstance(spec, DraftSpec) else DraftSpec(spec)
    kind = built_in(spec.spec)
    if kind is not None:
        return kind.build(spec.spec[len(kind.prefix or ""):], target, memory)
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
