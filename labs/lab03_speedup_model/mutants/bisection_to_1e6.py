"""Mutant: the bisection stops when the bracket is 1e-6 wide: alpha is off by up to 5e-7, not
within the promised 1e-9.

caught by: test_alpha_from_tau_round_trip
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def alpha_from_tau(tau, k):
    if k < 1 or not 1.0 <= tau <= k + 1.0:
        raise ValueError(f"need k >= 1 and 1 <= tau <= k + 1, got tau={tau!r}, k={k!r}")
    if tau == 1.0 or tau == k + 1.0:
        return 0.0 if tau == 1.0 else 1.0
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-6:  # BUG: "close enough" is not 1e-9
        mid = (lo + hi) / 2
        if expected_tokens_per_step(mid, k) < tau:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
