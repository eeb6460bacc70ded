from .base import Draft, Drafter
from .lookup import PromptLookupDrafter
from .model import ModelDrafter

__all__ = ["Draft", "Drafter", "ModelDrafter", "PromptLookupDrafter"]
