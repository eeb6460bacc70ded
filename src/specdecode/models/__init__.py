from ..lazy import lazy_exports

__all__ = ["Cache", "Model", "Vocabulary", "VocabularyMismatch", "check_same_vocab"]
__getattr__ = lazy_exports(__name__, {name: ".base" for name in __all__})
