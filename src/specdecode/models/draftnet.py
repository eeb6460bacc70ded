"""A small transformer draft made for one target: cheap per step on a CPU, trained by distillation.

Built for latency, not generality: a factorised input embedding over the target's whole vocabulary
(every prompt token must be readable), a few pre-norm attention + SwiGLU layers with rotary
positions and a sliding attention window, and an output head over a reduced vocabulary: the
`kept_ids` the target uses most. Logits outside it are -inf, so q(x) = 0 there and speculative
sampling stays exact (such a token is simply never proposed).

The KV cache is preallocated and grows by doubling; trimming moves a length counter, so a rollback
costs nothing. A saved draft is a directory: `draftnet.json` (shape, vocabulary fingerprint, end
tokens), `model.safetensors` (weights and kept_ids) and the target's tokenizer files.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .base import Vocabulary, check_trim

CONFIG_FILE = "draftnet.json"
WEIGHTS_FILE = "model.safetensors"


@dataclass
class DraftNetConfig:
    vocab_size: int  # the target's vocabulary size: input ids range over all of it
    kept: int  # output vocabulary size (len(kept_ids))
    embed_dim: int = 128
    dim: int = 256
    layers: int = 2
    heads: int = 4
    mlp_dim: int = 768
    window: int = 1024  # attention looks at most this many positions back
    rope_theta: float = 10000.0

    def validate(self) -> None:
        if min(self.vocab_size, self.kept, self.embed_dim, self.dim, self.layers, self.heads, self.mlp_dim,
               self.window) < 1:
            raise ValueError(f"every draft-network size must be positive: {self}")
        if self.kept > self.vocab_size:
            raise ValueError(f"kept vocabulary ({self.kept}) exceeds the vocabulary ({self.vocab_size})")
        if self.dim % self.heads or (self.dim // self.heads) % 2:
            raise ValueError(f"dim {self.dim} must split into {self.heads} heads of even size")


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding. x [B, H, T, hd]; cos, sin [T, hd/2]."""
    x1, x2 = x.unflatten(-1, (2, -1)).unbind(-2)  # each [B, H, T, hd/2]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1)


class Layer(nn.Module):
    def __init__(self, cfg: DraftNetConfig) -> None:
        super().__init__()
        self.heads, self.head_dim = cfg.heads, cfg.dim // cfg.heads
        self.attn_norm = nn.RMSNorm(cfg.dim)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.out = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.mlp_norm = nn.RMSNorm(cfg.dim)
        self.gate_up = nn.Linear(cfg.dim, 2 * cfg.mlp_dim, bias=False)
        self.down = nn.Linear(cfg.mlp_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos, sin, kv: "LayerKV | None", mask: torch.Tensor | None) -> torch.Tensor:
        """x [B, T, D] -> [B, T, D]. With kv, the T new keys/values are appended to it first."""
        B, T, D = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(B, T, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)  # [B, H, T, hd]
        if kv is not None:
            k, v = kv.append(k, v)  # [B, H, S, hd], S = the visible keys
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and T > 1)
        x = x + self.out(a.transpose(1, 2).reshape(B, T, D))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, -1)
        return x + self.down(F.silu(gate) * up)


class LayerKV:
    """One layer's keys and values, preallocated; `visible` is how far back attention looks."""

    def __init__(self, window: int) -> None:
        self.k = self.v = None
        self.length = 0
        self.window = window

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, H, T, hd = k.shape
        end = self.length + T
        if self.k is None or end > self.k.shape[2]:
            size = max(64, 2 * end)
            grown_k, grown_v = k.new_empty(B, H, size, hd), v.new_empty(B, H, size, hd)
            if self.k is not None:
                grown_k[:, :, : self.length] = self.k[:, :, : self.length]
                grown_v[:, :, : self.length] = self.v[:, :, : self.length]
            self.k, self.v = grown_k, grown_v
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        start = max(0, end - T - self.window + 1)  # the first query still sees `window` positions
        return self.k[:, :, start:end], self.v[:, :, start:end]


class DraftNetCache:
    def __init__(self, cfg: DraftNetConfig) -> None:
        self.layers = [LayerKV(cfg.window) for _ in range(cfg.layers)]

    def __len__(self) -> int:
        return self.layers[0].length

    def trim(self, n: int) -> None:
        check_trim(n, len(self))
        for layer in self.layers:
            layer.length -= n


class DraftNet(nn.Module):
    def __init__(self, cfg: DraftNetConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.embed_dim)
        self.embed_proj = nn.Linear(cfg.embed_dim, cfg.dim, bias=False)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.layers))
        self.norm = nn.RMSNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.kept, bias=False)
        self.register_buffer("kept_ids", torch.arange(cfg.kept), persistent=True)  # [V'] target ids
        half = cfg.dim // cfg.heads // 2
        self.register_buffer("inv_freq", cfg.rope_theta ** (-torch.arange(half) / half), persistent=False)

    def hidden(self, tokens: torch.Tensor, cache: DraftNetCache | None = None) -> torch.Tensor:
        """tokens [B, T] -> final hidden states [B, T, D], appending to `cache` when given."""
        T = tokens.shape[1]
        past = len(cache) if cache is not None else 0
        angles = torch.outer(torch.arange(past, past + T, dtype=torch.float32), self.inv_freq)  # [T, hd/2]
        dtype = self.norm.weight.dtype  # the stream's (products may run in int8)
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        mask = self._mask(past, T, tokens.device)
        x = self.embed_proj(self.embed(tokens))
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache.layers[i] if cache is not None else None, mask)
        return self.norm(x)

    def _mask(self, past: int, T: int, device) -> torch.Tensor | None:
        """Boolean [T, S] attention mask, or None when plain causal attention is right."""
        W = self.cfg.window
        if past == 0 and T <= W:
            return None  # is_causal
        if T == 1:
            return None  # one query sees every visible key
        start = max(0, past - W + 1)  # as LayerKV.append keeps
        keys = torch.arange(start, past + T, device=device)  # absolute positions of the visible keys
        queries = torch.arange(past, past + T, device=device)[:, None]
        return (keys <= queries) & (keys > queries - W)

    def forward(self, tokens: torch.Tensor, cache: DraftNetCache | None = None) -> torch.Tensor:
        """tokens [B, T] -> logits over the kept vocabulary [B, T, V']."""
        return self.head(self.hidden(tokens, cache))


class Int8Linear(nn.Module):
    """y = x W^T with W held as int8, one scale per output (w = scale * q, q in -127..127): a quarter
    of float32's bytes, which a draft step on a CPU is bound by (its weights are evicted from the
    caches by every target step). PyTorch's weight-only int8 kernel with bf16 activations; float32
    in and out. `quantize` returns None where the kernel may not serve the shape (input widths not a
    multiple of 16 gave wrong sums or crashed; it asks for a multiple of 32) or does not
    reproduce the dequantised product on a probe input to within 2% of the largest output."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor) -> None:  # q [out, in] int8; scale [out] bf16
        super().__init__()
        self.register_buffer("q", q)
        self.register_buffer("scale", scale)

    @classmethod
    def quantize(cls, linear: nn.Linear) -> Int8Linear | None:
        w = linear.weight.detach().float()  # [out, in]
        if linear.bias is not None or w.shape[1] % 32 or w.device.type != "cpu":
            return None
        scale = (w.abs().amax(1) / 127).clamp_min(1e-12).bfloat16()
        q = (w / scale.float()[:, None]).round_().clamp_(-127, 127).to(torch.int8)
        layer = cls(q, scale)
        probe = torch.randn(4, w.shape[1], generator=torch.Generator().manual_seed(0))
        expected = probe.bfloat16().float() @ (q.float() * scale.float()[:, None]).T
        if (layer(probe) - expected).abs().max() > 0.02 * expected.abs().max():
            return None
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        y = torch._weight_int8pack_mm(x.reshape(-1, x.shape[-1]).bfloat16(), self.q, self.scale)
        return y.view(*x.shape[:-1], -1).to(x.dtype)


def quantize_linears(net: nn.Module) -> None:
    """Replace every nn.Linear of `net` that `Int8Linear` serves by its int8 copy, in place."""
    for module in list(net.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and (int8 := Int8Linear.quantize(child)) is not None:
                setattr(module, name, int8)


class DraftNetModel:
    """A DraftNet behind the model protocol: full-vocabulary logits, -inf outside kept_ids.

    weights: "int8" (on a CPU) runs the products on int8 copies of the weights (`Int8Linear`);
    "float" keeps the net's own; "auto" (the default) is int8 where PyTorch's CPU kernels are built
    for AVX2 or AVX-512 (its unvectorised int8 kernel, ATEN_CPU_CAPABILITY=default, is slower than
    float32), else float. int8 reads a quarter of float32's bytes at the same alpha
    (`benchmarks/results/draft_weights.md` has the three side by side)."""

    WEIGHTS = ("auto", "int8", "float")

    def __init__(self, net: DraftNet, tokenizer, name: str, vocab: Vocabulary, eos_token_ids,
                 weights: str = "auto") -> None:
        if weights not in self.WEIGHTS:
            raise ValueError(f"draft weights are {', '.join(self.WEIGHTS)}, not {weights!r}")
        self.net = net.eval()
        self.dtype = next(net.parameters()).dtype
        self.device = next(net.parameters()).device
        if weights == "auto":
            weights = "int8" if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") else "float"
        if self.device.type != "cpu":
            weights = "float"  # the int8 kernel is PyTorch's CPU one
        if weights == "int8":
            self.net = copy.deepcopy(net)  # the caller's net keeps its float weights
            quantize_linears(self.net)
        self.weights = weights
        self.tokenizer = tokenizer
        self.name = name
        self.vocab = vocab
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_positions = None  # the sliding window bounds attention, not the position
        self.n_vocab = net.cfg.vocab_size

    def new_cache(self) -> DraftNetCache:
        return DraftNetCache(self.net.cfg)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, cache: DraftNetCache, num_logits: int | None = None) -> torch.Tensor:
        """tokens [B, T] -> logits [B, num_logits or T, V] float32 (-inf outside the kept vocabulary)."""
        h = self.net.hidden(tokens.to(self.device), cache)
        if num_logits:
            h = h[:, -num_logits:]
        kept = self.net.head(h).float()  # [B, T', V']
        logits = kept.new_full((*kept.shape[:2], self.n_vocab), float("-inf"))
        logits[..., self.net.kept_ids] = kept
        return logits.cpu()

    def __repr__(self) -> str:
        cfg = self.net.cfg
        return f"DraftNetModel({self.name}, {cfg.layers} layers x {cfg.dim}, {cfg.kept} output tokens, {self.weights} weights)"


def save_draftnet(directory: str | os.PathLike, net: DraftNet, tokenizer, vocab: Vocabulary, eos_token_ids,
                  meta: dict | None = None) -> Path:
    """Write a draft directory: config, fp16 weights (safetensors), the tokenizer."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in net.state_dict().items()}
    save_file(state, directory / WEIGHTS_FILE)
    tokenizer.save_pretrained(directory)
    config = dict(config=asdict(net.cfg), vocab=asdict(vocab), eos_token_ids=sorted(eos_token_ids), meta=meta or {})
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=1))
    return directory


def is_draftnet(path: str | os.PathLike) -> bool:
    return (Path(path) / CONFIG_FILE).is_file()


def load_draftnet(directory: str | os.PathLike, dtype: str = "float32", device: str | None = None,
                  weights: str = "auto") -> DraftNetModel:
    """Load a draft directory written by `save_draftnet`; `weights` as `DraftNetModel` takes them."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from .base import DTYPES

    directory = Path(directory)
    if not is_draftnet(directory):
        raise FileNotFoundError(f"{str(directory)!r} is not a draft-network directory (no {CONFIG_FILE})")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(sorted(DTYPES))}")
    saved = json.loads((directory / CONFIG_FILE).read_text())
    net = DraftNet(DraftNetConfig(**saved["config"]))
    state = load_file(directory / WEIGHTS_FILE)
    net.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    net.to(device=device or "cpu", dtype=DTYPES[dtype])
    tokenizer = AutoTokenizer.from_pretrained(directory)
    vocab = Vocabulary(**saved["vocab"])
    found = Vocabulary.from_tokens(vocab.name, tokenizer.get_vocab())
    if found.fingerprint != vocab.fingerprint:
        raise ValueError(f"{str(directory)!r}: its tokenizer files do not match the vocabulary it was trained on "
                         f"({found.fingerprint} vs {vocab.fingerprint}); the directory is damaged")
    return DraftNetModel(net, tokenizer, directory.name, vocab, saved["eos_token_ids"], weights=weights)


def param_count(net: nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())


def init_embedding_from(net: DraftNet, target_embedding: torch.Tensor) -> None:
    """Start the factorised embedding from the target's: its top principal directions, scaled to unit
    variance per coordinate. target_embedding [V, D_target]."""
    E = target_embedding.float()
    E = E - E.mean(0)
    _, _, V = torch.linalg.svd(E[torch.randperm(E.shape[0])[:8192]], full_matrices=False)
    proj = E @ V[: net.cfg.embed_dim].T  # [V, embed_dim]
    with torch.no_grad():
        net.embed.weight.copy_(proj / proj.std(0, keepdim=True).clamp_min(1e-6))

