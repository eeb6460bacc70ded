"""The paper's analysis as tools: formulas, measured alpha and cost, plots."""

from .formulas import (acceptance, d_lk, expected_tokens, hardware_speedup, operations_increase, optimal_gamma,
                       speedup, verify_curve)

__all__ = ["acceptance", "d_lk", "expected_tokens", "hardware_speedup", "operations_increase", "optimal_gamma",
           "speedup", "verify_curve"]
