"""The feature draft network (EAGLE: Li et al. 2024, arXiv 2401.15077): one decoder layer that reads
the target's own features instead of learning the language from tokens.

At position t it takes f_t, the target's final-norm output there (what its LM head reads), and the
embedding of the next token x_{t+1}, and predicts f_{t+1}; the target's head, cut to the `kept`
most frequent tokens (FR-Spec, arXiv 2502.14856), reads the prediction out as the draft's q over
x_{t+2}. Drafting further feeds its own predictions back in place of f.

With `layers` (EAGLE-3: Li et al. 2025, arXiv 2503.01840) the draft also reads the target's lower
and middle features, its residual stream after those layers: at a real position, f_t is fused from
all of them, the top one being the final-norm output.

    f_t = fuse([norm(h_t^(l1)); ...; f_t])             [T, (n + 1) D] -> [T, D]   (with `layers` only)
    x = fc([embed(x_{t+1}); f_t])                      [T, 2D] -> [T, D]
    x = x + o(attend(rope(qkv(norm(x)))))              the target's heads, head size and RoPE
    x = x + down(silu(gate(norm(x))) * up(norm(x)))
    f_hat = norm(x)                                    [T, D]: the predicted f_{t+1}

This module holds the network in PyTorch (training, and the reference the native runner is tested
against) and its file: one safetensors file, its config in the metadata, float16 weights.
`drafters.eagle` runs it on the native kernels.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .native.kernels import TorchKernels, rotate_half

rms_norm = TorchKernels.rms_norm  # the native backend's reference RMSNorm

FILE = "eagle.safetensors"


@dataclass(frozen=True)
class EagleConfig:
    """The draft's shapes: the target's dim, heads, kv_heads, head_dim and norm eps; `hidden` its
    MLP's width; `kept` the head's tokens; `target` the name of the model it was trained on; `layers`
    the target layers whose outputs it fuses with the final-norm features (none: those alone)."""

    dim: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    eps: float
    kept: int
    target: str = ""
    layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(int(n) for n in self.layers))  # a list, read from JSON


class EagleNet(nn.Module):
    """The draft network (module docstring), in float32."""

    def __init__(self, config: EagleConfig) -> None:
        super().__init__()
        c = self.config = config
        qkv = (c.heads + 2 * c.kv_heads) * c.head_dim
        self.fc = nn.Linear(2 * c.dim, c.dim)
        self.attn_norm = nn.Parameter(torch.ones(c.dim))
        self.qkv = nn.Linear(c.dim, qkv, bias=False)
        self.o = nn.Linear(c.heads * c.head_dim, c.dim, bias=False)
        self.mlp_norm = nn.Parameter(torch.ones(c.dim))
        self.gate_up = nn.Linear(c.dim, 2 * c.hidden, bias=False)  # gate | up, as the native kernels take it
        self.down = nn.Linear(c.hidden, c.dim, bias=False)
        self.norm = nn.Parameter(torch.ones(c.dim))
        if c.layers:  # starts as the final-norm features alone: a draft without layers, grown, is unchanged
            self.layer_norms = nn.Parameter(torch.ones(len(c.layers), c.dim))
            self.fuse = nn.Linear((len(c.layers) + 1) * c.dim, c.dim, bias=False)
            with torch.no_grad():
                self.fuse.weight.zero_()
                self.fuse.weight[:, -c.dim:] = torch.eye(c.dim)
        # the head's tokens, target ids, most frequent first (`distill.eagle.choose_kept`)
        self.register_buffer("kept_ids", torch.zeros(c.kept, dtype=torch.long))

    def fuse_features(self, features: torch.Tensor) -> torch.Tensor:
        """The target's features at real positions [..., (n + 1) D] (after each of `layers`, then the final
        norm, as `NativeCache.keep_features` keeps them) -> f [..., D] (module docstring)."""
        c = self.config
        if not c.layers:
            return features
        parts = features.split(c.dim, dim=-1)
        lower = [rms_norm(part, w, c.eps) for part, w in zip(parts[:-1], self.layer_norms)]
        return self.fuse(torch.cat([*lower, parts[-1]], dim=-1))

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                scale: float) -> torch.Tensor:
        """embeds, features [B, T, D] (x_{t+1}'s embedding, f_t), cos/sin [T, hd] or [B, T, hd] of positions t, `scale`
        the attention's -> the predicted features [B, T, D], causally (position t sees 0..t)."""
        c = self.config
        B, T, _ = embeds.shape
        x = self.fc(torch.cat([embeds, features], dim=-1))
        q, k, v = self.qkv(rms_norm(x, self.attn_norm, c.eps)).split(
            [c.heads * c.head_dim, c.kv_heads * c.head_dim, c.kv_heads * c.head_dim], dim=-1)
        q = q.view(B, T, c.heads, c.head_dim).transpose(1, 2)  # [B, H, T, hd]
        k = k.view(B, T, c.kv_heads, c.head_dim).transpose(1, 2)
        v = v.view(B, T, c.kv_heads, c.head_dim).transpose(1, 2)
        if cos.dim() == 3:  # [B, T, hd]: each row's own positions
            cos, sin = cos[:, None], sin[:, None]
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        group = c.heads // c.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)  # [B, H, T, hd]
        x = x + self.o(attn.transpose(1, 2).reshape(B, T, c.heads * c.head_dim))
        gate, up = self.gate_up(rms_norm(x, self.mlp_norm, c.eps)).chunk(2, dim=-1)
        x = x + self.down(F.silu(gate) * up)
        return rms_norm(x, self.norm, c.eps)


def check_fits(net: EagleNet, target, subject: str, ids: torch.Tensor | None = None) -> None:
    """Refuse, naming the mismatch, a draft whose shapes are not `target`'s or whose tokens (`ids`,
    default all it keeps) run past its vocabulary; `subject` names the draft in the message."""
    c = net.config
    ours, theirs = (c.dim, c.heads, c.kv_heads, c.head_dim), (target.dim, target.heads, target.kv_heads,
                                                              target.head_dim)
    if ours != theirs:
        raise ValueError(f"{subject} was trained for {c.target or 'another model'} (dim, heads, kv heads, head "
                         f"size {ours}), not {target.name} {theirs}")
    top = int((net.kept_ids if ids is None else ids).max())
    if top >= target.vocab_size:
        raise ValueError(f"{subject} names token {top}, past {target.name}'s vocabulary of {target.vocab_size}")
    if c.layers and not all(0 < n < len(target.blocks) for n in c.layers):
        raise ValueError(f"{subject} reads the outputs of layers {list(c.layers)}; {target.name} has "
                         f"{len(target.blocks)}")


def save_eagle(path: str | Path, net: EagleNet, meta: dict | None = None) -> Path:
    """The network as one safetensors file (float16 weights, int32 kept ids) under directory `path`."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {n: t.detach().to(torch.int32 if n == "kept_ids" else torch.float16).contiguous()
               for n, t in net.state_dict().items()}
    save_file(tensors, str(path / FILE), metadata={"config": json.dumps(asdict(net.config)),
                                                   "meta": json.dumps(meta or {})})
    return path


def load_eagle(path: str | Path) -> tuple[EagleNet, dict]:
    """A saved feature draft (a directory holding eagle.safetensors, or the file) -> (the network in
    float32, its training record)."""
    from safetensors import safe_open

    path = Path(path)
    file = path / FILE if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"no feature draft at {str(path)!r} (expected {FILE}, written by "
                                f"`specdecode distill --eagle`)")
    with safe_open(str(file), "pt") as f:
        metadata = f.metadata() or {}
        if "config" not in metadata:
            raise ValueError(f"{str(file)!r} is not a feature draft: its metadata has no config")
        net = EagleNet(EagleConfig(**json.loads(metadata["config"])))
        state = {n: f.get_tensor(n) for n in f.keys()}
    net.load_state_dict({n: t.long() if n == "kept_ids" else t.float() for n, t in state.items()})
    return net.eval(), json.loads(metadata.get("meta", "{}"))
