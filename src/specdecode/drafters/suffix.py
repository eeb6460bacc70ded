"""Suffix drafting (SuffixDecoding, Oliaro et al., arXiv 2411.04975): find the longest suffix of
the context that occurred before, and propose the continuation seen most often after it.

Two depth-bounded suffix tries with counts: one over this request's prompt and output, one
(`SuffixCache`, shared across requests) over earlier outputs. Every substring of at most `depth`
tokens is a path from the root whose nodes count its occurrences; appending a token extends the
paths that end at the previous token (at most `depth` dictionary operations a token). A proposal
takes the deeper of the two matches that has a continuation and walks down the most frequent
child, for at most `spec_factor` tokens per matched token (a long match is a confident one). The
shared trie is bounded by its node count: the oldest outputs are removed whole, their counts taken
back and emptied nodes deleted.
"""

from __future__ import annotations

import gc
import heapq
import math
import threading
from collections import deque
from contextlib import contextmanager, nullcontext
from typing import Sequence

import torch

from ..sampling import SamplingParams
from .base import BaseDrafter, Draft


class Node:
    __slots__ = ("children", "count", "depth")

    def __init__(self, depth: int) -> None:
        self.children: dict[int, Node] = {}
        self.count = 0
        self.depth = depth


class SuffixTrie:
    """Every substring of at most `depth` tokens of the sequences added, with occurrence counts.
    A list of `ends` (nodes, shallowest first) marks the suffixes of a sequence present in it."""

    def __init__(self, depth: int) -> None:
        if depth < 2:
            raise ValueError(f"the suffix depth must be >= 2, got {depth}")
        self.depth = depth
        self.root = Node(0)
        self.nodes = 1

    def extend(self, ends: list[Node], token: int) -> list[Node]:
        """Add the substrings ending with `token` after the suffixes `ends`: the new ends."""
        new = []
        for node in (self.root, *ends):
            if node.depth < self.depth:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = Node(node.depth + 1)
                    self.nodes += 1
                child.count += 1
                new.append(child)
        return new

    def follow(self, ends: list[Node], token: int) -> list[Node]:
        """The suffixes still present after `token`, adding nothing."""
        new = []
        for node in (self.root, *ends):
            child = node.children.get(token) if node.depth < self.depth else None
            if child is None:
                break  # presence is closed under suffixes: no longer one extends either
            new.append(child)
        return new

    def match(self, tokens: Sequence[int]) -> list[Node]:
        """The ends of the suffixes of `tokens` present in the trie."""
        ends = []
        for length in range(1, min(self.depth, len(tokens)) + 1):
            node = self.root
            for token in tokens[len(tokens) - length :]:
                node = node.children.get(token)
                if node is None:
                    return ends
            ends.append(node)
        return ends

    def remove(self, tokens: Sequence[int]) -> None:
        """Take back the counts that adding `tokens` gave, deleting nodes no substring uses."""
        for start in range(len(tokens)):
            node = self.root
            for token in tokens[start : start + self.depth]:
                child = node.children[token]
                child.count -= 1
                if child.count == 0:
                    del node.children[token]
                    self.nodes -= _size(child)
                    break
                node = child

    def children(self, node: Node, context: Sequence[int], path: list[int]) -> dict[int, Node]:
        """What followed `node`, the end of a suffix of context + path; at the depth limit, what
        followed the longest suffix of half the depth (the walk goes on from there)."""
        if not node.children and node.depth >= self.depth:
            ends = self.match(list(context[-self.depth :]) + path)[: self.depth // 2]
            node = ends[-1] if ends else self.root
        return node.children

    def continuation(self, start: Node, context: Sequence[int], length: int, min_count: int) -> list[int]:
        """Up to `length` tokens down the most frequent children from `start` (the end of a suffix of
        `context`)."""
        tokens, node = [], start
        while len(tokens) < length:
            children = self.children(node, context, tokens)
            if not children:
                break
            token, node = max(children.items(), key=lambda item: item[1].count)
            if node.count < min_count:
                break
            tokens.append(token)
        return tokens

    def tree(self, start: Node, context: Sequence[int], budget: int, max_depth: int,
             min_count: int) -> tuple[list[int], list[int], list[float]]:
        """The `budget` likeliest continuations below `start` as a tree (tokens, parents, reach;
        parents before children), no deeper than `max_depth`: best first by the product of each
        step's frequency among its siblings (SpecInfer's and SuffixDecoding's estimate of reaching
        a node), which is its reach."""
        tokens: list[int] = []
        parents: list[int] = []
        reach: list[float] = []
        paths: list[list[int]] = []
        frontier: list[tuple[float, int, int, Node, int]] = []  # (-probability, order, token, node, parent)

        def expand(node: Node, parent: int, probability: float, path: list[int]) -> None:
            children = self.children(node, context, path)
            total = sum(child.count for child in children.values())
            for token, child in children.items():
                if child.count >= min_count:
                    heapq.heappush(frontier, (-probability * child.count / total, len(tokens) + len(frontier),
                                              token, child, parent))

        expand(start, -1, 1.0, [])
        while frontier and len(tokens) < budget:
            negative, _, token, node, parent = heapq.heappop(frontier)
            path = (paths[parent] if parent >= 0 else []) + [token]
            tokens.append(token)
            parents.append(parent)
            reach.append(-negative)
            paths.append(path)
            if len(path) < max_depth:
                expand(node, len(tokens) - 1, -negative, path)
        return tokens, parents, reach


@contextmanager
def gc_paused():
    """Python's cyclic garbage collector off while a trie grows (restored as it was after).

    Every node is a tracked container, so indexing a prompt sets off collections that walk every
    tracked object in the process (the loaded models' included), many times the indexing itself
    (`benchmarks/results/spec_bench_suffix/`). Tries hold no reference cycles
    the collector would have to find: their nodes are freed by reference counting."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _size(node: Node) -> int:
    return 1 + sum(_size(child) for child in node.children.values())


class _Output:
    __slots__ = ("tokens", "alive")

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.alive = True


class SuffixCache:
    """The trie over earlier outputs that every request's drafter shares (the server keeps one per
    draft), bounded to `max_nodes` nodes (a few hundred bytes each in CPython: the README gives the
    default's measured size) by removing the oldest outputs first. Thread-safe."""

    def __init__(self, depth: int = 24, max_nodes: int = 100_000) -> None:
        if max_nodes < 1:
            raise ValueError(f"max_nodes must be >= 1, got {max_nodes}")
        self.trie = SuffixTrie(depth)
        self.max_nodes = max_nodes
        self.outputs: deque[_Output] = deque()  # oldest first; the newest may still be growing
        self.lock = threading.Lock()

    def start(self) -> _Output:
        """A new output, written token by token with `append`."""
        with self.lock:
            output = _Output()
            self.outputs.append(output)
            return output

    def append(self, output: _Output, ends: list[Node], token: int) -> list[Node]:
        with self.lock:
            if not output.alive:  # evicted while it was written: the rest stays out too
                return []
            output.tokens.append(token)
            ends = self.trie.extend(ends, token)
            while self.trie.nodes > self.max_nodes and len(self.outputs) > 1:
                oldest = self.outputs.popleft()
                oldest.alive = False
                self.trie.remove(oldest.tokens)
            return ends

    def match(self, tokens: Sequence[int]) -> list[Node]:
        with self.lock:
            return self.trie.match(tokens)

    def follow(self, ends: list[Node], token: int) -> list[Node]:
        with self.lock:
            return self.trie.follow(ends, token)


class SuffixDrafter(BaseDrafter):
    """Proposes the most frequent continuation of the longest earlier occurrence of the context's
    suffix, in this request (prompt and output) or, through `cache`, in earlier outputs.

    depth: the longest suffix matched (the cache's, when given); spec_factor: tokens deep per
    matched token (at least one; the loop's gamma bounds the count); min_count: how often a
    continuation must have been seen to be proposed; trees: propose the gamma likeliest
    continuations as a tree (targets that verify chains only take its main chain), else one chain.
    """

    vocab = None  # it only copies token ids it has seen (the target's)

    def __init__(self, cache: SuffixCache | None = None, depth: int = 24, spec_factor: float = 1.0,
                 min_count: int = 1, trees: bool = True) -> None:
        if spec_factor <= 0:
            raise ValueError(f"spec_factor must be > 0, got {spec_factor}")
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        self.cache = cache
        self.depth = cache.trie.depth if cache is not None else depth
        self.spec_factor, self.min_count = spec_factor, min_count
        self.proposes_trees = trees
        self._forget()

    def _forget(self) -> None:
        self.local = SuffixTrie(self.depth)
        self._local_ends: list[Node] = []  # the context's suffixes in the local trie
        self._seen: list[int] = []  # the context indexed so far
        self._prompt_length: int | None = None
        self._output: _Output | None = None  # this request's output in the shared trie
        self._written: list[Node] = []  # the output's suffixes there (written)
        self._shared_ends: list[Node] = []  # the context's suffixes there (read)

    def reset(self, params: SamplingParams, generator: torch.Generator | None) -> None:
        self._forget()

    def begin(self, prompt: Sequence[int]) -> None:
        """The decode loop says where the prompt ends: what follows it is output, for the shared trie.
        (Without it the first proposal's context is taken for the prompt.)"""
        self._prompt_length = len(prompt)
        if self.cache is not None:
            self._shared_ends = self.cache.match(prompt)

    def _update(self, context: Sequence[int]) -> None:
        with gc_paused():
            self._index(context)

    def _index(self, context: Sequence[int]) -> None:
        seen, T = self._seen, len(self._seen)
        if len(context) < T or any(context[i] != seen[i] for i in {0, T // 2, T - 1} if T):
            self._forget()  # not a continuation (as far as three spot checks tell): index it from scratch
            seen, T = self._seen, 0
        cache = self.cache
        if self._prompt_length is None:
            self.begin(context)
        for position in range(T, len(context)):
            token = int(context[position])
            seen.append(token)
            self._local_ends = self.local.extend(self._local_ends, token)
            if cache is None or position < self._prompt_length:
                continue  # the prompt's suffixes in the shared trie were matched whole by `begin`
            if self._output is None:
                self._output = cache.start()
            self._written = cache.append(self._output, self._written, token)  # the output, as it is written
            self._shared_ends = cache.follow(self._shared_ends, token)

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        self._update(context)
        best, trie = None, None
        for ends, source in ((self._local_ends, self.local), (self._shared_ends, self.cache)):
            for node in reversed(ends):  # deepest first: the longest suffix seen before with a continuation
                if node.children:
                    if best is None or node.depth > best.depth:
                        best, trie = node, source
                    break
        if best is None or gamma < 1:
            return Draft(torch.empty(1, 0, dtype=torch.long))
        depth = max(1, math.floor(self.spec_factor * best.depth))
        source = self.cache.trie if trie is self.cache else self.local
        lock = self.cache.lock if trie is self.cache else nullcontext()
        with lock:
            if self.proposes_trees:
                tokens, parents, reach = source.tree(best, self._seen, gamma, depth, self.min_count)
                return Draft(torch.tensor([tokens], dtype=torch.long), parents=parents, reach=reach)
            tokens = source.continuation(best, self._seen, min(gamma, depth), self.min_count)
        return Draft(torch.tensor([tokens], dtype=torch.long))

    def accept(self, num_accepted: int) -> None:
        pass
