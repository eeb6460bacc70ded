from .base import Cache, Model, Vocabulary, VocabularyMismatch, check_same_vocab

__all__ = ["Cache", "Model", "Vocabulary", "VocabularyMismatch", "check_same_vocab"]
