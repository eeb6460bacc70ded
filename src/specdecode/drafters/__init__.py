from ..lazy import lazy_exports

_EXPORTS = {"BaseDrafter": ".base", "Draft": ".base", "Drafter": ".base", "LookupThenModelDrafter": ".hybrid",
            "PromptLookupDrafter": ".lookup", "ModelDrafter": ".model", "NgramDrafter": ".ngram",
            "SuffixCache": ".suffix", "SuffixDrafter": ".suffix"}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
