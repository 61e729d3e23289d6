"""The speedup model: expected tokens per step, expected speedup, the best K, cost-curve fits.

Units: costs are in units of one single-token target step T(1). c is the cost of one draft step;
verify_cost is the cost of the (k+1)-token target pass, T(k+1)/T(1), which is close to 1 while
decoding is memory-bound (notebook 00 measures it). Leviathan et al. 2023, section 3.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np


def _check_alpha(alpha):
    a = np.asarray(alpha, dtype=float)
    if np.any((a < 0) | (a > 1)):
        raise ValueError(f"alpha (per-token acceptance probability) must lie in [0, 1], got {alpha!r}")
    return a


def _check_k(k):
    kk = np.asarray(k)
    if np.any(kk < 0) or not np.all(np.equal(np.mod(kk, 1), 0)):
        raise ValueError(f"k must be a whole number >= 0, got {k!r}")
    return kk.astype(float)


def expected_tokens_per_step(alpha, k):
    """E[tokens per step] = (1 - alpha^(k+1)) / (1 - alpha), counting the bonus token.

    With i.i.d. acceptance alpha the step emits i+1 tokens when the first rejection is at draft
    position i (probability alpha^i (1 - alpha)), and k+1 when all k pass; the sum telescopes to
    1 + alpha + ... + alpha^k. alpha = 1 gives k + 1. Works elementwise on arrays.
    """
    a = _check_alpha(alpha)
    kk = _check_k(k)
    a_b, k_b = np.broadcast_arrays(a, kk)
    with np.errstate(divide="ignore", invalid="ignore"):
        geo = (1.0 - a_b ** (k_b + 1.0)) / (1.0 - a_b)
    out = np.where(a_b >= 1.0, k_b + 1.0, geo)
    return float(out) if out.ndim == 0 else out


def expected_tokens_from_position_rates(rates: Sequence[float]) -> float:
    """E[tokens per step] when draft position i is accepted with its own rate a_i (given reached):
    1 + a_1 + a_1 a_2 + ... — the formula without the i.i.d. assumption."""
    r = np.asarray(rates, dtype=float)
    if np.any((r < 0) | (r > 1)):
        raise ValueError("per-position acceptance rates must lie in [0, 1]")
    return float(1.0 + np.cumprod(r).sum())


def _verify_cost(verify_cost, k):
    if callable(verify_cost):
        return np.vectorize(lambda kk: float(verify_cost(int(kk))))(k)
    if np.any(np.asarray(verify_cost) <= 0):
        raise ValueError("verify_cost must be > 0 (in units of one single-token target step)")
    return verify_cost


def expected_speedup(alpha, k, c, verify_cost: float | Callable[[int], float] = 1.0):
    """Expected speedup over plain decoding = E[tokens per step] / (k*c + verify_cost).

    c: cost of one draft step / T(1). verify_cost: T(k+1)/T(1), a number or a function of k
    (e.g. from :func:`fit_cost_curve`).
    """
    if np.any(np.asarray(c) < 0):
        raise ValueError(f"c (draft cost relative to a target step) must be >= 0, got {c!r}")
    kk = _check_k(k)
    out = expected_tokens_per_step(alpha, kk) / (kk * np.asarray(c, dtype=float) + _verify_cost(verify_cost, kk))
    return float(out) if np.ndim(out) == 0 else out


def optimal_k(alpha: float, c: float, verify_cost: float | Callable[[int], float] = 1.0, k_max: int = 64) -> int:
    """The K in 1..k_max that maximises :func:`expected_speedup` (ties go to the smaller K)."""
    if not isinstance(k_max, int) or k_max < 1:
        raise ValueError("k_max must be an int >= 1")
    ks = np.arange(1, k_max + 1)
    s = expected_speedup(alpha, ks, c, verify_cost)
    return int(ks[int(np.argmax(s))])


def fit_cost_curve(ns: Sequence[int], times: Sequence[float]):
    """Least-squares line T(n) = a + b*n through measured forward times; returns (a, b, T)
    where T(n) is a callable. T(k+1)/T(1) is then the verify cost of a k-token draft."""
    ns = np.asarray(ns, dtype=float)
    ts = np.asarray(times, dtype=float)
    if ns.shape != ts.shape or ns.size < 2:
        raise ValueError("need at least two (n, time) points of equal length")
    b, a = np.polyfit(ns, ts, 1)
    return float(a), float(b), (lambda n: a + b * np.asarray(n, dtype=float))


def verify_cost_from_curve(ns: Sequence[int], times: Sequence[float]) -> Callable[[int], float]:
    """verify_cost(k) = T(k+1)/T(1) interpolated from a measured cost curve (linear beyond it)."""
    ns = np.asarray(ns, dtype=float)
    ts = np.asarray(times, dtype=float)
    a, b, _ = fit_cost_curve(ns, ts)
    t1 = float(np.interp(1.0, ns, ts))

    def cost(k: int) -> float:
        n = k + 1.0
        t = np.interp(n, ns, ts) if n <= ns.max() else a + b * n
        return float(t / t1)

    return cost
