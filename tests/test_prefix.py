"""Prompt prefix reuse (`specdecode.prefix`): the longest shared prefix is copied, never the last
prompt token, and memory stays within its bound."""

import pytest
import torch

from specdecode.prefix import PrefixCache


class Cache:
    """k, v [layers, Hkv, positions, hd] as the native cache's; position p of a prompt holds its token."""

    def __init__(self, positions=16):
        self.k = torch.zeros(2, 1, positions, 4)
        self.v = torch.zeros(2, 1, positions, 4)
        self.length = 0

    def __len__(self):
        return self.length


def computed(prompt):
    cache = Cache()
    for p, token in enumerate(prompt):
        cache.k[:, :, p] = token
        cache.v[:, :, p] = -token
    cache.length = len(prompt)
    return cache


def test_the_longest_shared_prefix_is_copied_and_the_last_token_left_to_compute():
    prefixes = PrefixCache()
    prefixes.store([1, 2, 3, 4], computed([1, 2, 3, 4]))
    prefixes.store([1, 2, 9], computed([1, 2, 9]))
    cache = Cache()
    assert prefixes.fill([1, 2, 3, 7, 8], cache) == 3
    assert len(cache) == 3 and torch.equal(cache.k[:, :, :3], computed([1, 2, 3]).k[:, :, :3])
    assert torch.equal(cache.v[:, :, :3], computed([1, 2, 3]).v[:, :, :3])
    same = Cache()
    assert prefixes.fill([1, 2, 3, 4], same) == 3  # the same prompt: its last token is still fed
    assert prefixes.fill([5, 6], Cache()) == 0 and prefixes.fill([1], Cache()) == 0
    assert prefixes.reused_tokens == 6
    busy = computed([1, 2])
    assert prefixes.fill([1, 2, 3, 4], busy) == 0 and len(busy) == 2  # only an empty cache is filled


def test_memory_stays_within_its_bound_dropping_the_least_recently_used():
    one = computed([1, 2, 3, 4])
    size = 2 * one.k[:, :, :4].nbytes
    prefixes = PrefixCache(max_bytes=2 * size)
    prefixes.store([1, 2, 3, 4], one)
    prefixes.store([5, 6, 7, 8], computed([5, 6, 7, 8]))
    prefixes.fill([1, 2, 3, 4, 0], Cache())  # [1, 2, 3, 4] used last
    for start in range(10, 100, 4):
        prefixes.store(list(range(start, start + 4)), computed(list(range(start, start + 4))))
        assert prefixes.nbytes <= 2 * size and len(prefixes) <= 2
    assert prefixes.fill([5, 6, 7, 8, 0], Cache()) == 0  # evicted long ago
    with pytest.raises(ValueError, match="max_bytes"):
        PrefixCache(-1)
