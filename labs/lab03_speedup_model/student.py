"""Lab 3 — the speedup model. Fill in the seven functions below (numpy only).

One speculative step drafts k tokens and runs the target once on all of them. With i.i.d.
acceptance (every draft passes with probability alpha, independently, until the first failure)
the step emits i + 1 tokens when the first rejection is at draft position i + 1 (the accepted
drafts plus the target's own token), and k + 1 when all k pass (the bonus token):

    E[tokens per step] = 1 + alpha + alpha^2 + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)

Costs are in units of one plain decoding step T(1): one draft step costs c, the target pass
over k + 1 tokens costs verify_cost = T(k+1)/T(1) (close to 1 while decoding is memory-bound):

    speedup = E[tokens per step] / (k * c + verify_cost)

Measured acceptance is rarely i.i.d.: later draft positions are accepted less often. Engines
(vLLM, ``SpecStats.per_position_acceptance``) report S_i = accepted at position i / drafts that
reached position i in the draft — the probability that *at least i* drafts were accepted, when
every draft has k tokens. The last three functions turn such measurements into the model's
terms.
"""
from __future__ import annotations

import numpy as np


def expected_tokens_per_step(alpha, k):
    """(1 - alpha^(k+1)) / (1 - alpha), the bonus token counted; alpha = 1 gives k + 1.

    alpha in [0, 1] and k a whole number >= 0 (raise ValueError otherwise: alpha = 1.5, k = -1
    or k = 2.5). Both may be numpy arrays: broadcast them and return an array; for two scalars
    return a float. No NaN and no warning at alpha = 1, also inside an array (the grader runs
    this with warnings turned into errors).
    """
    raise NotImplementedError("expected_tokens_per_step")


def expected_speedup(alpha, k, c, verify_cost=1.0):
    """E[tokens per step] / (k * c + verify_cost), vectorised over alpha, k and c like above.

    verify_cost: a number > 0, or a function of k returning T(k+1)/T(1). A measured cost curve
    is usually a table, e.g. ``lambda k: costs[k]``, so call the function with one whole number
    k at a time, never with an array.
    """
    raise NotImplementedError("expected_speedup")


def optimal_k(alpha: float, c: float, verify_cost=1.0, k_max: int = 64) -> int:
    """The k in 1..k_max that maximises expected_speedup(alpha, k, c, verify_cost).

    Ties go to the smaller k (a shorter draft wastes less when the model is wrong). verify_cost
    as in :func:`expected_speedup`. Raise ValueError unless k_max is a whole number >= 1.
    """
    raise NotImplementedError("optimal_k")


def conditional_rates(per_position_acceptance):
    """Turn S_1..S_k (the probability that at least i drafts were accepted) into conditional
    rates a_i = P(position i accepted | positions 1..i-1 accepted) = S_i / S_(i-1), with S_0 = 1.

    Returns a numpy array of the same length. Where S_(i-1) = 0 the position is never reached:
    return 0 there. Clip the result to [0, 1] (noisy measurements can make S rise slightly).
    Raise ValueError for an S_i outside [0, 1]: that is not a measured rate.
    """
    raise NotImplementedError("conditional_rates")


def expected_tokens_from_position_rates(rates) -> float:
    """E[tokens per step] = 1 + a_1 + a_1 a_2 + ... + a_1 a_2 ... a_k for conditional rates a_i
    (a position is reached only if all earlier ones were accepted). An empty list gives 1.0.
    Raise ValueError for a rate outside [0, 1]."""
    raise NotImplementedError("expected_tokens_from_position_rates")


def alpha_from_tau(tau: float, k: int) -> float:
    """The i.i.d. alpha whose expected_tokens_per_step(alpha, k) equals tau.

    E grows with alpha from 1 (alpha = 0) to k + 1 (alpha = 1), so solve it numerically, e.g. by
    bisection, to within 1e-9. The ends are exact: tau = 1 gives 0.0 and tau = k + 1 gives 1.0
    (near alpha = 1 the closed form loses digits, so a bisection alone stops about 1e-8 short).
    Raise ValueError unless k >= 1 and 1 <= tau <= k + 1.
    """
    raise NotImplementedError("alpha_from_tau")


def effective_alpha(per_position_acceptance) -> float:
    """The *effective* alpha of measured per-position acceptance S_1..S_k (k = len, >= 1):
    the i.i.d. alpha that predicts the same expected tokens per step with the same k.

    This is the number to feed the i.i.d. speedup formula; it is neither the mean of the S_i
    nor the draft acceptance rate (accepted / drafted). Raise ValueError for an empty list or
    values outside [0, 1].
    """
    raise NotImplementedError("effective_alpha")
