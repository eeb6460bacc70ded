"""Weights made the way quantised GGUF files hold them."""

import torch


def q4_grid(out_features, in_features, gen):
    """A weight made the way a Q4_1 file holds it: 4-bit values q, w = d q + m per 32 inputs, d and m
    float16."""
    q = torch.randint(0, 16, (out_features, in_features // 32, 32), generator=gen).float()
    q[..., 0], q[..., 1] = 0, 15  # Q4_1 maps each group's minimum to 0 and its maximum to 15
    d = (torch.rand(out_features, in_features // 32, 1, generator=gen) * 0.01 + 1e-3).half().float()
    m = (-torch.rand(out_features, in_features // 32, 1, generator=gen) * 0.05).half().float()
    return (q * d + m).view(out_features, in_features)
