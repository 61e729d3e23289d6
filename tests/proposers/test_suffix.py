"""Suffix decoding: the counted suffix trees against brute force, the cache's FIFO eviction, and
the proposer on the tiny model (exact on every path, the global tree shared across requests).

Each structural test has a planted twin (a tree that forgets to count, an eviction that leaves
counts behind, a draft that ignores the match length) that the same check rejects.
"""
from __future__ import annotations

import random

import pytest
import torch

from specdecode_ref import autoregressive_generate, generate, generate_batch
from specdecode_ref.proposers import load_proposer
from specdecode_ref.proposers.suffix import SuffixProposer
from specdecode_ref.proposers.suffix_tree import SuffixCache, SuffixTree
from specdecode_ref.serving.scheduler import serve


def brute_counts(seqs: list, depth: int) -> dict:
    """pattern tuple -> number of positions where it starts, over every sequence (length <= depth)."""
    counts: dict = {}
    for seq in seqs:
        for start in range(len(seq)):
            for n in range(1, min(depth, len(seq) - start) + 1):
                key = tuple(seq[start: start + n])
                counts[key] = counts.get(key, 0) + 1
    return counts


def tree_counts(tree: SuffixTree) -> dict:
    out, stack = {}, [((), tree.root)]
    while stack:
        path, node = stack.pop()
        for t, child in node.children.items():
            out[path + (t,)] = child.count
            stack.append((path + (t,), child))
    return out


def brute_speculate(seqs, context, depth, max_spec_tokens, factor, min_prob):
    """The draft rule written from counts alone: most frequent continuation of each match."""
    counts = brute_counts(seqs, depth)
    total = sum(len(s) for s in seqs)
    context = list(context)[-depth:]
    best = ([], 0.0, 0)
    for m in range(1, len(context)):
        pattern = tuple(context[len(context) - m:])
        if pattern not in counts:
            break
        budget = min(max_spec_tokens, int(m * factor + 1e-6))
        tokens, prob, score, path = [], 1.0, 0.0, pattern
        while len(tokens) < budget:
            options = [(counts.get(path + (t,), 0), t) for t in range(10)]
            options = [o for o in options if o[0] > 0]
            if not options:
                break
            top = max(c for c, _ in options)
            prob *= top / counts[path]
            if prob < min_prob:
                break
            tokens.append(min(t for c, t in options if c == top))  # ties: the smallest id
            score += prob
            path = path + (tokens[-1],)
        if score >= best[1]:
            best = (tokens, score, m)
    return best, total


class ForgetfulTree(SuffixTree):
    """Planted twin: only suffixes up to half the depth are counted."""

    def append(self, seq_id, token):
        depth = self.max_depth
        self.max_depth = max(1, depth // 2)
        try:
            super().append(seq_id, token)
        finally:
            self.max_depth = depth


@pytest.mark.parametrize("tree_cls, ok", [(SuffixTree, True), (ForgetfulTree, False)])
def test_tree_counts_every_suffix_up_to_its_depth(tree_cls, ok):
    rng = random.Random(0)
    seqs = {i: [rng.randrange(4) for _ in range(rng.randrange(5, 40))] for i in range(4)}
    tree = tree_cls(6)
    for i, seq in seqs.items():  # interleaved, as requests grow side by side
        tree.extend(i, seq[: len(seq) // 2])
    for i, seq in seqs.items():
        tree.extend(i, seq[len(seq) // 2:])
    same = tree_counts(tree) == brute_counts(list(seqs.values()), 6)
    assert same == ok
    if ok:
        tree.remove(1)
        tree.remove(3)
        assert tree_counts(tree) == brute_counts([seqs[0], seqs[2]], 6)
        assert len(tree) == len(seqs[0]) + len(seqs[2])


def test_speculate_follows_the_most_frequent_continuation_and_the_match_length():
    rng = random.Random(1)
    for trial in range(60):
        seqs = [[rng.randrange(3) for _ in range(rng.randrange(8, 50))] for _ in range(2)]
        tree = SuffixTree(8)
        for i, s in enumerate(seqs):
            tree.extend(i, s)
        context = seqs[0][-rng.randrange(3, 12):] if trial % 2 else [rng.randrange(3) for _ in range(6)]
        factor, min_prob = rng.choice([0.5, 1.0, 2.0]), rng.choice([0.0, 0.1, 0.4])
        got = tree.speculate(context, 5, factor, 0.0, min_prob)
        (tokens, score, m), _ = brute_speculate(seqs, context, 8, 5, factor, min_prob)
        assert got.score == pytest.approx(score, abs=1e-9), trial
        assert got.match_len == m and got.tokens == tokens, trial
        assert len(got.tokens) <= min(5, int(got.match_len * factor + 1e-6))
        assert all(p >= min_prob for p in got.probs)


def test_cache_evicts_the_oldest_request_and_its_counts():
    cache = SuffixCache(max_tree_depth=8, max_cached_requests=2)
    outputs = [[1, 2, 3, 4, 5], [6, 7, 8, 9], [3, 1, 4, 1, 5]]
    for r, out in enumerate(outputs):
        cache.start_request(r, [0])
        cache.add_response(r, out)
        cache.stop_request(r)
    assert list(cache.cached_requests) == [1, 2]
    assert tree_counts(cache.global_tree) == brute_counts(outputs[1:], 8)
    cache.start_request("new", [9, 9])  # its output takes a slot: the oldest cached output goes
    assert list(cache.cached_requests) == [2, "new"]
    assert cache.speculate("new", [0, 1, 2], 4, max_spec_factor=2.0).tokens == []
    assert cache.speculate("new", [6, 7], 4, max_spec_factor=2.0).tokens == []
    assert cache.speculate("new", [0, 3, 1], 4, max_spec_factor=2.0).tokens == [4, 1, 5]
    with pytest.raises(ValueError, match="max_cached_requests"):
        SuffixCache(8, max_cached_requests=-2)


def test_a_disabled_global_tree_still_drafts_from_the_prompt():
    cache = SuffixCache(max_tree_depth=8, max_cached_requests=0)
    cache.start_request("a", [5, 6, 7, 8, 5, 6])
    cache.add_response("a", [7])
    assert not cache.cached_requests
    # A match uses at most all but the first context token: [6, 7] matches, 2 tokens are drafted.
    assert cache.speculate("a", [5, 6, 7], 4).tokens == [8, 5]
    assert cache.speculate("a", [9, 5, 6, 7], 4).tokens == [8, 5, 6]


def test_the_draft_length_follows_the_match():
    tree = SuffixTree(24)
    tree.extend(0, list(range(20)))
    # The context's first token is never part of the match (99 occurs nowhere anyway).
    assert tree.speculate([99, 3], 10).tokens == [4]  # one matched token earns one draft token
    assert tree.speculate([99, 0, 1, 2, 3], 10).tokens == [4, 5, 6, 7]
    assert tree.speculate([99, 0, 1, 2, 3], 10, max_spec_factor=2.0).tokens == [4, 5, 6, 7, 8, 9, 10, 11]
    assert tree.speculate([99, 0, 1, 2, 3], 2).tokens == [4, 5]  # capped at k
    assert tree.speculate([99, 0, 1, 2, 3], 10, max_spec_offset=1.5).tokens == [4, 5, 6, 7, 8]


def test_bad_settings_are_refused(tiny_model):
    for kwargs, msg in [({"max_tree_depth": 0}, "max_tree_depth"), ({"max_spec_factor": -1}, "max_spec_factor"),
                        ({"min_token_prob": 1.5}, "min_token_prob")]:
        with pytest.raises(ValueError, match=msg):
            SuffixProposer(**kwargs)
    with pytest.raises(ValueError, match="greedy"):
        load_proposer("suffix", tiny_model, draft_sampling="sample")


def _prompts(n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 60, (int(8 + 3 * i),), generator=g) for i in range(n)]


def test_exact_on_every_path_and_later_requests_draft_from_earlier_ones(tiny_model):
    model = tiny_model
    prompts = _prompts()
    plain = [autoregressive_generate(model, p, max_new_tokens=24, stop_on_eos=False).tokens.tolist() for p in prompts]
    proposer = load_proposer("suffix", model, k=8)
    first = [generate(model, p, proposer=proposer, max_new_tokens=24, stop_on_eos=False) for p in prompts]
    assert [r.tokens.tolist() for r in first] == plain
    # The same prompts again: every output is already in the global tree, drafts are long and accepted.
    again = [generate(model, p, proposer=proposer, max_new_tokens=24, stop_on_eos=False) for p in prompts]
    assert [r.tokens.tolist() for r in again] == plain
    assert sum(r.stats.accepted for r in again) > sum(r.stats.accepted for r in first)
    assert all(r.stats.steps < 24 for r in again)
    batch = generate_batch(model, prompts, proposer=load_proposer("suffix", model, k=8), max_new_tokens=24,
                           stop_on_eos=False)
    assert [r.tokens.tolist() for r in batch] == plain
    served = serve(model, prompts, proposer=load_proposer("suffix", model, k=8), max_new_tokens=24,
                   stop_on_eos=False, num_blocks=14, block_size=4, max_num_seqs=3)
    assert [r.output for r in served.requests] == plain
    assert served.num_preemptions > 0


@pytest.mark.parametrize("twin", [False, True])
def test_a_preempted_request_is_not_counted_twice(tiny_model, monkeypatch, twin):
    """After preemption and resumption each request's output is in the global tree once. Twin: a
    resumed request starts as a new one, so its output so far is added a second time."""
    model = tiny_model
    if twin:
        monkeypatch.setattr(SuffixProposer, "resume", lambda self, state, request_id: self.begin(state))
    prompts = _prompts(4, seed=3)
    proposer = load_proposer("suffix", model, k=8)
    served = serve(model, prompts, proposer=proposer, max_new_tokens=20, stop_on_eos=False,
                   num_blocks=12, block_size=4)
    assert served.num_preemptions > 0
    outputs = [r.output for r in served.requests]
    same = tree_counts(proposer.cache.global_tree) == brute_counts(outputs, proposer.max_tree_depth)
    assert same != twin
