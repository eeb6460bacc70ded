"""Benchmark harness over prompt sets (Spec-Bench layout)."""
