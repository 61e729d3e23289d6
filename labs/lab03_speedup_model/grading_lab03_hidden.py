"""Lab 3 grading tests (hidden): vectorised inputs, limits, errors, optimal K by brute force,
cost curves, and alpha from measured per-position acceptance."""
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
    assert np.ndim(e) == 0 and float(e) == 1.0
    assert abs(float(lab.expected_speedup(0.7, 0, 0.3, 1.25)) - 0.8) < TOL


@points(1)
def test_invalid_alpha(lab):
    """alpha outside [0, 1] raises ValueError."""
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError):
            lab.expected_tokens_per_step(bad, 3)


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


@points(1)
def test_verify_cost_function(lab):
    """verify_cost may be a function of k (a measured cost curve)."""
    curve = lambda k: 1.0 + 0.08 * k  # noqa: E731
    got = float(lab.expected_speedup(0.8, 5, 0.05, curve))
    assert abs(got - speedup(0.8, 5, 0.05, curve)) < TOL
    want = best_ks(0.85, 0.02, curve)
    assert lab.optimal_k(0.85, 0.02, curve) in want


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


@points(2)
def test_alpha_from_tau_round_trip(lab):
    """alpha_from_tau inverts expected_tokens_per_step (to 1e-6), including both ends."""
    for k in (1, 3, 8):
        for alpha in (0.05, 0.3, 0.6, 0.9, 0.99):
            got = float(lab.alpha_from_tau(geometric(alpha, k), k))
            assert abs(got - alpha) < 1e-6, f"k={k}, alpha={alpha}: got {got}"
        assert abs(float(lab.alpha_from_tau(1.0, k))) < 1e-6
        assert abs(float(lab.alpha_from_tau(k + 1.0, k)) - 1.0) < 1e-6


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
        assert abs(float(lab.effective_alpha(s)) - alpha) < 1e-6
    assert abs(float(lab.effective_alpha([1.0, 1.0, 1.0])) - 1.0) < 1e-6
    assert abs(float(lab.effective_alpha([0.0, 0.0]))) < 1e-6
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
