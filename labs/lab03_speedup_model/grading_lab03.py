"""Lab 3 grading tests (visible): the checks the notebook walks you through."""
import numpy as np
from scipy.optimize import brentq

from specdecode_ref.grading import lab_fixture, points

lab = lab_fixture(__file__)
REFERENCE_PATTERNS = [r"specdecode_ref\.analysis\b[^\n]*|from specdecode_ref import[^\n]*\banalysis\b"]
TOL = 1e-9


def geometric(alpha, k):
    """E[tokens per step] summed term by term: 1 + alpha + ... + alpha^k."""
    return float(sum(alpha ** i for i in range(k + 1)))


def speedup(alpha, k, c, v=1.0):
    return geometric(alpha, k) / (k * c + (v(k) if callable(v) else v))


def best_ks(alpha, c, v=1.0, k_max=64, rel=1e-9):
    """Every k whose speedup is within `rel` of the best (floating-point near-ties)."""
    s = np.array([speedup(alpha, k, c, v) for k in range(1, k_max + 1)])
    return set(int(k) for k in np.flatnonzero(s >= s.max() * (1 - rel)) + 1)


def solve_alpha(tau, k):
    return brentq(lambda a: geometric(a, k) - tau, 0.0, 1.0, xtol=1e-14)


@points(2)
def test_tokens_per_step_values(lab):
    """expected_tokens_per_step: the closed form at a few points."""
    for alpha, k in [(0.5, 3), (0.8, 4), (0.0, 5), (0.3, 1), (0.95, 16)]:
        got = lab.expected_tokens_per_step(alpha, k)
        assert abs(float(got) - geometric(alpha, k)) < TOL, f"alpha={alpha}, k={k}: got {got}, want {geometric(alpha, k)}"


@points(1)
def test_alpha_one_limit(lab):
    """expected_tokens_per_step: alpha = 1 gives k + 1 (and nearby values are continuous)."""
    for k in (0, 1, 4, 10):
        got = float(lab.expected_tokens_per_step(1.0, k))
        assert got == k + 1, f"alpha=1, k={k}: got {got}, want {k + 1}"
        assert abs(float(lab.expected_tokens_per_step(1 - 1e-7, k)) - (k + 1)) < 1e-4


@points(2)
def test_speedup_values(lab):
    """expected_speedup = E[tokens per step] / (k c + verify_cost)."""
    for alpha, k, c, v in [(0.8, 4, 0.1, 1.0), (0.8, 4, 0.1, 1.2), (0.6, 2, 0.0, 1.0), (0.9, 8, 0.05, 1.5)]:
        got = float(lab.expected_speedup(alpha, k, c, v))
        assert abs(got - speedup(alpha, k, c, v)) < TOL, f"alpha={alpha}, k={k}, c={c}, verify_cost={v}: got {got}"


@points(2)
def test_optimal_k_examples(lab):
    """optimal_k maximises the speedup over k = 1..k_max."""
    for alpha, c in [(0.8, 0.05), (0.6, 0.1), (0.9, 0.02), (0.5, 0.5), (0.95, 0.01)]:
        got = lab.optimal_k(alpha, c)
        assert int(got) in best_ks(alpha, c), f"alpha={alpha}, c={c}: got {got}, want {sorted(best_ks(alpha, c))}"


@points(1)
def test_conditional_rates_example(lab):
    """conditional_rates: a_i = S_i / S_(i-1)."""
    got = np.asarray(lab.conditional_rates([0.8, 0.6, 0.3]), dtype=float)
    np.testing.assert_allclose(got, [0.8, 0.75, 0.5], atol=1e-12)


@points(2)
def test_effective_alpha_example(lab):
    """effective_alpha: the i.i.d. alpha with the same expected tokens per step."""
    s = [0.8, 0.6, 0.4]  # 1 + 0.8 + 0.6 + 0.4 = 2.8 tokens per step with k = 3
    got = float(lab.effective_alpha(s))
    assert abs(got - solve_alpha(2.8, 3)) < 1e-6, f"got {got}, want {solve_alpha(2.8, 3):.6f}"
