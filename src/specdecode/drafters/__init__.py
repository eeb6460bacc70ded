from .base import Draft, Drafter
from .lookup import PromptLookupDrafter
from .model import ModelDrafter
from .ngram import NgramDrafter

__all__ = ["Draft", "Drafter", "ModelDrafter", "NgramDrafter", "PromptLookupDrafter"]
