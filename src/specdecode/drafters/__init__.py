from .base import BaseDrafter, Draft, Drafter
from .hybrid import LookupThenModelDrafter
from .lookup import PromptLookupDrafter
from .model import ModelDrafter
from .ngram import NgramDrafter
from .suffix import SuffixCache, SuffixDrafter

__all__ = ["BaseDrafter", "Draft", "Drafter", "LookupThenModelDrafter", "ModelDrafter", "NgramDrafter", "PromptLookupDrafter", "SuffixCache",
           "SuffixDrafter"]
