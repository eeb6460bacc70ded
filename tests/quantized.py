"""Weights made the way quantised GGUF files hold them."""

import torch

from specdecode.models.native.source import Groups6, GroupsK


def q4_grid(out_features, in_features, gen):
    """A weight made the way a Q4_1 file holds it: 4-bit values q, w = d q + m per 32 inputs, d and m
    float16."""
    q = torch.randint(0, 16, (out_features, in_features // 32, 32), generator=gen).float()
    q[..., 0], q[..., 1] = 0, 15  # Q4_1 maps each group's minimum to 0 and its maximum to 15
    d = (torch.rand(out_features, in_features // 32, 1, generator=gen) * 0.01 + 1e-3).half().float()
    m = (-torch.rand(out_features, in_features // 32, 1, generator=gen) * 0.05).half().float()
    return (q * d + m).view(out_features, in_features)


def k_groups(out_features, in_features, gen, bits=4):
    """4- or 5-bit groups made the way a Q4_K or Q5_K file holds them: per 256 inputs a float16 d and
    dmin, per 32 a 6-bit scale sc and min m: w = (d sc) q - (dmin m), the coefficients exact in float32
    only."""
    blocks = in_features // 256
    d = (torch.rand(out_features, blocks, generator=gen) * 1e-3 + 1e-4).half()
    dmin = (torch.rand(out_features, blocks, generator=gen) * 1e-3 + 1e-4).half()
    sc = torch.randint(1, 64, (out_features, blocks * 8), generator=gen).to(torch.uint8)
    mn = torch.randint(0, 64, (out_features, blocks * 8), generator=gen).to(torch.uint8)
    q = torch.randint(0, 1 << bits, (out_features, in_features), generator=gen).to(torch.uint8)
    return GroupsK(q, d, dmin, sc, mn)


def q6k_groups(out_features, in_features, gen):
    """Groups made the way a Q6_K file holds them: per 256 inputs a float16 d, per 16 an int8 scale
    sc, values q - 32 in -32..31: w = (d sc) (q - 32), the scales exact in float32."""
    blocks = in_features // 256
    d = (torch.rand(out_features, blocks, generator=gen) * 1e-3 + 1e-4).half().float()
    sc = torch.randint(-128, 128, (out_features, blocks * 16), generator=gen).to(torch.int8)
    q = torch.randint(-32, 32, (out_features, in_features), generator=gen).to(torch.int8)
    return Groups6(q, d, sc)
