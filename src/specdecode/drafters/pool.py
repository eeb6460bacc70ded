"""A shared pool of n-gram continuations (the family of llama.cpp's ngram-mod): every request's
prompt and output feed one table of fixed size, keyed by hashes of the last n tokens, and every
request drafts from it as far as the continuation is likely to be accepted. Where a request
repeats an earlier one (or itself), its chains run long.

The table. Each of `slots` entries holds, for one n-gram (several orders n: by default 16, 8 and
4 tokens; a request's own short repeats are prompt lookup's), a 32-bit fingerprint of its hash (0:
empty), the token that followed it, how often that token was seen there (a majority vote: another
continuation takes the count down, and takes the entry over when it reaches 0), and the entry's
acceptance record. The slot is the hash's low bits,
the fingerprint its high 32 bits, so two n-grams share an entry only when they share a slot and a
fingerprint (about 2^-32 of colliding pairs); one that lands in a used slot with another
fingerprint takes it over (the most recent wins). The arrays are allocated once: memory does not
grow with the traffic (`nbytes`).

Acceptance statistics. A request scores what the pool predicted for it against the tokens the
target then emitted (a drafted token is accepted exactly when it equals the emitted one, greedy;
when sampling, the emitted token equals a point-mass guess d with probability p(d), its acceptance
probability, so the score is unbiased). A right guess adds to its entry's decayed hits, a wrong one
only to its tries; an entry's estimated acceptance is (hits + w prior) / (tries + w), the prior being
what entries of the same order and count class have scored so far. A chain's tokens multiply their
estimates into each token's chance of being reached; a chain stops where that falls too low, and
the drafter that chooses among sources (`drafters.auto`) prices the pool's chain by these chances
under the target's measured verification curve T(k). How many tokens of it a call verifies, the
decode loop's adaptive gamma policy plans from the pool's running acceptance, as for any drafter.

The drafts are deterministic (q a point mass), so the output is the target's distribution exactly.
"""

from __future__ import annotations

import threading
from typing import Sequence

import numpy as np
import torch

from ..sampling import SamplingParams
from .base import BaseDrafter, Draft

MASK = (1 << 64) - 1
BASE = 0x100000001B3  # the polynomial hash's multiplier (odd: every token moves the hash)
SALT = 0x9E3779B97F4A7C15  # times the order: the same tokens hash apart at each order
C1, C2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # splitmix64's finaliser
MAX_COUNT = 255
PRIOR_WEIGHT = 2.0  # an entry's own record weighs against its class's prior like this many scored guesses
COUNT_CLASSES = 3  # entries seen once, twice, three times or more keep separate priors
SMALL_FEED = 16  # up to this many new tokens are stored one by one, more at once through numpy


def _mix(h):
    """splitmix64's finaliser on a Python int (< 2^64) or a numpy uint64 array (wrapping alike)."""
    if isinstance(h, np.ndarray):
        h = (h ^ (h >> np.uint64(30))) * np.uint64(C1)
        h = (h ^ (h >> np.uint64(27))) * np.uint64(C2)
        return h ^ (h >> np.uint64(31))
    h = ((h ^ (h >> 30)) * C1) & MASK
    h = ((h ^ (h >> 27)) * C2) & MASK
    return h ^ (h >> 31)


def ngram_hash(tokens: Sequence[int]) -> int:
    """The polynomial hash of a sequence mod 2^64: sum t_j BASE^(n-1-j)."""
    h = 0
    for t in tokens:
        h = (h * BASE + int(t)) & MASK
    return h


def window_hashes(ids: np.ndarray, n: int) -> np.ndarray:
    """`ngram_hash` of every window ids[i : i + n] (uint64 [len(ids) - n + 1])."""
    count = len(ids) - n + 1
    h = np.zeros(max(count, 0), dtype=np.uint64)
    for j in range(n):
        h = h * np.uint64(BASE) + ids[j : j + count]
    return h


class NgramPool:
    """The table every request's `PoolDrafter` shares (see the module docstring). Thread-safe.

    slots: entries (a power of two); orders: the n-gram lengths kept, tried longest first; decay:
    weight of an entry's past in its acceptance record, per scored guess.
    """

    def __init__(self, slots: int = 1 << 20, orders: Sequence[int] = (16, 8, 4), decay: float = 0.8) -> None:
        if slots < 2 or slots & (slots - 1):
            raise ValueError(f"slots must be a power of two >= 2, got {slots}")
        orders = sorted({int(n) for n in orders}, reverse=True)
        if not orders or orders[-1] < 1:
            raise ValueError(f"orders must be n-gram lengths >= 1, got {orders}")
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        self.slots, self.orders, self.decay = slots, tuple(orders), decay
        self.keys = np.zeros(slots, dtype=np.uint32)  # fingerprint, 0: empty
        self.tokens = np.zeros(slots, dtype=np.int32)  # what followed the n-gram
        self.counts = np.zeros(slots, dtype=np.uint16)  # its majority-vote count
        self.hits = np.zeros(slots, dtype=np.float32)  # decayed right guesses, and guesses scored
        self.tries = np.zeros(slots, dtype=np.float32)
        # each order's and count class's record over every guess scored: an unscored entry's prior
        self.prior_hits = [[1.0] * COUNT_CLASSES for _ in orders]
        self.prior_tries = [[2.0] * COUNT_CLASSES for _ in orders]
        self.used = 0  # entries holding an n-gram
        self.lock = threading.Lock()
        self._salts = [(n * SALT) & MASK for n in self.orders]
        self._powers = [pow(BASE, n, 1 << 64) for n in self.orders]  # BASE^n: a window's hash from prefix hashes
        self._mask = slots - 1

    @property
    def nbytes(self) -> int:
        """The table's memory, fixed when it is made."""
        return sum(a.nbytes for a in (self.keys, self.tokens, self.counts, self.hits, self.tries))

    def _place(self, key):
        """(slot, fingerprint) of a mixed hash, for a Python int or a uint64 array."""
        if isinstance(key, np.ndarray):
            return ((key & np.uint64(self._mask)).astype(np.int64),
                    ((key >> np.uint64(32)) | np.uint64(1)).astype(np.uint32))
        return key & self._mask, (key >> 32) | 1

    # -- feeding --

    def feed(self, ids: Sequence[int], start: int = 0) -> None:
        """Record what followed every n-gram of `ids` whose next token is at position >= start."""
        if len(ids) - start <= SMALL_FEED:  # a step's few tokens: scalar updates beat numpy's per-call cost
            with self.lock:
                for position in range(max(start, 1), len(ids)):
                    for index, n in enumerate(self.orders):
                        if position >= n:
                            key = _mix(ngram_hash(ids[position - n : position]) ^ self._salts[index])
                            self._store_one(key & self._mask, (key >> 32) | 1, int(ids[position]))
            return
        arr = np.asarray(ids, dtype=np.int64)
        slots, fingerprints, nexts = [], [], []
        for n, salt in zip(self.orders, self._salts):
            first = max(start, n)  # the first next-token position with a whole window before it
            if first >= len(arr):
                continue
            h = window_hashes(arr[first - n : len(arr) - 1].astype(np.uint64), n)
            slot, fingerprint = self._place(_mix(h ^ np.uint64(salt)))
            slots.append(slot)
            fingerprints.append(fingerprint)
            nexts.append(arr[first:].astype(np.int32))
        if slots:
            with self.lock:
                self._store(np.concatenate(slots), np.concatenate(fingerprints), np.concatenate(nexts))

    def _store_one(self, slot: int, fingerprint: int, token: int) -> None:
        """`_store` for one n-gram."""
        if self.keys[slot] == fingerprint:
            count = int(self.counts[slot])
            if self.tokens[slot] == token:
                self.counts[slot] = min(count + 1, MAX_COUNT)
                return
            if count > 1:
                self.counts[slot] = count - 1
                return
        elif self.keys[slot] == 0:
            self.used += 1
        self.keys[slot], self.tokens[slot], self.counts[slot] = fingerprint, token, 1
        self.hits[slot] = self.tries[slot] = 0.0

    def _store(self, slot: np.ndarray, fingerprint: np.ndarray, token: np.ndarray) -> None:
        # one update per slot: the latest n-gram that lands there
        reverse_first = np.unique(slot[::-1], return_index=True)[1]
        keep = len(slot) - 1 - reverse_first
        slot, fingerprint, token = slot[keep], fingerprint[keep], token[keep]
        old = self.keys[slot]
        same = old == fingerprint
        count = self.counts[slot].astype(np.int32)
        agree = same & (self.tokens[slot] == token)
        count = np.where(agree, np.minimum(count + 1, MAX_COUNT), np.where(same, count - 1, 0))
        self.counts[slot] = np.maximum(count, 0).astype(np.uint16)
        new = count <= 0  # a new n-gram here, or another continuation that won the vote
        taken = slot[new]
        self.used += int(np.count_nonzero(old[new] == 0))
        self.keys[taken] = fingerprint[new]
        self.tokens[taken] = token[new]
        self.counts[taken] = 1
        self.hits[taken] = 0.0
        self.tries[taken] = 0.0

    # -- drafting --

    def chain(self, tail: Sequence[int], budget: int,
              min_reach: float = 0.02) -> tuple[list[int], list[tuple], list[float]]:
        """Up to `budget` tokens continuing `tail` (the context's last tokens, at least the longest
        order where it has them), each from the longest order whose n-gram is in the table, while
        the chance of reaching the token stays >= min_reach. Returns (tokens, guesses, reach), a
        guess being (slot, fingerprint, order index, count class) for `score`."""
        tail = [int(t) for t in tail]
        prefix = [0]  # prefix[i]: ngram_hash(tail[:i])
        for t in tail:
            prefix.append((prefix[-1] * BASE + t) & MASK)
        tokens, guesses, reach, chance = [], [], [], 1.0
        keys, values, counts = self.keys.item, self.tokens.item, self.counts.item  # plain ints and floats
        hits, tries, mask = self.hits.item, self.tries.item, self._mask
        orders = list(zip(range(len(self.orders)), self.orders, self._powers, self._salts))
        with self.lock:
            while len(tokens) < budget:
                length = len(tail)
                for index, n, power, salt in orders:
                    if length < n:
                        continue
                    h = ((prefix[length] - prefix[length - n] * power) & MASK) ^ salt
                    h = ((h ^ (h >> 30)) * C1) & MASK  # _mix, inlined: this loop is the drafting's cost
                    h = ((h ^ (h >> 27)) * C2) & MASK
                    h ^= h >> 31
                    slot, fingerprint = h & mask, (h >> 32) | 1
                    if keys(slot) == fingerprint:
                        break
                else:
                    break  # no order has seen this context
                token, cls = values(slot), min(counts(slot), COUNT_CLASSES) - 1
                prior = self.prior_hits[index][cls] / self.prior_tries[index][cls]
                chance *= (hits(slot) + PRIOR_WEIGHT * prior) / (tries(slot) + PRIOR_WEIGHT)
                if chance < min_reach:
                    break
                tokens.append(token)
                guesses.append((slot, fingerprint, index, cls))
                reach.append(chance)
                tail.append(token)
                prefix.append((prefix[-1] * BASE + token) & MASK)
        return tokens, guesses, reach

    def score(self, guesses: Sequence[tuple], right: Sequence[bool]) -> None:
        """Each guess (from `chain`) against what the target emitted there: rewards the right ones,
        decays the wrong ones (an entry taken over since keeps its new owner's record)."""
        d = self.decay
        with self.lock:
            for (slot, fingerprint, index, cls), ok in zip(guesses, right):
                self.prior_hits[index][cls] = 0.98 * self.prior_hits[index][cls] + ok
                self.prior_tries[index][cls] = 0.98 * self.prior_tries[index][cls] + 1
                if self.keys[slot] == fingerprint:
                    self.hits[slot] = d * self.hits[slot] + ok
                    self.tries[slot] = d * self.tries[slot] + 1


class PoolDrafter(BaseDrafter):
    """One request's view of an `NgramPool`: feeds it the prompt and the output as they come, scores
    its earlier guesses against what was emitted, and proposes the pool's chain after the context
    while each token's estimated chance of being reached stays >= min_reach. The decode loop's gamma
    policy plans how many of them a call verifies, from this drafter's running acceptance under the
    measured verification curve. (Sizing each chain by its reach estimates instead, as draft trees
    are sized, verified fewer tokens a call on Spec-Bench prompts: the running acceptance follows a
    request's current stretch, copy or not, faster than the table's records do.)"""

    vocab = None  # it only proposes token ids it was fed (the target's)

    def __init__(self, pool: NgramPool | None = None, min_reach: float = 0.02) -> None:
        self.pool = pool if pool is not None else NgramPool(1 << 16)
        self.min_reach = min_reach
        self._forget()

    def _forget(self) -> None:
        self._seen: list[int] = []  # the context fed so far
        self._pending: tuple[int, list[int], list[tuple]] | None = None  # (position, tokens, guesses) to score

    def reset(self, params: SamplingParams, generator: torch.Generator | None) -> None:
        self._forget()

    def begin(self, prompt: Sequence[int]) -> None:
        self._forget()
        self.update(prompt)

    def update(self, context: Sequence[int]) -> None:
        """Catch up with `context`: score the last guesses against it, feed the pool its new tokens."""
        seen, T = self._seen, len(self._seen)
        if len(context) < T or any(context[i] != seen[i] for i in {0, T // 2, T - 1} if T):
            self._forget()  # not a continuation (as far as three spot checks tell): start over
            seen, T = self._seen, 0
        if len(context) == T:
            return
        seen.extend(int(t) for t in context[T:])
        if self._pending is not None:
            self._score(*self._pending)
        self.pool.feed(seen, T)

    def _score(self, position: int, tokens: list[int], guesses: list[tuple]) -> None:
        right = []
        for i, token in enumerate(tokens):
            if position + i >= len(self._seen):
                break  # not emitted yet: the next update scores it
            right.append(self._seen[position + i] == token)
            if not right[-1]:
                break  # what followed a wrong guess was never the pool's question
        self.pool.score(guesses[: len(right)], right)
        done = len(right) == len(tokens) or (right and not right[-1])
        self._pending = None if done else (position + len(right), tokens[len(right):], guesses[len(right):])

    def candidate(self, context: Sequence[int], gamma: int) -> tuple[list[int], list[float]]:
        """The pool's chain after `context` (tokens, reach), remembered to be scored once emitted."""
        self.update(context)
        if gamma < 1:
            return [], []
        tokens, guesses, reach = self.pool.chain(self._seen[-self.pool.orders[0]:], gamma, self.min_reach)
        self._pending = (len(self._seen), tokens, guesses) if tokens else None
        return tokens, reach

    def continuation(self, tokens: Sequence[int], budget: int,
                     min_reach: float | None = None) -> tuple[list[int], list[float]]:
        """The pool's chain after `tokens` (e.g. the context and another source's draft), with
        each token's estimated reach; fed nothing, scored never."""
        min_reach = self.min_reach if min_reach is None else min_reach
        chain, _, reach = self.pool.chain(list(tokens[-self.pool.orders[0]:]), budget, min_reach)
        return chain, reach

    def propose(self, context: Sequence[int], gamma: int) -> Draft:
        return Draft(torch.tensor([self.candidate(context, gamma)[0]], dtype=torch.long).reshape(1, -1))
