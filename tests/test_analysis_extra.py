"""analysis.py additions for notebooks 02-03: Monte Carlo, rate conventions, predictions, the K rule."""
import numpy as np
import pytest
import torch

from specdecode_ref import generate
from specdecode_ref.proposers.adaptive import FixedK
from specdecode_ref.analysis import (alpha_from_tau, conditional_position_rates, estimate_alpha,
                                     expected_accepted_per_step, expected_speedup,
                                     expected_speedup_from_position_rates,
                                     expected_tokens_from_position_rates, expected_tokens_from_survival,
                                     expected_tokens_per_step, marginal_gain, monotone_cost_curve, optimal_k,
                                     optimal_k_grid, predicted_speedup_from_measurements, simulate_tokens_per_step,
                                     survival_from_lengths, verify_cost_from_curve)
from specdecode_ref.pitfalls import expected_tokens_bonus_counted_twice
from specdecode_ref.proposers import NgramProposer


@pytest.mark.parametrize("alpha,k", [(0.0, 3), (0.3, 4), (0.7, 5), (0.9, 8), (1.0, 4)])
def test_simulation_matches_closed_form(alpha, k):
    toks = simulate_tokens_per_step(alpha, k, 100_000, rng=np.random.default_rng(1))
    assert toks.min() >= 1 and toks.max() <= k + 1
    assert toks.mean() == pytest.approx(expected_tokens_per_step(alpha, k), rel=0.01, abs=1e-9)
    twice = simulate_tokens_per_step(alpha, k, 1000, rng=3, count_bonus_twice=True)
    np.testing.assert_array_equal(twice, simulate_tokens_per_step(alpha, k, 1000, rng=3) + 1)


def test_simulation_with_position_rates_and_seeding():
    rates = [0.9, 0.6, 0.3, 0.8]
    toks = simulate_tokens_per_step(rates, 4, 100_000, rng=0)
    assert toks.mean() == pytest.approx(expected_tokens_from_position_rates(rates), rel=0.01)
    np.testing.assert_array_equal(simulate_tokens_per_step(0.5, 3, 50, rng=7),
                                  simulate_tokens_per_step(0.5, 3, 50, rng=7))
    assert simulate_tokens_per_step(rates, 2, 10, rng=0).max() <= 3  # only the first k rates are used
    with pytest.raises(ValueError):
        simulate_tokens_per_step([0.5, 0.5], 3, 10)
    with pytest.raises(ValueError):
        simulate_tokens_per_step(0.5, 3, 0)
    with pytest.raises(ValueError):
        simulate_tokens_per_step(1.2, 3, 10)


def test_bonus_bookkeeping():
    for alpha in [0.0, 0.4, 0.8, 1.0]:
        for k in [1, 3, 6]:
            e = expected_tokens_per_step(alpha, k)
            assert expected_accepted_per_step(alpha, k) == pytest.approx(e - 1)
            assert expected_tokens_bonus_counted_twice(alpha, k) == pytest.approx(e + 1)
    assert expected_tokens_bonus_counted_twice(0.0, 5) == pytest.approx(2.0)  # a useless drafter "doubles" speed
    assert expected_accepted_per_step(1.0, 4) == pytest.approx(4.0)


def test_rate_conventions_agree():
    rng = np.random.default_rng(0)
    rates = np.array([0.8, 0.5, 0.7, 0.9, 0.4])
    k = 5
    acc = simulate_tokens_per_step(rates, k, 200_000, rng=rng) - 1
    dra = np.full_like(acc, k)
    reached, accepted, drafted = survival_from_lengths(acc, dra)
    survival = accepted / drafted
    assert np.all(np.diff(survival) <= 0)
    np.testing.assert_allclose(accepted / reached, rates, atol=0.01)
    np.testing.assert_allclose(conditional_position_rates(survival), accepted / reached, atol=1e-12)
    assert expected_tokens_from_survival(survival) == pytest.approx(
        expected_tokens_from_position_rates(conditional_position_rates(survival)))
    # Feeding survival rates where conditional ones are expected multiplies twice: too low.
    assert expected_tokens_from_position_rates(survival) < expected_tokens_from_survival(survival) - 0.1
    np.testing.assert_allclose(conditional_position_rates([0.5, 0.0, 0.0]), [0.5, 0.0, 0.0])


def test_survival_counts_with_unequal_drafts():
    reached, accepted, drafted = survival_from_lengths([0, 2, 1, 3], [2, 2, 3, 4], k_max=4)
    np.testing.assert_array_equal(drafted, [4, 4, 2, 1])
    np.testing.assert_array_equal(accepted, [3, 2, 1, 0])  # steps with accepted >= i
    np.testing.assert_array_equal(reached, [4, 3, 1, 1])  # drafted i and accepted 1..i-1
    with pytest.raises(ValueError):
        survival_from_lengths([3], [2])


def test_specstats_per_position_is_survival(tiny_model):
    prompt = torch.tensor([7, 8, 9, 10, 7, 8, 9, 10, 7, 8, 3, 7, 8, 9])
    wrapped = FixedK(NgramProposer(k=4))
    res = generate(tiny_model, prompt, proposer=wrapped, max_new_tokens=60)
    acc = [r.accepted for r in wrapped.history]
    dra = [r.drafted for r in wrapped.history]
    assert acc == res.stats.accepted_lengths
    _, accepted, drafted = survival_from_lengths(acc, dra, k_max=len(res.stats.per_position_acceptance))
    np.testing.assert_allclose(res.stats.per_position_acceptance, accepted / np.maximum(drafted, 1))
    assert sum(dra) == res.stats.drafted


def test_estimate_alpha_recovers_iid_alpha():
    for alpha in [0.3, 0.7, 0.9]:
        acc = simulate_tokens_per_step(alpha, 5, 100_000, rng=2) - 1
        dra = np.full_like(acc, 5)
        assert estimate_alpha(acc, dra) == pytest.approx(alpha, abs=0.01)
        assert acc.sum() / dra.sum() < alpha - 0.05  # vLLM's acceptance rate is not alpha
    assert estimate_alpha([0, 2, 2], [0, 2, 3]) == pytest.approx(4 / 5)  # empty drafts are ignored
    with pytest.raises(ValueError):
        estimate_alpha([0], [0])


def test_alpha_from_tau_inverts():
    for alpha, k in [(0.0, 3), (0.35, 4), (0.8, 6), (0.999, 2)]:
        assert alpha_from_tau(expected_tokens_per_step(alpha, k), k) == pytest.approx(alpha, abs=1e-6)
    with pytest.raises(ValueError):
        alpha_from_tau(0.5, 3)


def test_predicted_speedup_from_measurements():
    v = verify_cost_from_curve([1, 2, 4, 8], [10.0, 10.5, 11.0, 12.0])
    assert predicted_speedup_from_measurements(4, 0.01, v, alpha=0.7) == pytest.approx(
        expected_speedup(0.7, 4, 0.01, v))
    assert predicted_speedup_from_measurements(4, 0.01, v, position_rates=[0.7] * 4) == pytest.approx(
        expected_speedup(0.7, 4, 0.01, v))
    assert predicted_speedup_from_measurements(3, 0.0, 1.2, tau=2.4) == pytest.approx(2.0)
    # Steps without a draft emit one token at a plain step's cost (plus the lookup).
    s = predicted_speedup_from_measurements(4, 0.0, 1.0, alpha=0.5, c_step=0.1, draft_fraction=0.5)
    assert s == pytest.approx((0.5 * expected_tokens_per_step(0.5, 4) + 0.5) / 1.1)
    assert predicted_speedup_from_measurements(2, 0.0, 1.0, position_rates=[1.0, 1.0, 0.0]) == pytest.approx(3.0)
    for bad in [dict(), dict(tau=2.0, alpha=0.5)]:
        with pytest.raises(ValueError):
            predicted_speedup_from_measurements(3, 0.0, 1.0, **bad)
    with pytest.raises(ValueError):
        predicted_speedup_from_measurements(3, 0.0, 1.0, tau=0.5)


def test_speedup_from_position_rates():
    assert expected_speedup_from_position_rates([0.6] * 5, 5, 0.02, 1.1) == pytest.approx(
        expected_speedup(0.6, 5, 0.02, 1.1))
    assert expected_speedup_from_position_rates([0.9, 0.1], 2, 0.0, 1.0, c_step=0.5) == pytest.approx(
        (1 + 0.9 + 0.09) / 1.5)


def test_marginal_rule_matches_brute_force():
    v = lambda k: 1.0 + 0.05 * k  # noqa: E731
    for alpha in [0.2, 0.5, 0.8, 0.95]:
        for c in [0.0, 0.02, 0.2]:
            for k in range(1, 12):
                de, dc, s = marginal_gain(alpha, k, c, v)
                assert de == pytest.approx(alpha ** (k + 1))
                assert s == pytest.approx(expected_speedup(alpha, k, c, v))
                better = expected_speedup(alpha, k + 1, c, v) > expected_speedup(alpha, k, c, v)
                assert better == (de / dc > s)


def test_optimal_k_grid():
    alphas, cs = [0.3, 0.6, 0.9], [0.01, 0.1]
    grid = optimal_k_grid(alphas, cs)
    assert grid.shape == (2, 3)
    assert grid[1, 2] == optimal_k(0.9, 0.1)
    assert np.all(np.diff(grid, axis=1) >= 0) and np.all(grid[0] >= grid[1])


def test_monotone_cost_curve():
    np.testing.assert_allclose(monotone_cost_curve([1, 2, 3], [1.0, 2.0, 3.0]), [1, 2, 3])
    fit = monotone_cost_curve([1, 2, 3, 4], [10.0, 12.0, 9.0, 13.0])
    np.testing.assert_allclose(fit, [10.0, 10.5, 10.5, 13.0])
    assert np.all(np.diff(monotone_cost_curve(range(8), np.random.default_rng(0).random(8))) >= 0)
    np.testing.assert_allclose(monotone_cost_curve([3, 1, 2], [3.0, 1.0, 2.0]), [1, 2, 3])  # sorted by n
