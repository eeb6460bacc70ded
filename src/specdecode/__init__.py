"""specdecode: lossless speculative decoding (Leviathan, Kalman, Matias 2023; Chen et al. 2023)."""

from .lazy import lazy_exports

_EXPORTS = {"AdaptiveGamma": ".gamma", "FixedGamma": ".gamma", "GammaPolicy": ".gamma",
            "Step": ".decode", "autoregressive_decode": ".decode", "speculative_decode": ".decode",
            "Draft": ".drafters", "Drafter": ".drafters", "LookupThenModelDrafter": ".drafters",
            "ModelDrafter": ".drafters", "PromptLookupDrafter": ".drafters", "Stats": ".stats",
            "TextStep": ".text", "encode_prompt": ".prompts", "generate": ".text", "SamplingParams": ".sampling",
            "Verdict": ".verify", "verify": ".verify", "Grammar": ".grammar"}
__getattr__ = lazy_exports(__name__, _EXPORTS)

__version__ = "0.1.0"

__all__ = [
    "AdaptiveGamma", "Draft", "FixedGamma", "GammaPolicy", "Grammar", "Drafter", "LookupThenModelDrafter", "ModelDrafter", "PromptLookupDrafter", "SamplingParams", "Stats", "Step",
    "TextStep", "Verdict", "autoregressive_decode", "encode_prompt", "generate", "speculative_decode", "verify",
]
