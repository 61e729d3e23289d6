"""Lab 3 — a worked solution, written the way a student would (for instructors)."""
from __future__ import annotations

import numpy as np


def expected_tokens_per_step(alpha, k):
    a = np.asarray(alpha, dtype=float)
    kk = np.asarray(k, dtype=float)
    if np.any((a < 0) | (a > 1)):
        raise ValueError(f"alpha must lie in [0, 1], got {alpha!r}")
    if np.any(kk < 0) or np.any(kk != np.round(kk)):
        raise ValueError(f"k must be a whole number >= 0, got {k!r}")
    a, kk = np.broadcast_arrays(a, kk)
    safe = np.where(a < 1, a, 0.0)  # keep the division away from alpha = 1
    out = np.where(a < 1, (1 - safe ** (kk + 1)) / (1 - safe), kk + 1)
    return float(out) if out.ndim == 0 else out


def _verify(verify_cost, k):
    if callable(verify_cost):
        return np.vectorize(lambda x: float(verify_cost(int(x))))(k)
    return np.asarray(verify_cost, dtype=float)


def expected_speedup(alpha, k, c, verify_cost=1.0):
    kk = np.asarray(k, dtype=float)
    out = expected_tokens_per_step(alpha, k) / (kk * np.asarray(c, dtype=float) + _verify(verify_cost, kk))
    return float(out) if np.ndim(out) == 0 else out


def optimal_k(alpha, c, verify_cost=1.0, k_max=64):
    if isinstance(k_max, bool) or int(k_max) != k_max or k_max < 1:
        raise ValueError(f"k_max must be a whole number >= 1, got {k_max!r}")
    best_k, best = 1, -1.0
    for k in range(1, int(k_max) + 1):
        s = expected_speedup(alpha, k, c, verify_cost)
        if s > best:  # strictly better: ties keep the smaller k
            best_k, best = k, s
    return best_k


def _check_rates(r):
    r = np.asarray(r, dtype=float)
    if np.any((r < 0) | (r > 1)) or np.any(np.isnan(r)):
        raise ValueError(f"rates must lie in [0, 1], got {r.tolist()}")
    return r


def conditional_rates(per_position_acceptance):
    s = _check_rates(per_position_acceptance)
    prev = np.concatenate([[1.0], s[:-1]])
    out = np.zeros_like(s)
    reached = prev > 0
    out[reached] = s[reached] / prev[reached]
    return np.clip(out, 0.0, 1.0)


def expected_tokens_from_position_rates(rates):
    return float(1.0 + np.cumprod(_check_rates(rates)).sum())


def alpha_from_tau(tau, k):
    if k < 1 or not 1.0 <= tau <= k + 1.0:
        raise ValueError(f"need k >= 1 and 1 <= tau <= k + 1, got tau={tau!r}, k={k!r}")
    if tau == 1.0 or tau == k + 1.0:
        return 0.0 if tau == 1.0 else 1.0  # exact ends
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-12:
        mid = (lo + hi) / 2
        if expected_tokens_per_step(mid, k) < tau:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def effective_alpha(per_position_acceptance):
    s = np.asarray(per_position_acceptance, dtype=float)
    if s.size == 0 or np.any((s < 0) | (s > 1)):
        raise ValueError("need one or more per-position rates in [0, 1]")
    # 1 + S_1 + ... + S_k is already E[tokens per step]: S_i = a_1 ... a_i.
    return alpha_from_tau(1.0 + s.sum(), len(s))
