"""Strict reading: the native path runs a file only where it computes everything llama.cpp would.

llama.cpp's loader is the list of what an architecture may carry (llama-cpp-python 0.3.36's vendored
llama.cpp: `src/llama-model.cpp` `llama_model_base::load_hparams` for the keys every architecture
reads, `create_tensor_qkv` and the generic `.scale` pass, and `src/models/{llama,qwen2,qwen3,
gemma3}.cpp` for each architecture's own keys and tensors). A tensor the native model does not use
(an output bias, a fused `attn_qkv`, per-tensor `.scale`s, experts) or a key
it does not implement (YaRN or LongRoPE scaling, a rotary dimension count other than the head size,
experts, a RoPE attention factor) would give a fluent, wrong model if skipped, and speculation would
then faithfully reproduce the wrong model. So each is a reason to refuse the file natively, in one
sentence naming it, and `--backend auto` runs it on llama.cpp instead.

Keys llama.cpp does not read for an architecture change nothing in its computation and are ignored
here too; keys it reads are either implemented (`Hyper`), required to hold their neutral value, or
refused.
"""

from __future__ import annotations

import re

from .arch import ARCHITECTURES, QKV_BIASES

# Tensors outside the layers every architecture's native model computes with (`output` where untied);
# each architecture's own layer tensors and optional ones are in its module (`arch`).
GLOBALS = (frozenset({"token_embd.weight", "output_norm.weight"}), frozenset({"output.weight"}))

# Keys (after `{arch}.`) llama.cpp reads for every architecture that the native path implements
# (`GGUFSource` reads them into `Hyper`; an architecture's own are its module's `keys`).
IMPLEMENTED = frozenset({
    "context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
    "attention.head_count_kv", "attention.layer_norm_rms_epsilon", "attention.key_length", "rope.freq_base",
    "rope.scaling.type", "rope.scaling.factor", "rope.scale_linear",
})


def _equal_to(key: str):
    return lambda value, fields, arch: value == fields.get(f"{arch}.{key}")


def _head_size(value, fields, arch):
    heads = fields.get(f"{arch}.attention.head_count")
    head = fields.get(f"{arch}.attention.key_length") or (fields[f"{arch}.embedding_length"] // heads
                                                          if isinstance(heads, int) and heads else None)
    return value == head


_ZERO = lambda value, fields, arch: not value  # noqa: E731
# Keys llama.cpp reads that change nothing while they hold a neutral value: key -> (is it neutral?, what
# the neutral value is, for the refusal's sentence).
NEUTRAL = {
    "embedding_length_out": (_equal_to("embedding_length"), "the embedding length"),
    "attention.causal": (lambda value, fields, arch: bool(value), "true"),
    "attention.value_length": (_head_size, "the key length"),
    "rope.dimension_count": (_head_size, "the head size"),
    "attention.key_length_swa": (_head_size, "the key length"),
    "attention.value_length_swa": (_head_size, "the key length"),
    "rope.dimension_count_swa": (_head_size, "the head size"),
    "rope.scaling.attn_factor": (lambda value, fields, arch: value == 1.0, "1"),
    "rope.scaling.alpha": (_ZERO, "0"),
    "nextn_predict_layers": (_ZERO, "0"),
    "expert_count": (_ZERO, "0"),
    "expert_used_count": (_ZERO, "0"),
    "expert_group_count": (_ZERO, "0"),
    "expert_group_used_count": (_ZERO, "0"),
    # read, but what they change is not a generation's computation: embedding pooling, a classifier's
    # labels (its head would be a tensor, refused), the context YaRN/LongRoPE scale from (those are refused)
    "pooling_type": (lambda value, fields, arch: True, ""),
    "classifier.pooling_type": (lambda value, fields, arch: True, ""),
    "classifier.output_labels": (lambda value, fields, arch: True, ""),
    "rope.scaling.finetuned": (lambda value, fields, arch: True, ""),
    "rope.scaling.original_context_length": (lambda value, fields, arch: True, ""),
    "vocab_size": (lambda value, fields, arch: True, ""),  # llama's: the head's rows say the same
}
PER_LAYER = ("feed_forward_length", "attention.head_count", "attention.head_count_kv")  # llama.cpp takes arrays


def refusal(architecture: str, fields: dict, tensor_names) -> str | None:
    """Why the native path cannot run a GGUF file of this architecture with these metadata `fields`
    and tensors (one sentence, or None where it computes all of it as llama.cpp does). `fields` holds
    `GGUFHeader.fields` (long arrays as None)."""
    if architecture not in ARCHITECTURES:
        return f"the native backend runs the {', '.join(ARCHITECTURES)} architectures, not {architecture!r}"
    why = _key_refusal(architecture, fields)
    return why or _tensor_refusal(architecture, fields, tensor_names)


def _key_refusal(arch: str, fields: dict) -> str | None:
    implemented = IMPLEMENTED | ARCHITECTURES[arch].keys
    for key, value in fields.items():
        if not key.startswith(arch + "."):
            continue
        name = key[len(arch) + 1:]
        if name in PER_LAYER and isinstance(value, list):
            if len(set(value)) != 1:
                return f"it sets {key} per layer ({value}), which the native backend does not run"
            continue
        if name == "rope.scaling.type" and value not in ("none", "linear"):
            return f"it scales RoPE by {value!r} ({key}), which the native backend does not compute"
        if name in implemented:
            continue
        if name in NEUTRAL:
            neutral, what = NEUTRAL[name]
            if not neutral(value, fields, arch):
                return f"it sets {key} = {value!r} (the native backend computes it only as {what})"
    return None


def _tensor_refusal(arch: str, fields: dict, names) -> str | None:
    layers = fields.get(f"{arch}.block_count")
    architecture = ARCHITECTURES[arch]
    required, optional = architecture.layer_tensors, architecture.optional_layer_tensors
    found_globals, found_layers = set(), [set() for _ in range(layers if isinstance(layers, int) else 0)]
    for name in names:
        match = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
        if match is None:
            if name not in GLOBALS[0] | GLOBALS[1] | architecture.optional_globals:
                return f"it has a tensor {name!r} that the native backend does not compute with"
            found_globals.add(name)
            continue
        layer, tensor = int(match[1]), match[2]
        if layer >= len(found_layers) or tensor not in required | optional:
            return f"it has a tensor {name!r} that the native backend does not compute with"
        found_layers[layer].add(tensor)
    missing = GLOBALS[0] - found_globals
    if missing:
        return f"it has no {sorted(missing)[0]!r} tensor, which a {arch} model needs"
    for layer, found in enumerate(found_layers):
        if required - found:
            return f"it has no 'blk.{layer}.{sorted(required - found)[0]}' tensor, which a {arch} model needs"
        if found & QKV_BIASES and not QKV_BIASES <= found:
            return (f"layer {layer} has some of the q, k and v biases but not all three "
                    f"({', '.join(sorted(found & QKV_BIASES))}), which the native backend does not compute")
    return None
