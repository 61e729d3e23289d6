"""Lab 3 with the reference package switched in: the same names as student.py, as thin adapters
over ``specdecode_ref.analysis``."""
from __future__ import annotations

import numpy as np

from specdecode_ref import analysis
from specdecode_ref.analysis import expected_speedup, expected_tokens_per_step, optimal_k  # noqa: F401
from specdecode_ref.analysis import expected_tokens_from_position_rates  # noqa: F401


def conditional_rates(per_position_acceptance):
    return analysis.conditional_position_rates(np.asarray(per_position_acceptance, dtype=float))


def alpha_from_tau(tau: float, k: int) -> float:
    if int(k) < 1:
        raise ValueError(f"k must be >= 1 to estimate alpha, got {k!r}")
    if tau == 1.0 or tau == k + 1.0:  # exact ends (the package's bisection stops ~1e-8 short of alpha = 1)
        return 0.0 if tau == 1.0 else 1.0
    return analysis.alpha_from_tau(tau, k)


def effective_alpha(per_position_acceptance) -> float:
    s = np.asarray(per_position_acceptance, dtype=float)
    if s.ndim != 1 or s.size == 0:
        raise ValueError("need at least one per-position acceptance rate")
    return alpha_from_tau(analysis.expected_tokens_from_survival(s), s.size)
