"""`--draft eagle`: the feature draft (`models.eagle`) on the target's native kernels, drafting from
the target's own features (EAGLE, Li et al. 2024).

The target keeps its final-norm output at every cached position (`NativeCache.keep_features`), which
it computes anyway (and for a draft that reads them, EAGLE-3's lower features: its residual stream
after those layers, the one-call C layers split there). Before a proposal the target's cache holds
every context token but the newest, so the draft has the pairs (f_t, x_{t+1}) for every t up to the
newest token: it feeds those it has not seen (the tokens the last iteration kept), which predicts
the newest position's features, reads them out as q over the next token, and drafts on from its own
predictions. Those speculative rows are dropped from its cache at the next proposal, before the real
features replace them. Tokens outside its head's kept vocabulary get q = 0: verification stays exact
(Leviathan et al. 2023, Algorithm 1, for any q).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence
from weakref import WeakKeyDictionary

import torch

from ..models.eagle import EagleNet, check_fits, load_eagle
from ..models.native.cache import NativeCache
from ..models.native.linear import Int4Linear, Q8Linear, q4_1_groups, q8_0_groups
from ..models.native.model import NativeLlama, _Segment
from ..sampling import SamplingParams, sample
from .base import BaseDrafter, Draft

# The draft trained for the embedded default target, shipped in the package
SHIPPED = Path(__file__).resolve().parents[1] / "weights" / "smollm2-135m-instruct-eagle"


def head_rows(target: NativeLlama, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` of the target's LM head, float32 [len(ids), D] (an 8-bit or float32 head's)."""
    if not hasattr(target.head, "rows"):
        raise ValueError(f"a feature draft reads {target.name}'s LM head rows, and its {type(target.head).__name__} "
                         "head does not give them (an 8-bit or float32 head does)")
    return target.head.rows(ids)


class FeatureDraft(NativeLlama):
    """The draft network on the target's native kernels: its layer through the same one-call C decode
    layers as the target's, `fc` and the cut head as integer products (4- or 8-bit weights, 8-bit
    activations), the target's embedding table, RoPE tables and kernels shared, not copied."""

    BITS = (4, 8)
    # The head reads out the draft's most frequent tokens only. On Spec-Bench answers, cutting a
    # draft trained with 8,192 to 2,048 left its greedy agreement (0.26) and alpha at temperature 1
    # (0.24) as they were, and takes 2.2 of its 5.6 MB of weights off every step
    # (benchmarks/results/eagle_agreement.md, eagle_step.md).
    HEAD_TOKENS = 2048

    def __init__(self, net: EagleNet, target: NativeLlama, bits: int = 4,
                 head_tokens: int | None = HEAD_TOKENS) -> None:
        """`bits`: the weights' (the layer's, fc's and the cut head's) groups, Q4_1 or Q8_0 as llama.cpp
        writes them; either with 8-bit activations. `head_tokens`: the head keeps the network's first
        (most frequent) that many tokens; None keeps all. (NativeLlama's own __init__ reads a model
        file: this one sets the same attributes from the network and the target.)"""
        if bits not in self.BITS:
            raise ValueError(f"a feature draft runs on 4- or 8-bit weights, not {bits}")
        if head_tokens is not None and head_tokens < 1:
            raise ValueError(f"a feature draft's head needs at least one token, not {head_tokens}")
        c = net.config
        if not isinstance(target, NativeLlama) or target.c_layers is None:
            raise ValueError("a feature draft runs on the native backend's C kernels with float32 activations "
                             f"(--backend native, --dtype w4a8 or float32); {target!r} has none")
        check_fits(net, target, "this feature draft", net.kept_ids[:head_tokens])
        self.target, self.name = target, f"eagle({target.name})"
        self.n_threads, self.device = target.n_threads, target.device
        self.layers, self.heads, self.kv_heads = 1, c.heads, c.kv_heads
        self.dim, self.head_dim, self.eps = c.dim, c.head_dim, c.eps
        self.max_positions, self.windows, self.attention_scale = target.max_positions, [0], target.attention_scale
        self.embed_scale, self.gelu, self.softcap = 1.0, False, 0.0
        self.compute_dtype, self.kernels, self.dtype = torch.float32, target.kernels, f"w{bits}a8"
        self.tokenizer, self.vocab, self.eos_token_ids = target.tokenizer, target.vocab, target.eos_token_ids
        self.bits = bits

        def product(weight: torch.Tensor) -> Int4Linear | Q8Linear:
            if bits == 8:
                return Q8Linear.from_groups(q8_0_groups(weight), self.kernels, int8_activations=True)
            return Int4Linear.from_groups(q4_1_groups(weight), torch.float32, self.kernels, int8_activations=True)

        with torch.no_grad():
            self.fc, self.fc_bias = product(net.fc.weight), net.fc.bias.detach().float().clone()
            self.blocks = [dict(attn_norm=net.attn_norm.detach().float().clone(),
                                mlp_norm=net.mlp_norm.detach().float().clone(), qkv_bias=None, q_norm=None,
                                k_norm=None, post_attn_norm=None, post_mlp_norm=None,
                                qkv=product(net.qkv.weight), o=product(net.o.weight),
                                gate_up=product(net.gate_up.weight), down=product(net.down.weight))]
            self.norm = net.norm.detach().float().clone()
            self.feature_layers = c.layers  # the target layers whose outputs the draft fuses (EAGLE-3)
            if c.layers:  # at a real pair, fuse then fc as one product: fc's feature half times fuse, whose
                # columns take the lower layers' norm weights; their inputs are RMS-normalised, unweighted
                D = c.dim
                fuse = net.fuse.weight * torch.cat([net.layer_norms.reshape(-1), torch.ones(D)])[None]
                self.fc_real = product(torch.cat([net.fc.weight[:, :D], net.fc.weight[:, D:] @ fuse], dim=1))
                self.unit = torch.ones(D)
            self.kept_ids = net.kept_ids[:head_tokens].clone()  # [N] target ids, most frequent first
            self.head = product(head_rows(target, self.kept_ids))
        self.embedding = target.embedding
        # the kept tokens' embeddings as float32 rows [N, D] (19 MB for SmolLM2's 8192 x 576): a drafted
        # token is always one of them, and a row of this table costs a few microseconds against ~60 for
        # a lookup in the target's 8-bit table
        self.kept_embeddings = target.embedding(self.kept_ids).float().contiguous()
        self.kept_index = torch.full((target.vocab_size,), -1, dtype=torch.long)  # target id -> its kept row
        self.kept_index[self.kept_ids] = torch.arange(len(self.kept_ids))
        self.vocab_size = len(self.kept_ids)
        self.cos, self.sin, self.cos_swa, self.sin_swa = target.cos, target.sin, None, None
        self.c_layers = self._c_layers()
        if self.c_layers is None:
            raise ValueError("the C kernels do not run this feature draft's layer")
        self.row_invariant_prompts, self.prefill_products, self.owns_cores = True, None, False

    def step(self, ids: torch.Tensor, features: torch.Tensor, cache: NativeCache,
             kept: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [T] (x_{t+1}: target ids, or with `kept` indices into kept_ids), features [T, D] (f_t: the
        draft's own predictions) or the target's [T, (n + 1) D] (fused first: `EagleNet.fuse_features`)
        appended to `cache` -> the last row's predicted features [1, D] and its logits over the kept
        tokens [1, N]."""
        embeds = self.kept_embeddings.index_select(0, ids) if kept else self._embed(ids)
        if features.shape[1] == self.dim:
            x = self.fc(torch.cat([embeds, features], dim=-1)) + self.fc_bias  # [T, D]
        else:
            x = self.fc_real(torch.cat([embeds, *self._lower_normed(features)], dim=-1)) + self.fc_bias
        h = self._layers(None, [_Segment(cache, ids.shape[0])], inputs=x)
        f = self.kernels.rms_norm(h[-1:], self.norm, self.eps)
        return f, self.head(f)

    def _lower_normed(self, features: torch.Tensor) -> list[torch.Tensor]:
        """The target's features [T, (n + 1) D] -> the lower layers' RMS-normalised (unweighted: their
        weights are in `fc_real`), then the final-norm ones, each [T, D]."""
        D, n = self.dim, len(self.feature_layers)
        if features.shape[1] != (n + 1) * D:
            raise ValueError(f"this feature draft reads {n + 1} features of {D} a position, not "
                             f"{features.shape[1]} values")
        return [*(self.kernels.rms_norm(features[:, j * D : (j + 1) * D].contiguous(), self.unit, self.eps)
                  for j in range(n)), features[:, -D:]]

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Target ids [T] -> their embeddings [T, D] float32: kept tokens' from the kept table, the rest
        (rare in answers) from the target's."""
        rows = self.kept_index[ids]
        embeds = self.kept_embeddings.index_select(0, rows.clamp_min(0))
        missed = rows < 0
        if missed.any():
            embeds[missed] = self.embedding(ids[missed]).float()
        return embeds

    def __repr__(self) -> str:
        return f"FeatureDraft({self.target.name}, {self.vocab_size} kept tokens, {self.bits}-bit weights)"


_BUILT: WeakKeyDictionary = WeakKeyDictionary()  # target -> {draft path: FeatureDraft}


class EagleDrafter(BaseDrafter):
    """Chains drafted by a `FeatureDraft` from the target cache's features (module docstring); greedy:
    its argmax (a point mass, deterministic); else sampled from q, its kept tokens' adjusted
    distribution (zero elsewhere)."""

    def __init__(self, draft: FeatureDraft, trees: bool = False, width: int = 2, min_reach: float = 0.1,
                 context: int = 256) -> None:
        """`context`: the draft starts from the last that many pairs of the prompt, not all of them (its
        training windows were no longer; RoPE scores depend on distances only, so its cache may begin
        there), which keeps a long prompt's first proposal cheap. `trees`: greedy drafts are the
        chain with `width` runners-up a depth (`_tree`), where the target verifies trees; the chain
        stops once its reach (the product of the draft's q along it) falls below `min_reach`.
        Otherwise, and when sampling, chains of the length the gamma policy plans. Chains are the
        default: a tree's depth is drafted before the policy sizes it, and where verifying more rows
        costs much (T(8)/T(1) 2.7 on an AVX2 CPU) the policy cuts most of what was drafted
        (benchmarks/results/spec_bench_eagle/)."""
        self.draft = draft
        if context < 1:
            raise ValueError(f"a feature draft needs at least one pair of context, not {context}")
        self.proposes_trees, self.width, self.min_reach, self.context = trees, width, min_reach, context
        self.vocab = draft.vocab
        self.target_cache: NativeCache | None = None
        self.cache: NativeCache | None = None
        self.start = self.fed = 0  # the draft cache holds the real pairs t = start .. fed - 1

    @classmethod
    def load(cls, target: NativeLlama, path: str | Path | None = None) -> EagleDrafter:
        """A drafter around the feature draft at `path` (default: the one shipped for the embedded
        target) on `target`, built once per target and path (a server makes a drafter a request)."""
        path = Path(SHIPPED if path is None else path).resolve()
        built = _BUILT.setdefault(target, {})
        if path not in built:
            built[path] = FeatureDraft(load_eagle(path)[0], target)
        return cls(built[path])

    def attach(self, cache: NativeCache) -> None:
        """Draft from the features of the target cache the decoding verifies in (it keeps them from now)."""
        if not isinstance(cache, NativeCache):
            raise ValueError(f"a feature draft follows the native backend's cache, not a {type(cache).__name__}")
        if len(cache):
            raise ValueError("a feature draft needs the target's features from the prompt's first position: "
                             f"this cache already holds {len(cache)} positions")
        cache.keep_features(self.draft.dim, self.draft.feature_layers)
        self.target_cache = cache

    def reset(self, params: SamplingParams, generator: torch.Generator | None) -> None:
        self.params, self.generator = params, generator
        self.cache, self.start, self.fed, self.target_cache = None, 0, 0, None

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        target = self.target_cache
        if target is None:
            raise RuntimeError("EagleDrafter.attach(cache) must name the target's cache before propose()")
        n = len(target)  # features f_0 .. f_{n-1}; the pairs need x_{t+1}: context[1 .. n]
        if n >= len(context) or n < self.fed:
            raise RuntimeError(f"the target cache holds {n} positions for a context of {len(context)}, and the "
                               f"draft has seen {self.fed}")
        if self.cache is None:
            self.cache = self.draft.new_cache()
            self.start = self.fed = max(0, n - self.context)
        self.cache.trim(len(self.cache) - (self.fed - self.start))  # the last proposal's speculative rows
        gamma = min(gamma, self.cache.positions - (n - self.start))
        ids = torch.tensor(context[self.fed + 1 : n + 1])
        f, logits = self.draft.step(ids, target.features[self.fed : n], self.cache)
        self.fed = n
        kept, greedy = self.draft.kept_ids, self.params.is_greedy
        tree = greedy and self.proposes_trees
        tokens, probs, rows, chain_index, reach = [], [], [], [], 1.0
        for i in range(gamma):
            if greedy:
                if tree:  # q over the kept tokens, for the nodes' reach (the runners-up after the loop)
                    rows.append(torch.softmax(logits[0], -1))
                    top, index = rows[-1].max(0)
                    reach *= float(top)
                else:
                    index = logits[0].max(0).indices
                index = index.view(1)
                chain_index.append(index)
                x = kept[index]
            else:  # the adjusted q over the kept tokens (the rest are -inf: temperature, top-k and top-p
                # come out the same over the kept tokens alone), drawn there, then spread over [1, V]
                q_kept = self.params.probs(logits)  # [1, N]
                index = sample(q_kept, self.generator)
                x = kept[index]
                q = torch.zeros(1, self.draft.target.vocab_size)
                q[0, kept] = q_kept[0]
                probs.append(q)
            tokens.append(x)
            if tree and reach < self.min_reach:  # deeper nodes are unlikely to be reached: stop drafting
                break
            if i + 1 < gamma:  # the last token is fed only if it is accepted (as a real pair, next time)
                f, logits = self.draft.step(index, f, self.cache, kept=True)
        if not tokens:
            return Draft(torch.empty(1, 0, dtype=torch.long), None if greedy else torch.empty(1, 0, 0))
        if tree:  # [depth, 1 + width]: the chain's token, then the runners-up (never the chain's again)
            q = torch.stack(rows)
            chain = torch.cat(chain_index)[:, None]
            chain_q = q.gather(1, chain)
            rest = q.scatter(1, chain, -1.0).topk(self.width)
            return self._tree(kept[torch.cat([chain, rest.indices], 1)], torch.cat([chain_q, rest.values], 1), gamma)
        return Draft(torch.stack(tokens, dim=1), torch.stack(probs, dim=1) if probs else None)

    def _tree(self, ids: torch.Tensor, q: torch.Tensor, budget: int) -> Draft:
        """The greedy chain with its runners-up at each depth as leaves (EAGLE-2's idea, on the one
        chain the draft computed): ids, q [depth, 1 + width] (the chain's token first at each depth);
        each node's reach is its path's product of the draft's q; the `budget` likeliest nodes, best
        first (a parent always before its children)."""
        nodes = []  # (reach, depth, rank at its depth, token): rank 0 is the chain's node
        parent_reach = 1.0
        for depth, (row_ids, row_q) in enumerate(zip(ids.tolist(), q.tolist())):
            for rank, (token, p) in enumerate(zip(row_ids, row_q)):
                nodes.append((parent_reach * p, depth, rank, token))
            parent_reach *= row_q[0]
        # best first; a child's reach is at most its parent's, and a tie goes to the shallower node, so
        # every prefix of the order holds each node's parent
        nodes.sort(key=lambda node: (-node[0], node[1], node[2]))
        index = {}  # chain depth -> node index
        tokens, parents, reach = [], [], []
        for node_reach, depth, rank, token in nodes[:budget]:
            if rank == 0:
                index[depth] = len(tokens)
            tokens.append(token)
            parents.append(index[depth - 1] if depth else -1)
            reach.append(node_reach)
        return Draft(torch.tensor([tokens], dtype=torch.long), parents=parents, reach=reach)
