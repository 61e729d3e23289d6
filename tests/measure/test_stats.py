"""The statistical tools behind notebook 01: the chi-square test and the batched first-token probe."""
import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats

from specdecode_ref.measure.harness.stats import (acceptance_probability, chi_square_pvalue, chi_square_test,
                                  first_token_counts, randomized_pit, uniformity_test)
from specdecode_ref.verify import rejection_sample


def dist(xs):
    t = torch.tensor(xs, dtype=torch.float64)
    return (t / t.sum()).float()


P = dist([3, 1, 4, 1, 5, 9, 2, 6])
Q = dist([2, 7, 1, 8, 2, 8, 1, 8])


def exact_counts(p, n, seed):
    p = np.asarray(p, dtype=float)
    return np.random.default_rng(seed).multinomial(n, p / p.sum())


# --- chi_square_test -----------------------------------------------------------------------------

def test_matches_scipy_when_nothing_is_pooled():
    counts = exact_counts(P, 5000, 0)
    res = chi_square_test(counts, P)
    p = P.double().numpy()
    ref = scipy_stats.chisquare(counts, p / p.sum() * 5000)
    assert res.pooled == 0 and res.bins == 8 and res.dof == 7
    assert res.statistic == pytest.approx(ref.statistic, rel=1e-9)
    assert res.pvalue == pytest.approx(ref.pvalue, rel=1e-6)


def test_right_distribution_passes_wrong_one_fails():
    assert chi_square_pvalue(exact_counts(P, 20000, 1), P) > 1e-3
    assert chi_square_pvalue(exact_counts(Q, 20000, 1), P) < 1e-12
    # A small distortion (2 % of the mass moved) is still caught with enough draws.
    moved = P.clone()
    moved[5] -= 0.02
    moved[0] += 0.02
    assert chi_square_pvalue(exact_counts(moved, 100000, 2), P) < 1e-6


def test_zero_probability_draw_rejects_outright():
    p = dist([1, 1, 0, 2])
    counts = [250, 250, 1, 499]
    res = chi_square_test(counts, p)
    assert res.pvalue == 0.0 and res.impossible == 1 and res.statistic == float("inf")
    # Zero-probability bins without draws are simply dropped.
    assert chi_square_test([250, 250, 0, 500], p).pvalue > 0.5


def test_small_bins_are_pooled():
    # 1000 draws; 60 tokens of probability 1e-4 each (expected 0.1 each) get pooled into one bin
    # (expected 6 in all, enough to stand alone).
    p = np.r_[[0.5, 0.3, 0.194], np.full(60, 1e-4)]
    res = chi_square_test(exact_counts(p, 1000, 3), p)
    assert res.pooled == 60 and res.bins == 4 and res.dof == 3
    # A pooled bin that is still too small is merged into the smallest kept bin.
    p2 = np.r_[[0.6, 0.399], np.full(10, 1e-4)]
    res2 = chi_square_test(exact_counts(p2, 1000, 4), p2)
    assert res2.pooled == 10 and res2.bins == 2 and res2.dof == 1


def _rejections_at_5_percent(pvalue, n=1000):
    """How many of n samples of the right law a p-value function rejects at 0.05 (seeds 0..n-1)."""
    p = np.r_[np.linspace(1, 30, 20), np.full(30, 0.05)]
    p = p / p.sum()
    return sum(pvalue(exact_counts(p, 2000, seed), p) < 0.05 for seed in range(n))


# Under the null, rejections ~ Binomial(1000, 0.05): mean 50, sd 6.9. The band [30, 72] holds a
# calibrated test with 3 sd to spare on each side; a test that rejects twice as often (mean 100,
# sd 9.5) lands in it with probability about 0.2 %, and so does one that rejects half as often.
CALIBRATED = range(30, 73)


def test_calibrated_under_the_null():
    """With pooling, the p-value is ~uniform when the null holds: about 5 % fall below 0.05."""
    below = _rejections_at_5_percent(chi_square_pvalue)
    assert below in CALIBRATED, below


@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_planted_miscalibrated_pvalue_is_caught(factor):
    """The same check catches a p-value that rejects twice (or half) as often as it should."""
    below = _rejections_at_5_percent(lambda c, p: min(1.0, chi_square_pvalue(c, p) / factor))
    assert below not in CALIBRATED, below


def test_input_errors():
    with pytest.raises(ValueError, match="same length"):
        chi_square_test([1, 2], [0.5, 0.3, 0.2])
    with pytest.raises(ValueError, match="no draws"):
        chi_square_test([0, 0], [0.5, 0.5])
    with pytest.raises(ValueError, match=">= 0"):
        chi_square_test([1, -1], [0.5, 0.5])


# --- first_token_counts --------------------------------------------------------------------------

def test_counts_follow_p_and_acceptance_matches_theory():
    res = first_token_counts(P, Q, 40000, seed=0, return_details=True)
    assert res.counts.sum() == 40000 and res.counts.shape == (8,)
    assert chi_square_pvalue(res.counts, P) > 1e-3
    beta = acceptance_probability(P, Q)
    assert abs(res.acceptance_rate - beta) < 4 * np.sqrt(beta * (1 - beta) / 40000)


def test_deterministic_draft_acceptance_is_p_of_the_token():
    res = first_token_counts(P, deterministic_token=5, n=40000, seed=1, return_details=True)
    assert chi_square_pvalue(res.counts, P) > 1e-3
    p5 = float(P[5])
    assert abs(res.acceptance_rate - p5) < 4 * np.sqrt(p5 * (1 - p5) / 40000)


def test_large_vocabulary_runs_on_the_support_only():
    v = 200_000  # [n, 2, V] in float32 would be 32 GB at n = 20000
    p = torch.zeros(v)
    q = torch.zeros(v)
    p[[7, 1000, 123456]] = torch.tensor([0.5, 0.3, 0.2])
    q[[7, 1000, 199999]] = torch.tensor([0.2, 0.2, 0.6])
    counts = first_token_counts(p, q, 20000, seed=2)
    assert counts.shape == (v,) and counts.sum() == 20000
    assert set(np.nonzero(counts)[0].tolist()) == {7, 1000, 123456}  # never q's 199999 (p = 0 there)
    assert chi_square_pvalue(counts, p) > 1e-3


def test_same_seed_same_counts_and_sampler_is_used():
    a = first_token_counts(P, Q, 5000, seed=7)
    b = first_token_counts(P, Q, 5000, seed=7)
    assert (a == b).all()
    calls = []

    def spy(target, drafts, draft_probs=None, generator=None):
        calls.append((tuple(target.shape), tuple(drafts.shape)))
        return rejection_sample(target, drafts, draft_probs, generator)

    first_token_counts(P, Q, 300, sampler=spy)
    assert calls == [((300, 2, 8), (300, 1))]  # one batched call, K = 1


def test_probe_input_errors():
    with pytest.raises(ValueError, match="exactly one"):
        first_token_counts(P, Q, 10, deterministic_token=1)
    with pytest.raises(ValueError, match="exactly one"):
        first_token_counts(P, None, 10)
    with pytest.raises(ValueError, match="same length"):
        first_token_counts(P, dist([1, 1]), 10)
    with pytest.raises(ValueError, match="deterministic_token"):
        first_token_counts(P, deterministic_token=8, n=10)


def test_acceptance_probability_is_one_minus_total_variation():
    tv = 0.5 * float((P - Q).abs().sum())
    assert acceptance_probability(P, Q) == pytest.approx(1 - tv, abs=1e-6)
    assert acceptance_probability(P, P) == pytest.approx(1.0, abs=1e-6)


# --- randomized PIT along a sequence ------------------------------------------------------------

def markov_chain(n, seed, wrong=False):
    """Tokens from a random 6-state chain whose next-token law depends on the previous token."""
    g = torch.Generator().manual_seed(seed)
    trans = torch.softmax(torch.randn(6, 6, generator=g) * 2, -1)
    sample_from = torch.softmax(torch.randn(6, 6, generator=g) * 2, -1) if wrong else trans
    prev, toks, probs = 0, [], []
    for _ in range(n):
        t = int(torch.multinomial(sample_from[prev], 1, generator=g))
        toks.append(t)
        probs.append(trans[prev])
        prev = t
    return torch.stack(probs), torch.tensor(toks)


def test_pit_is_uniform_for_the_right_law_only():
    probs, toks = markov_chain(3000, 0)
    u = randomized_pit(probs, toks, torch.Generator().manual_seed(1))
    assert u.shape == (3000,) and (u >= 0).all() and (u <= 1).all()
    assert uniformity_test(u) > 1e-3
    probs_w, toks_w = markov_chain(3000, 0, wrong=True)
    assert uniformity_test(randomized_pit(probs_w, toks_w, torch.Generator().manual_seed(1))) < 1e-6


def test_pit_rejects_impossible_tokens_and_bad_shapes():
    with pytest.raises(ValueError, match="probability 0"):
        randomized_pit(torch.tensor([[0.5, 0.5, 0.0]]), torch.tensor([2]))
    with pytest.raises(ValueError, match=r"\[N, V\]"):
        randomized_pit(torch.tensor([[0.5, 0.5]]), torch.tensor([0, 1]))
