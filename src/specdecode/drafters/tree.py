"""Draft trees sampled from a draft distribution q, for multi-candidate speculative sampling
(SpecInfer, Miao et al., arXiv 2305.09781; recursive rejection over candidates drawn without
replacement, Jeon et al., arXiv 2402.14160).

Each node's children are distinct tokens drawn one after another without replacement from q at
that node's context, kept in drawing order: the verifier (`decode._walk_tree`) tries them in that
order against the target's residual, which keeps the output exactly the target's.

Exactness needs one more thing: whether a drawn child enters the tree must not depend on its own
token (nor on what was drawn below it). Choosing "the likeliest drawn tokens" would bias the
output. So the tree grows best first by a priority that ignores the child's token: the j-th child
slot of a node scores the node's reach times the j-th largest q there. Reach below a node follows
the tokens actually drawn above it (those are already in the tree). The size is fixed before
drafting, never cut afterwards by the tokens drawn.
"""

from __future__ import annotations

import heapq
from typing import Callable, Sequence

import torch

from ..sampling import sample_distinct
from .base import Draft


def sample_tree(distribution: Callable[[list[int]], torch.Tensor], context: Sequence[int], budget: int,
                width: int, generator: torch.Generator | None) -> Draft:
    """Up to `budget` nodes; `distribution(tokens)` gives q [V] (already adjusted by the sampling
    settings) after the tokens; at most `width` children a node. Returns a Draft with tokens
    [1, g], probs [1, g, V] (row i: the q node i was drawn from, shared by its siblings) and
    parents; no `reach`, so the decode loop never prunes it by the drawn tokens."""
    context = list(context)
    tokens: list[int] = []
    parents: list[int] = []
    reach: list[float] = []
    probs: list[torch.Tensor] = []
    paths = {-1: []}  # node -> the tokens from the context to it
    candidates: list = []  # heap of (-priority, order, token, parent, q)
    order = 0

    def expand(node: int, node_reach: float) -> None:
        nonlocal order
        q = distribution(context + paths[node])  # [V]
        drawn = sample_distinct(q, width, generator)
        slots = torch.topk(q, len(drawn)).values.tolist() if drawn else []  # j-th largest q: not the token's
        for token, top in zip(drawn, slots):
            heapq.heappush(candidates, (-node_reach * top, order, token, node, q))
            order += 1

    if budget > 0 and width > 0:
        expand(-1, 1.0)
    while candidates and len(tokens) < budget:
        neg_priority, _, token, parent, q = heapq.heappop(candidates)
        node = len(tokens)
        tokens.append(token)
        parents.append(parent)
        probs.append(q)
        paths[node] = paths[parent] + [token]
        reach.append((reach[parent] if parent >= 0 else 1.0) * float(q[token]))  # the drawn token's, for below
        if len(tokens) < budget:
            expand(node, reach[node])
    if not tokens:
        return Draft(torch.empty(1, 0, dtype=torch.long))
    return Draft(torch.tensor([tokens]), torch.stack(probs).unsqueeze(0), parents)  # [1, g], [1, g, V]
