"""Lab 2 grading tests (visible): the checks the notebook walks you through."""
import random

from specdecode_ref.grading import lab_fixture, points

lab = lab_fixture(__file__)
# Flagged by the grader: using the reference proposer (the stub itself imports only Draft and Proposer).
REFERENCE_PATTERNS = [r"specdecode_ref\.proposers\.ngram|import[^\n]*\bNgramProposer\b|load_proposer"]


def brute_force(tokens, k, min_n=1, max_n=4):
    """The rule written as directly as possible: find every earlier occurrence of the longest
    suffix, take the last one, and copy k tokens from after it, letting the copy read what it has
    already written (like an LZ77 match that overlaps itself)."""
    tokens = list(tokens)
    L = len(tokens)
    for n in range(max_n, min_n - 1, -1):
        if n > L - 1:
            continue
        suffix = tokens[L - n:]
        ends = [e for e in range(n - 1, L - 1) if tokens[e - n + 1:e + 1] == suffix]
        if ends:
            text = list(tokens)
            start = max(ends) + 1
            for j in range(k):
                text.append(text[start + j])
            return text[L:]
    return []


def random_text(seed, length, vocab):
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(length)]


@points(2)
def test_lookup_example(lab):
    """ngram_lookup: the example from the docstring."""
    assert lab.ngram_lookup([7, 1, 2, 3, 1, 2], k=4, max_n=2) == [3, 1, 2, 3]
    assert lab.ngram_lookup([7, 1, 2, 3, 1, 2], k=2) == [3, 1]


@points(1)
def test_no_match(lab):
    """ngram_lookup: nothing to copy gives []."""
    assert lab.ngram_lookup([1, 2, 3, 4], k=3) == []
    assert lab.ngram_lookup([1, 2, 3, 4, 5, 6, 7], k=1, min_n=1, max_n=3) == []


@points(2)
def test_longest_suffix_wins(lab):
    """ngram_lookup: the longest matching suffix decides, even when a shorter one matched more recently."""
    tokens = [5, 1, 2, 9, 8, 2, 7, 1, 2]  # [1, 2] -> 9 (at e=2); [2] -> 7 more recently (e=5)
    assert lab.ngram_lookup(tokens, k=1, max_n=2) == [9]
    assert lab.ngram_lookup(tokens, k=1, max_n=4) == [9]
    assert lab.ngram_lookup(tokens, k=1, max_n=1) == [7]


@points(1)
def test_most_recent_occurrence(lab):
    """ngram_lookup: among occurrences of the same suffix, the most recent one is copied."""
    assert lab.ngram_lookup([1, 5, 1, 6, 1], k=1) == [6]
    assert lab.ngram_lookup([3, 4, 8, 3, 4, 9, 0, 3, 4], k=2) == [9, 0]


@points(2)
def test_k_larger_than_what_follows(lab):
    """ngram_lookup: past the end of the context the copy continues periodically."""
    assert lab.ngram_lookup([7, 1, 2, 3, 1, 2], k=7, max_n=2) == [3, 1, 2, 3, 1, 2, 3]
    assert lab.ngram_lookup([9, 5, 6, 9], k=5) == [5, 6, 9, 5, 6]


@points(2)
def test_proposer_matches_lookup(lab):
    """NgramProposer.lookup on a growing context gives the same drafts as the rule."""
    text = random_text(1, 300, 8)
    prop = lab.NgramProposer(k=4, min_n=1, max_n=3)
    ctx = []
    for t in text:
        ctx.append(t)
        want = brute_force(ctx, 4, 1, 3)
        got = prop.lookup(ctx)
        assert list(got) == want, f"context length {len(ctx)}: got {got}, want {want}"


@points(2)
def test_proposer_context_grows_by_several_tokens(lab):
    """NgramProposer as the engine calls it: one list, grown by 1 to k + 1 tokens per call."""
    rng = random.Random(2)
    k = 4
    for seed, vocab in ((2, 6), (12, 3)):
        text = random_text(seed, 400, vocab)
        prop = lab.NgramProposer(k=k, min_n=1, max_n=3)
        ctx = text[:5]
        while True:
            got = prop.lookup(ctx)
            want = brute_force(ctx, k, 1, 3)
            assert list(got) == want, f"context length {len(ctx)} (grown by several tokens): got {got}, want {want}"
            if len(ctx) >= len(text):
                break
            ctx.extend(text[len(ctx):len(ctx) + rng.randint(1, k + 1)])
