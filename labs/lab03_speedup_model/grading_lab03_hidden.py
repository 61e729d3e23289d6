"""Lab 3 grading tests (hidden): vectorised inputs, limits, errors, optimal K by brute force,
cost curves, and alpha from measured per-position acceptance."""
import warnings

import numpy as np
import pytest

from grading_lab03 import TOL, best_ks, geometric, solve_alpha, speedup
from specdecode_ref.grading import lab_fixture, points

lab = lab_fixture(__file__)


@points(2)
def test_vectorised_inputs(lab):
    """Arrays of alpha and k broadcast (shape (3, 1) x (4,) -> (3, 4)), for tokens and speedup."""
    alphas = np.array([[0.2], [0.7], [1.0]])
    ks = np.array([0, 1, 3, 8])
    e = np.asarray(lab.expected_tokens_per_step(alphas, ks))
    assert e.shape == (3, 4), f"shape {e.shape}"
    want = np.array([[geometric(a, k) for k in ks] for a in alphas[:, 0]])
    np.testing.assert_allclose(e, want, rtol=1e-12)
    s = np.asarray(lab.expected_speedup(alphas, ks, 0.1, 1.2))
    assert s.shape == (3, 4)
    np.testing.assert_allclose(s, [[speedup(a, k, 0.1, 1.2) for k in ks] for a in alphas[:, 0]], rtol=1e-12)
    cs = np.array([0.0, 0.1, 0.3])
    s2 = np.asarray(lab.expected_speedup(0.8, 4, cs))
    np.testing.assert_allclose(s2, [speedup(0.8, 4, c) for c in cs], rtol=1e-12)


@points(1)
def test_scalars_and_k_zero(lab):
    """Scalars give a number; k = 0 is plain decoding (1 token, speedup 1 / verify_cost)."""
    e = lab.expected_tokens_per_step(0.7, 0)
    assert isinstance(e, float) and e == 1.0, f"two scalars must give a float, got {type(e).__name__} {e!r}"
    s = lab.expected_speedup(0.7, 3, 0.1)
    assert isinstance(s, float), f"two scalars must give a float, got {type(s).__name__} {s!r}"
    assert abs(float(lab.expected_speedup(0.7, 0, 0.3, 1.25)) - 0.8) < TOL


@points(1)
def test_invalid_alpha(lab):
    """alpha outside [0, 1] raises ValueError."""
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError):
            lab.expected_tokens_per_step(bad, 3)


@points(1)
def test_invalid_k(lab):
    """k must be a whole number >= 0: -1, 2.5 and an array holding -2 raise ValueError."""
    for bad in (-1, 2.5, np.array([1, -2, 3])):
        with pytest.raises(ValueError):
            lab.expected_tokens_per_step(0.5, bad)


@points(2)
def test_no_warning_at_alpha_one(lab):
    """alpha = 1, alone or inside arrays, with warnings turned into errors: no warning, no NaN."""
    with warnings.catch_warnings(), np.errstate(all="warn"):  # numpy's default, whatever was set at import
        warnings.simplefilter("error")
        assert float(lab.expected_tokens_per_step(1.0, 4)) == 5.0
        e = np.asarray(lab.expected_tokens_per_step(np.array([0.5, 1.0, 1.0]), np.array([3, 3, 0])))
        np.testing.assert_allclose(e, [1.875, 4.0, 1.0], rtol=1e-12)
        s = np.asarray(lab.expected_speedup(np.array([1.0, 0.9]), np.array([2, 3]), 0.1))
        np.testing.assert_allclose(s, [speedup(1.0, 2, 0.1), speedup(0.9, 3, 0.1)], rtol=1e-12)
        assert lab.optimal_k(1.0, 0.05, k_max=8) in best_ks(1.0, 0.05, k_max=8)
        assert abs(float(lab.effective_alpha([1.0, 1.0])) - 1.0) < 1e-9
        assert abs(float(lab.alpha_from_tau(4.0, 3)) - 1.0) < 1e-9


@points(3)
def test_optimal_k_brute_force(lab):
    """optimal_k against a brute force over a grid of alpha, c and verify_cost (k_max = 32)."""
    for v in (1.0, 1.3):
        for c in (0.0, 0.01, 0.05, 0.1, 0.3, 1.0):
            for alpha in np.linspace(0.0, 1.0, 21):
                got = lab.optimal_k(float(alpha), c, v, k_max=32)
                want = best_ks(float(alpha), c, v, k_max=32)
                assert int(got) in want, f"alpha={alpha:.2f}, c={c}, verify_cost={v}: got {got}, want {sorted(want)}"


@points(1)
def test_optimal_k_ties_and_limits(lab):
    """Ties go to the smaller k; alpha = 1 with free drafts gives k_max; k_max is respected."""
    assert lab.optimal_k(0.0, 0.0) == 1  # every k gives speedup 1
    assert lab.optimal_k(0.0, 0.2) == 1
    assert lab.optimal_k(1.0, 0.0, k_max=12) == 12
    assert lab.optimal_k(0.99, 0.001, k_max=5) == 5
    assert lab.optimal_k(0.5, 0.0, k_max=1) == 1
    for bad in (0, -3):
        with pytest.raises(ValueError):
            lab.optimal_k(0.8, 0.05, k_max=bad)


# A measured cost curve T(k+1)/T(1) as a table (it jumps at k = 6, where another kernel takes over).
COSTS = [1.0 + 0.03 * k + (0.25 if k >= 6 else 0.0) for k in range(65)]


def table_curve(k):
    """verify_cost(k) read from the table: works for one whole number k, not for an array."""
    return COSTS[k]


@points(2)
def test_verify_cost_function(lab):
    """verify_cost may be a function of k: a formula, or a table that is read one k at a time."""
    curve = lambda k: 1.0 + 0.08 * k  # noqa: E731
    got = float(lab.expected_speedup(0.8, 5, 0.05, curve))
    assert abs(got - speedup(0.8, 5, 0.05, curve)) < TOL
    assert lab.optimal_k(0.85, 0.02, curve) in best_ks(0.85, 0.02, curve)
    for alpha, k in ((0.8, 5), (0.7, 6), (0.95, 9)):
        got = float(lab.expected_speedup(alpha, k, 0.05, table_curve))
        assert abs(got - speedup(alpha, k, 0.05, table_curve)) < TOL, f"alpha={alpha}, k={k}, a table cost curve"
    ks = np.array([1, 4, 6, 9])
    got = np.asarray(lab.expected_speedup(0.8, ks, 0.05, table_curve), dtype=float)
    np.testing.assert_allclose(got, [speedup(0.8, int(k), 0.05, table_curve) for k in ks], rtol=1e-12)
    for alpha in (0.7, 0.9, 0.97):
        got = lab.optimal_k(alpha, 0.02, table_curve, k_max=40)
        assert got in best_ks(alpha, 0.02, table_curve, k_max=40), f"alpha={alpha}: got {got} with a table cost curve"


@points(1)
def test_tokens_from_position_rates(lab):
    """expected_tokens_from_position_rates: 1 + a1 + a1 a2 + ...; [] gives 1; constant rates give the i.i.d. value."""
    assert abs(float(lab.expected_tokens_from_position_rates([0.9, 0.5, 0.2])) - 2.44) < TOL
    assert float(lab.expected_tokens_from_position_rates([])) == 1.0
    assert abs(float(lab.expected_tokens_from_position_rates([0.7] * 5)) - geometric(0.7, 5)) < TOL


@points(1)
def test_conditional_rates_edge_cases(lab):
    """conditional_rates: positions after a zero are 0; rises are clipped to 1."""
    np.testing.assert_allclose(np.asarray(lab.conditional_rates([0.5, 0.0, 0.0]), float), [0.5, 0.0, 0.0])
    np.testing.assert_allclose(np.asarray(lab.conditional_rates([1.0, 1.0]), float), [1.0, 1.0])
    np.testing.assert_allclose(np.asarray(lab.conditional_rates([0.4, 0.41]), float), [0.4, 1.0])


@points(1)
def test_rates_outside_zero_one_raise(lab):
    """Per-position rates outside [0, 1] are not measurements: ValueError from every function taking them."""
    for bad in ([0.5, 1.2], [-0.1, 0.0]):
        for fn in (lab.conditional_rates, lab.expected_tokens_from_position_rates, lab.effective_alpha):
            with pytest.raises(ValueError):
                fn(bad)


@points(2)
def test_alpha_from_tau_round_trip(lab):
    """alpha_from_tau inverts expected_tokens_per_step to within 1e-9, as promised; both ends exactly."""
    for k in (1, 3, 8):
        for alpha in (0.05, 0.3, 0.6, 0.9, 0.99, 0.123456789):
            got = float(lab.alpha_from_tau(geometric(alpha, k), k))
            assert abs(got - alpha) < 1e-9, f"k={k}, alpha={alpha}: got {got} (off by {abs(got - alpha):.1e})"
        assert float(lab.alpha_from_tau(1.0, k)) == 0.0 and float(lab.alpha_from_tau(k + 1.0, k)) == 1.0, \
            f"k={k}: the ends tau = 1 and tau = k + 1 must give exactly 0 and 1"


@points(1)
def test_alpha_from_tau_errors(lab):
    """alpha_from_tau raises ValueError for tau outside [1, k + 1] or k < 1."""
    for tau, k in ((0.9, 3), (4.5, 3), (1.0, 0)):
        with pytest.raises(ValueError):
            lab.alpha_from_tau(tau, k)


@points(2)
def test_effective_alpha_properties(lab):
    """effective_alpha: S_i = alpha^i gives alpha back; all-ones gives 1, all-zeros 0; bad input raises."""
    for alpha in (0.2, 0.65, 0.9):
        s = [alpha ** i for i in range(1, 6)]
        assert abs(float(lab.effective_alpha(s)) - alpha) < 1e-8
    assert abs(float(lab.effective_alpha([1.0, 1.0, 1.0])) - 1.0) < 1e-8
    assert abs(float(lab.effective_alpha([0.0, 0.0]))) < 1e-8
    for bad in ([], [0.5, 1.2]):
        with pytest.raises(ValueError):
            lab.effective_alpha(bad)


@points(2)
def test_effective_alpha_predicts_a_simulation(lab):
    """Position-dependent acceptance, simulated: effective_alpha in the i.i.d. formula reproduces
    the measured tokens per step, and conditional_rates recovers the per-position rates."""
    rng = np.random.default_rng(0)
    k, steps = 6, 200_000
    rates = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])  # conditional: later positions are harder
    accepted = np.cumprod(rng.random((steps, k)) < rates, axis=1).sum(axis=1)
    tau = 1.0 + accepted.mean()  # measured tokens per step
    survival = [(accepted >= i).mean() for i in range(1, k + 1)]  # what SpecStats reports
    a_eff = float(lab.effective_alpha(survival))
    assert abs(geometric(a_eff, k) - tau) < 1e-6
    assert abs(a_eff - solve_alpha(tau, k)) < 1e-6
    np.testing.assert_allclose(np.asarray(lab.conditional_rates(survival), float), rates, atol=0.01)
