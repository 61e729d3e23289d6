import numpy as np
import pytest

from specdecode_ref.analysis import (expected_speedup, expected_tokens_from_position_rates, expected_tokens_per_step,
                                     fit_cost_curve, optimal_k, verify_cost_from_curve)


def test_expected_tokens_closed_form():
    assert expected_tokens_per_step(0.0, 5) == pytest.approx(1.0)
    assert expected_tokens_per_step(1.0, 5) == pytest.approx(6.0)
    assert expected_tokens_per_step(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens_per_step(0.8, 0) == pytest.approx(1.0)
    arr = expected_tokens_per_step(np.array([0.0, 0.5, 1.0]), 3)
    np.testing.assert_allclose(arr, [1.0, 1.875, 4.0])


def test_expected_tokens_matches_monte_carlo():
    rng = np.random.default_rng(0)
    for alpha, k in [(0.3, 4), (0.7, 5), (0.9, 8)]:
        accepts = rng.random((200000, k)) < alpha
        emitted = np.cumprod(accepts, axis=1).sum(axis=1) + 1
        assert emitted.mean() == pytest.approx(expected_tokens_per_step(alpha, k), rel=0.01)


def test_position_rates_reduce_to_iid():
    assert expected_tokens_from_position_rates([0.6] * 4) == pytest.approx(expected_tokens_per_step(0.6, 4))
    assert expected_tokens_from_position_rates([0.9, 0.5, 0.1]) == pytest.approx(1 + 0.9 + 0.45 + 0.045)


def test_speedup_and_optimal_k_by_brute_force():
    assert expected_speedup(0.0, 1, 0.0) == pytest.approx(1.0)
    assert expected_speedup(0.8, 4, 0.05) == pytest.approx(expected_tokens_per_step(0.8, 4) / 1.2)
    for alpha in [0.2, 0.6, 0.8, 0.95]:
        for c in [0.01, 0.1, 0.5]:
            best = max(range(1, 65), key=lambda k: (expected_speedup(alpha, k, c), -k))
            assert optimal_k(alpha, c) == best
    assert optimal_k(0.9, 0.05) > optimal_k(0.5, 0.05)  # better drafts justify longer drafts
    assert optimal_k(0.9, 0.01) >= optimal_k(0.9, 0.2)  # cheaper drafts too


def test_verify_cost_callable():
    cost = verify_cost_from_curve([1, 2, 4, 8], [10.0, 11.0, 13.0, 17.0])
    assert cost(0) == pytest.approx(1.0)
    assert cost(3) == pytest.approx(1.3)
    assert cost(15) == pytest.approx((10 + 1.0 * 15) / 10 + 0.1, rel=0.2)
    s = expected_speedup(0.8, 3, 0.0, verify_cost=cost)
    assert s == pytest.approx(expected_tokens_per_step(0.8, 3) / 1.3)
    a, b, t = fit_cost_curve([1, 2, 3], [2.0, 3.0, 4.0])
    assert (a, b) == (pytest.approx(1.0), pytest.approx(1.0)) and t(10) == pytest.approx(11.0)


@pytest.mark.parametrize("args", [(1.5, 3), (-0.1, 3), (0.5, -1), (0.5, 2.5)])
def test_bad_inputs(args):
    with pytest.raises(ValueError):
        expected_tokens_per_step(*args)
    with pytest.raises(ValueError):
        expected_speedup(0.5, 3, -1.0)


def test_break_even_alpha():
    from specdecode_ref.analysis import break_even_alpha

    for k, c, v in [(1, 0.1, 1.0), (4, 0.05, 1.2), (8, 0.2, lambda k: 1 + 0.1 * k)]:
        a = break_even_alpha(k, c, v)
        vk = v(k) if callable(v) else v
        assert 0 < a < 1
        assert expected_speedup(a, k, c, vk) == pytest.approx(1.0, abs=1e-9)
        assert expected_speedup(a + 0.01, k, c, vk) > 1 > expected_speedup(a - 0.01, k, c, vk)
    # k = 1, V = 1: 1 + alpha = 1 + c, so the break-even alpha is c itself
    assert break_even_alpha(1, 0.3) == pytest.approx(0.3)
    assert break_even_alpha(3, 0.0, 0.9) == 0.0           # a step cheaper than a plain step: always wins
    assert np.isnan(break_even_alpha(2, 1.0, 1.5))        # costs more than k + 1 plain steps: never wins
    with pytest.raises(ValueError):
        break_even_alpha(0, 0.1)


def test_rule_of_thumb_against_optimal_k():
    """k* ~ 1/(1 - alpha) ignores the costs. Pinned where it holds and where it misleads."""
    from specdecode_ref.analysis import optimal_k, rule_of_thumb_k

    assert rule_of_thumb_k(0.8) == pytest.approx(5.0) and rule_of_thumb_k(1.0) == np.inf
    assert np.allclose(rule_of_thumb_k(np.array([0.0, 0.5])), [1.0, 2.0])
    alphas = [0.5, 0.6, 0.7, 0.8, 0.9]
    # Flat verification (V = 1) and a moderately priced drafter (c = 0.1): within one token.
    for a in alphas:
        assert abs(optimal_k(a, 0.1) - rule_of_thumb_k(a)) <= 1.0, a
    # A nearly free drafter (n-gram lookup, c -> 0) on a flat cost curve: the rule undershoots.
    for a in alphas:
        assert optimal_k(a, 0.001, k_max=200) > 2 * rule_of_thumb_k(a), a
    # An expensive drafter (c = 0.4) or a steep verify cost: the rule overshoots for good drafters.
    for a in [0.8, 0.9, 0.95]:
        assert optimal_k(a, 0.4) < rule_of_thumb_k(a), a
        assert optimal_k(a, 0.2, lambda k: 1 + 0.1 * k) < rule_of_thumb_k(a), a


# ---- per-token acceptance: drafting from q versus the argmax -------------------------------------

def test_acceptance_with_q_is_one_minus_total_variation():
    import torch

    from specdecode_ref.analysis import acceptance_with_q

    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(5, 12, generator=g), -1)
    q = torch.softmax(torch.randn(5, 12, generator=g), -1)
    torch.testing.assert_close(acceptance_with_q(p, q), 1 - 0.5 * (p - q).abs().sum(-1))
    torch.testing.assert_close(acceptance_with_q(p, q), acceptance_with_q(q, p))
    torch.testing.assert_close(acceptance_with_q(p, p), torch.ones(5))
    assert float(acceptance_with_q([0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5])) == 0.0


def test_acceptance_one_hot_is_p_of_the_proposed_token():
    import torch

    from specdecode_ref.analysis import acceptance_one_hot

    p = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.25, 0.25]])
    torch.testing.assert_close(acceptance_one_hot(p, torch.tensor([1, 2])), torch.tensor([0.6, 0.25]))
    assert float(acceptance_one_hot(p[0], 2)) == pytest.approx(0.3)


def _tempered(logits, t):
    import torch

    return torch.softmax(logits / t, -1)


def test_which_regime_accepts_more_depends_on_the_temperature():
    """T -> 0: both regimes give [argmax q == argmax p]. High T with q tracking p: drafting from
    q wins. A peaked target with a drafter that is right on top but flat elsewhere: the argmax wins."""
    import torch

    from specdecode_ref.analysis import acceptance_one_hot, acceptance_with_q

    g = torch.Generator().manual_seed(1)
    target = torch.randn(200, 50, generator=g) * 3
    tracking = target + 0.3 * torch.randn(200, 50, generator=g)  # a good drafter: q close to p
    from specdecode_ref.sampling import GREEDY, logits_to_probs

    # T = 0 (the package's limit: one-hot on the argmax): the same number, [argmax q == argmax p]
    p, q = logits_to_probs(target, GREEDY), logits_to_probs(tracking, GREEDY)
    agree = (tracking.argmax(-1) == target.argmax(-1)).float()
    torch.testing.assert_close(acceptance_with_q(p, q), agree)
    torch.testing.assert_close(acceptance_one_hot(p, q.argmax(-1)), agree)
    # close to 0: nearly the same (only near-ties in the logits keep some spread)
    p, q = _tempered(target, 0.01), _tempered(tracking, 0.01)
    gap = (acceptance_with_q(p, q) - acceptance_one_hot(p, q.argmax(-1))).abs().mean()
    assert float(gap) < 0.05
    # T = 1: p(a*) has fallen, 1 - TV(p, q) has not
    p, q = _tempered(target, 1.0), _tempered(tracking, 1.0)
    assert float(acceptance_with_q(p, q).mean()) > float(acceptance_one_hot(p, q.argmax(-1)).mean()) + 0.2
    # a peaked p; q agrees on the top token but spreads the rest of its mass evenly
    p = torch.tensor([0.9] + [0.1 / 9] * 9)
    q = torch.tensor([0.5] + [0.5 / 9] * 9)
    assert float(acceptance_one_hot(p, 0)) == pytest.approx(0.9)
    assert float(acceptance_with_q(p, q)) == pytest.approx(0.5 + 9 * 0.1 / 9)  # 0.6 < 0.9


def test_acceptance_functions_reject_bad_input():
    import torch

    from specdecode_ref.analysis import acceptance_one_hot, acceptance_with_q

    p = torch.tensor([0.2, 0.8])
    with pytest.raises(ValueError, match="same shape"):
        acceptance_with_q(p, torch.tensor([0.2, 0.3, 0.5]))
    with pytest.raises(ValueError, match="sum to 1"):
        acceptance_with_q(p, torch.tensor([2.0, 3.0]))
    with pytest.raises(ValueError, match="non-negative"):
        acceptance_with_q(p, torch.tensor([-0.2, 1.2]))
    with pytest.raises(ValueError, match="lie in"):
        acceptance_one_hot(p, 2)
    with pytest.raises(ValueError, match="leading shape"):
        acceptance_one_hot(p, torch.tensor([0, 1]))
