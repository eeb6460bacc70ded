"""specdecode: lossless speculative decoding (Leviathan, Kalman, Matias 2023; Chen et al. 2023)."""

from .gamma import AdaptiveGamma, FixedGamma, GammaPolicy
from .decode import Step, autoregressive_decode, speculative_decode
from .drafters import Draft, Drafter, LookupThenModelDrafter, ModelDrafter, PromptLookupDrafter
from .stats import Stats
from .text import TextStep, encode_prompt, generate
from .sampling import SamplingParams
from .verify import Verdict, verify

__version__ = "0.1.0"

__all__ = [
    "AdaptiveGamma", "Draft", "FixedGamma", "GammaPolicy", "Drafter", "LookupThenModelDrafter", "ModelDrafter", "PromptLookupDrafter", "SamplingParams", "Stats", "Step",
    "TextStep", "Verdict", "autoregressive_decode", "encode_prompt", "generate", "speculative_decode", "verify",
]
