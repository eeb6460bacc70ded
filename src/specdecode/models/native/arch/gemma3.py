"""Gemma 3: Qwen3's q and k norms, norms of the attention's and the MLP's outputs before each
residual add, sliding-window layers with a RoPE base of their own, gelu, embeddings scaled by
sqrt(dim), a final logit softcap where the file sets one. Its RMSNorms scale by 1 + w: llama.cpp's
converter stored 1 + w, used as it is."""

from .base import LLAMA_LAYER, QK_NORMS, Architecture


def hyper(read, layers: int, dim: int, heads: int, head_dim: int) -> dict:
    """Gemma 3's `Hyper` fields, as llama.cpp reads them (llama_model_gemma3::load_arch_hparams): the
    layers slide but every `pattern`-th (6; or the file's pattern, a number or a flag a layer), with
    RoPE base 10000 unless the file says; the query-key scale 1 / sqrt(head_dim), but 1 / sqrt(dim /
    heads) for the 62-layer 27B (llama.cpp names the model by its layer count)."""
    window = read("attention.sliding_window", 0)
    sliding = ()
    if window > 0:
        pattern = read("attention.sliding_window_pattern", 6)
        sliding = (tuple(bool(p) for p in pattern) if isinstance(pattern, list)
                   else tuple(pattern == 0 or i % pattern < pattern - 1 for i in range(layers)))
    return dict(window=window, sliding=sliding, theta_swa=read("rope.freq_base_swa", 10000.0),
                attention_scale=(dim / heads if layers == 62 else head_dim) ** -0.5,
                embed_scale=dim ** 0.5, activation="gelu", softcap=read("final_logit_softcapping", 0.0))


ARCHITECTURE = Architecture(
    "gemma3", LLAMA_LAYER | QK_NORMS | {"post_attention_norm.weight", "post_ffw_norm.weight"},
    keys=frozenset({"attention.sliding_window", "attention.sliding_window_pattern", "rope.freq_base_swa",
                    "final_logit_softcapping"}),
    hyper=hyper, summary="q and k norms, output norms, sliding-window layers, gelu, scaled embeddings, softcap")
