import random

import pytest

from specdecode_ref.proposers import NgramProposer, load_proposer


def reference_lookup(tokens, k, min_n, max_n, occurrence="recent"):
    """Brute force: longest suffix with an earlier occurrence, periodic continuation."""
    length = len(tokens)
    for n in range(min(max_n, length), min_n - 1, -1):
        suffix = tokens[length - n:]
        ends = range(length - 2, n - 2, -1) if occurrence == "recent" else range(n - 1, length - 1)
        for end in ends:
            if tokens[end - n + 1: end + 1] == suffix:
                period = length - 1 - end
                return [tokens[end + 1 + (j % period)] for j in range(k)]
    return []


def test_simple_copy_from_prompt():
    p = NgramProposer(k=3, min_n=1, max_n=3)
    assert p.lookup([5, 6, 7, 8, 9, 1, 5, 6]) == [7, 8, 9]


def test_longest_suffix_wins():
    # "2 3" follows by 4 earlier; the longer match "1 2 3" is followed by 9.
    p = NgramProposer(k=1, min_n=1, max_n=3)
    assert p.lookup([1, 2, 3, 9, 0, 2, 3, 4, 0, 1, 2, 3]) == [9]


def test_no_match_and_min_n():
    assert NgramProposer(k=3).lookup([1, 2, 3, 4]) == []
    assert NgramProposer(k=3, min_n=2).lookup([1, 2, 9, 1]) == []  # only a 1-gram matches
    assert NgramProposer(k=3, min_n=1).lookup([1, 2, 9, 1]) == [2, 9, 1]


def test_match_near_end_repeats_with_period():
    # k larger than what follows the match: the continuation repeats the cycle.
    assert NgramProposer(k=5, min_n=1, max_n=2).lookup([4, 7, 8, 7, 8]) == [7, 8, 7, 8, 7]
    assert NgramProposer(k=4, min_n=1, max_n=3).lookup([3, 3, 3]) == [3, 3, 3, 3]


def test_matches_brute_force_and_is_incremental():
    rng = random.Random(0)
    for trial in range(30):
        vocab = rng.choice([3, 5, 20])
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(1, 60))]
        k, min_n = rng.randrange(1, 6), rng.randrange(1, 3)
        max_n = min_n + rng.randrange(0, 4)
        occurrence = rng.choice(["recent", "first"])
        p = NgramProposer(k=k, min_n=min_n, max_n=max_n, occurrence=occurrence)
        for cut in range(1, len(tokens) + 1):  # grow the context as generation does
            expected = reference_lookup(tokens[:cut], k, min_n, max_n, occurrence)
            assert p.lookup(tokens[:cut]) == expected, (trial, cut)


def test_long_context_index_is_incremental():
    """At 4k tokens each lookup touches O(max_n) keys: the index grows by max_n entries per token."""
    rng = random.Random(1)
    tokens = [rng.randrange(50) for _ in range(4096)]
    p = NgramProposer(k=5, min_n=1, max_n=4)
    p.lookup(tokens)
    size = len(p._index)
    p.lookup(tokens + [7])
    assert len(p._index) - size <= 4
    assert p.lookup(tokens + [7]) == reference_lookup(tokens + [7], 5, 1, 4)


def test_rewritten_context_rebuilds():
    p = NgramProposer(k=2, min_n=1, max_n=2)
    p.lookup([1, 2, 3, 1])
    assert p.lookup([9, 8, 7, 9]) == [8, 7]


@pytest.mark.parametrize("kwargs", [dict(k=0), dict(k=-1), dict(k=2.0), dict(min_n=0), dict(min_n=3, max_n=2),
                                    dict(occurrence="last")])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        NgramProposer(**kwargs)


def test_draft_length_scales_with_match_length():
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1]
    p = NgramProposer(k=8, min_n=1, max_n=4, k_per_matched_token=2)
    assert p.lookup([9, 1, 2, 3, 4, 5, 6, 0, 9, 1]) == [2, 3, 4, 5]  # 2-gram "9 1": 2 * 2 tokens
    assert p.lookup(tokens + [2, 3]) == [4, 5, 6, 7, 8, 9, 1, 2]  # a 4-gram match: capped at k
    assert NgramProposer(k=8, k_per_matched_token=3).lookup([5, 9, 1, 5]) == [9, 1, 5]
    with pytest.raises(ValueError):
        NgramProposer(k_per_matched_token=0)


def test_load_proposer():
    p = load_proposer("ngram", k=7, max_n=3)
    assert isinstance(p, NgramProposer) and p.k == 7 and p.max_n == 3 and p.k_per_matched_token == 2
    assert load_proposer("ngram").k == 8
    assert load_proposer("ngram", k_per_matched_token=None).k_per_matched_token is None
    with pytest.raises(ValueError, match="unknown proposer"):
        load_proposer("nope")
    with pytest.raises(ValueError, match="target"):
        load_proposer("eagle")  # model-based proposers need the target


def test_unrelated_context_with_same_token_at_the_seam_rebuilds():
    p = NgramProposer(k=2, min_n=1, max_n=2)
    p.lookup([1, 2, 3, 1])
    assert p.lookup([5, 6, 3, 8, 2]) == []  # shares token 3 at index 2, nothing else


def _earliest_longest_truncated(tokens, k, min_n, max_n):
    """The production rule (vLLM's prompt lookup), written as a plain scan: the longest suffix of
    length min_n..max_n that occurred earlier with a follower, its earliest occurrence, and at most
    k followers up to the end of the context."""
    L = len(tokens)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        suffix = tokens[L - n:]
        for start in range(0, L - n):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


def test_vllm_rule_matches_a_plain_scan():
    rng = random.Random(1)
    for _ in range(300):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        p = NgramProposer(k=5, min_n=1, max_n=4, occurrence="first", extend_periodically=False)
        assert p.lookup(tokens) == _earliest_longest_truncated(tokens, 5, 1, 4), tokens
    # The course's default differs exactly there: it repeats a match's followers periodically.
    assert NgramProposer(k=4).lookup([7, 8, 7]) == [8, 7, 8, 7]
    assert NgramProposer(k=4, extend_periodically=False).lookup([7, 8, 7]) == [8, 7]
