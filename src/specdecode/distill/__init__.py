"""Distilling a small draft model from a target: built prompts, target generations, training."""
