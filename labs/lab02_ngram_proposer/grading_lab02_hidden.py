"""Lab 2 grading tests (hidden): edge cases, a brute-force comparison, and a 4k-token context."""
import random
import time

import pytest

from grading_lab02 import brute_force, random_text
from specdecode_ref.grading import lab_fixture, points

lab = lab_fixture(__file__)


@points(1)
def test_match_at_the_very_end(lab):
    """ngram_lookup: an occurrence that overlaps the suffix (period 1 or 2) still counts."""
    assert lab.ngram_lookup([9, 4, 4, 4], k=3) == [4, 4, 4]
    assert lab.ngram_lookup([3, 3], k=2) == [3, 3]
    assert lab.ngram_lookup([8, 1, 2, 1, 2], k=3) == [1, 2, 1]


@points(1)
def test_min_and_max_n_respected(lab):
    """ngram_lookup: suffixes shorter than min_n or longer than max_n are not used."""
    assert lab.ngram_lookup([1, 2, 3, 1], k=2, min_n=2, max_n=3) == []
    assert lab.ngram_lookup([1, 2, 3, 1], k=2, min_n=1, max_n=3) == [2, 3]
    # The 3-gram [1, 2, 3] points to 4, the 2-gram [2, 3] more recently to 5.
    tokens = [1, 2, 3, 4, 0, 2, 3, 5, 1, 2, 3]
    assert lab.ngram_lookup(tokens, k=1, max_n=3) == [4]
    assert lab.ngram_lookup(tokens, k=1, max_n=2) == [5]


@points(1)
def test_empty_and_short_contexts(lab):
    """ngram_lookup: [] and one-token contexts propose nothing."""
    assert lab.ngram_lookup([], k=3) == []
    assert lab.ngram_lookup([5], k=3) == []


@points(3)
def test_against_brute_force(lab):
    """ngram_lookup agrees with a brute force on 600 random contexts and settings."""
    rng = random.Random(11)
    for case in range(600):
        tokens = random_text(case, rng.randrange(0, 40), rng.choice([2, 3, 5, 8]))
        min_n = rng.randrange(1, 4)
        max_n = rng.randrange(min_n, 6)
        k = rng.randrange(1, 9)
        want = brute_force(tokens, k, min_n, max_n)
        got = lab.ngram_lookup(list(tokens), k, min_n, max_n)
        assert list(got) == want, f"tokens={tokens}, k={k}, min_n={min_n}, max_n={max_n}: got {got}, want {want}"


@points(1)
def test_invalid_arguments(lab):
    """ngram_lookup raises ValueError for k < 1, min_n < 1 or max_n < min_n."""
    for kwargs in (dict(k=0), dict(k=2, min_n=0), dict(k=2, min_n=3, max_n=2)):
        with pytest.raises(ValueError):
            lab.ngram_lookup([1, 2, 1, 2], **kwargs)


@points(1)
def test_does_not_modify_input(lab):
    """ngram_lookup and NgramProposer.lookup leave the token list alone."""
    tokens = [4, 5, 6, 4, 5]
    lab.ngram_lookup(tokens, k=6)
    lab.NgramProposer(k=6).lookup(tokens)
    assert tokens == [4, 5, 6, 4, 5]


@points(1)
def test_proposer_respects_settings(lab):
    """NgramProposer with k=6, min_n=2, max_n=3 on growing random contexts."""
    prop = lab.NgramProposer(k=6, min_n=2, max_n=3)
    ctx = []
    for t in random_text(3, 400, 4):
        ctx.append(t)
        got = prop.lookup(ctx)
        assert list(got) == brute_force(ctx, 6, 2, 3), f"context length {len(ctx)}"


@points(1)
def test_proposer_new_context(lab):
    """NgramProposer.lookup handed an unrelated context (a new request) answers for that one."""
    prop = lab.NgramProposer(k=3)
    first = random_text(4, 200, 6)
    for n in range(1, 201):
        prop.lookup(first[:n])
    second = [t + 10 for t in random_text(5, 120, 6)]  # shorter, no token in common
    assert list(prop.lookup(second)) == brute_force(second, 3)
    third = [t + 20 for t in random_text(6, 300, 6)]  # longer, no token in common
    assert list(prop.lookup(third)) == brute_force(third, 3)


@points(2)
def test_proposer_new_context_sharing_tokens(lab):
    """A new list that agrees with the indexed context where a quick check would look (its first
    tokens, its length, the last indexed token, its last tokens) but differs in between: the
    draft is the one for the new context."""
    for seed in range(12):
        rng = random.Random(100 + seed)
        old = random_text(200 + seed, 300, 5)
        prop = lab.NgramProposer(k=4, min_n=1, max_n=3)
        ctx = []
        for t in old:  # indexed the way the engine grows its list
            ctx.append(t)
            prop.lookup(ctx)
        new = list(old) + ([rng.randrange(5)] if seed % 2 else [])  # as long as the old one, or one longer
        a, b = rng.randrange(10, 120), rng.randrange(150, 280)
        new[a:b] = random_text(300 + seed, b - a, 5)
        got = prop.lookup(new)
        assert list(got) == brute_force(new, 4, 1, 3), (
            f"a new context equal to the old one except at positions {a}..{b - 1}: got {got}, "
            f"want {brute_force(new, 4, 1, 3)} (was the old index reused?)")


class CountingList(list):
    """A list that counts how many of its elements the code under test reads. Under the grader the
    list lives where your code runs (``count_reads``): the count is read from there."""

    count_reads = True
    reads = 0

    def __getitem__(self, i):
        out = super().__getitem__(i)
        CountingList.reads += len(out) if isinstance(i, slice) else 1
        return out

    def __iter__(self):
        CountingList.reads += len(self)
        return super().__iter__()


def reads_during(lab, ctx, call) -> int:
    """Elements of ``ctx`` read while ``call()`` runs."""
    if callable(getattr(type(lab), "list_reads", None)):
        lab.list_reads(ctx, reset=True)
        call()
        return lab.list_reads(ctx)
    CountingList.reads = 0
    call()
    return CountingList.reads


def cpu_seconds(lab) -> float:
    """CPU time of the process that runs your code (the grader reads it from the system)."""
    return lab.cpu_seconds() if callable(getattr(type(lab), "cpu_seconds", None)) else time.process_time()


LONG = 4096
LATE = LONG - 256


@points(2)
def test_proposer_reads_only_new_tokens(lab):
    """In the engine's pattern (one list, grown by 1 to k + 1 tokens per call) a call at a 4k
    context reads the new tokens and the suffix, not the whole context (tokens read are counted)."""
    k, max_n = 5, 4
    text = random_text(9, LONG, 50)
    prop = lab.NgramProposer(k=k, max_n=max_n)
    ctx = CountingList(text[:LATE])
    prop.lookup(ctx)  # index the long context once (not counted)
    rng = random.Random(9)
    while len(ctx) < LONG:
        grown = rng.randint(1, k + 1)
        ctx.extend(text[len(ctx):len(ctx) + grown])
        reads = reads_during(lab, ctx, lambda: prop.lookup(ctx))
        limit = 20 * max_n * (grown + 1) + 4 * k
        assert reads <= limit, (
            f"a call at context length {len(ctx)}, {grown} new tokens, read {reads} tokens "
            f"(at most {limit} expected): does every call compare, copy or scan the whole context?")



@points(2)
def test_proposer_long_context_correct(lab):
    """A 4k-token context: catch up in one call, then one token per call; drafts match the rule."""
    text = random_text(7, LONG, 50)
    prop = lab.NgramProposer(k=5)
    ctx = text[:LATE]
    assert list(prop.lookup(ctx)) == brute_force(ctx, 5)
    for i, t in enumerate(text[LATE:]):
        ctx.append(t)
        got = prop.lookup(ctx)
        if i % 13 == 0:
            assert list(got) == brute_force(ctx, 5), f"context length {len(ctx)}"


def _time_block(lab, prop, ctx, new_tokens):
    t0 = cpu_seconds(lab)
    for t in new_tokens:
        ctx.append(t)
        prop.lookup(ctx)
    return cpu_seconds(lab) - t0


@points(2)
def test_proposer_cost_does_not_grow(lab):
    """256 one-token steps at a 4k context cost about as much as at the start (CPU time, 4x + 50 ms slack)."""
    text = random_text(8, LONG, 50)
    for attempt in range(2):
        early = _time_block(lab, lab.NgramProposer(k=5), [], text[:256])
        prop = lab.NgramProposer(k=5)
        ctx = text[:LATE]
        prop.lookup(ctx)  # index the long context once (not timed)
        late = _time_block(lab, prop, ctx, text[LATE:])
        if late <= 4 * early + 0.05:
            return
    pytest.fail(f"256 steps took {late:.3f} s at 4k tokens vs {early:.3f} s at the start: "
                "does every call rescan the context?")
