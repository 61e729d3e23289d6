"""Statistics for checking samplers: a chi-square goodness-of-fit test and a batched sampler probe.

"Lossless" is a statement about distributions, so it is checked statistically: draw the first
emitted token many times and ask whether the counts are compatible with the target distribution p.

* :func:`chi_square_test` compares observed counts with probabilities. The chi-square
  approximation needs every bin's expected count to be large enough (5 by convention), so bins
  below ``min_expected`` are pooled into one "rest" bin. A count in a bin of probability exactly 0
  is impossible under p and gives p-value 0.
* :func:`randomized_pit` and :func:`uniformity_test` check a whole generated sequence at once:
  if every token was drawn from the target's conditional distribution given the tokens before it,
  its randomized probability integral transform is an independent Uniform(0, 1) draw.
* :func:`first_token_counts` draws one draft token per row (from q, or a fixed deterministic draft),
  calls a verifier with the signature of :func:`specdecode_ref.verify.rejection_sample` once on the
  whole batch, and counts the first emitted token. Tokens with p = q = 0 can never be drafted nor
  emitted, so the call runs on the union of the supports only (a real vocabulary of 49,152 tokens
  times tens of thousands of rows would not fit in memory); the counts come back over the full
  vocabulary.

Used by notebook 01 and tests/test_stats.py, tests/test_pitfalls.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from scipy import stats as _scipy_stats

from ...verify import rejection_sample


@dataclass(frozen=True)
class ChiSquareResult:
    statistic: float  # Pearson's X^2 over the bins that were kept
    pvalue: float  # P(X^2 >= statistic) under the null hypothesis "the counts follow probs"
    dof: int  # bins - 1
    bins: int  # bins after pooling
    pooled: int  # how many original bins went into the pooled "rest" bin
    impossible: int  # draws that landed on a zero-probability bin (each alone rejects the null)
    n: int  # total number of draws

    def __str__(self) -> str:
        if self.impossible:
            return (f"p-value = 0: {self.impossible} of {self.n} draws landed on tokens of probability 0, "
                    "impossible under the null")
        return (f"chi2 = {self.statistic:.1f}, dof = {self.dof}, p-value = {self.pvalue:.3g} "
                f"(n = {self.n}, {self.bins} bins, {self.pooled} small bins pooled)")


def _as_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=float).ravel()


def chi_square_test(counts, probs, min_expected: float = 5.0) -> ChiSquareResult:
    """Pearson chi-square goodness of fit of ``counts`` (one per category) to ``probs``.

    probs is renormalised to sum to 1. Categories whose expected count ``n * probs`` is below
    ``min_expected`` are pooled into one bin; if that pooled bin is itself still too small it is
    merged into the smallest remaining bin. Draws on categories with probability exactly 0 make the
    p-value 0 (statistic infinite): under p they cannot happen at all.
    """
    counts = _as_numpy(counts)
    probs = _as_numpy(probs)
    if counts.shape != probs.shape:
        raise ValueError(f"counts and probs must have the same length, got {counts.size} and {probs.size}")
    if np.any(counts < 0) or np.any(probs < 0):
        raise ValueError("counts and probabilities must be >= 0")
    if probs.sum() <= 0:
        raise ValueError("probs must have positive mass")
    if min_expected <= 0:
        raise ValueError("min_expected must be > 0")
    probs = probs / probs.sum()
    n = int(round(counts.sum()))
    if n == 0:
        raise ValueError("no draws: counts sum to 0")
    zero = probs == 0
    impossible = int(counts[zero].sum())
    if impossible:
        return ChiSquareResult(float("inf"), 0.0, 0, 0, 0, impossible, n)
    counts, probs = counts[~zero], probs[~zero]
    expected = probs * n
    small = expected < min_expected
    obs = list(counts[~small])
    exp = list(expected[~small])
    pooled = int(small.sum())
    if pooled:
        rest_obs, rest_exp = counts[small].sum(), expected[small].sum()
        if rest_exp >= min_expected or not exp:
            obs.append(rest_obs)
            exp.append(rest_exp)
        else:  # still too small on its own: merge it into the smallest kept bin
            j = int(np.argmin(exp))
            obs[j] += rest_obs
            exp[j] += rest_exp
    obs, exp = np.asarray(obs), np.asarray(exp)
    if obs.size < 2:  # one bin: nothing to test
        return ChiSquareResult(0.0, 1.0, 0, int(obs.size), pooled, 0, n)
    statistic = float(((obs - exp) ** 2 / exp).sum())
    dof = int(obs.size - 1)
    pvalue = float(_scipy_stats.chi2.sf(statistic, dof))
    return ChiSquareResult(statistic, pvalue, dof, int(obs.size), pooled, 0, n)


def chi_square_pvalue(counts, probs, min_expected: float = 5.0) -> float:
    """Just the p-value of :func:`chi_square_test`."""
    return chi_square_test(counts, probs, min_expected).pvalue


@dataclass
class FirstTokenSample:
    counts: np.ndarray  # [V] int64: how often each token was the first emitted token
    accepted: int  # rows whose draft was accepted
    n: int  # rows drawn

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.n

    @property
    def frequencies(self) -> np.ndarray:
        return self.counts / self.n


def _check_dist(x, name: str) -> torch.Tensor:
    x = torch.as_tensor(x).detach().cpu().float().reshape(-1)
    if (x < 0).any() or not torch.isfinite(x).all() or float(x.sum()) <= 0:
        raise ValueError(f"{name} must be a finite non-negative vector with positive mass")
    return x / x.sum()


def first_token_counts(p, q=None, n: int = 20000, sampler: Callable = rejection_sample, seed: int = 0,
                       deterministic_token: int | None = None, return_details: bool = False):
    """Draw the first emitted token ``n`` times through ``sampler`` in one batched call.

    p: target distribution [V]. q: draft distribution [V]; each row's draft token is drawn from it
    and q is passed as ``draft_probs``. Alternatively ``deterministic_token`` drafts that token in
    every row with ``draft_probs=None`` (an n-gram style proposer, q one-hot). ``sampler`` has the
    signature of :func:`~specdecode_ref.verify.rejection_sample`; it gets ``[n, 2, V']`` target
    probabilities (K = 1 draft, plus the bonus position, both equal to p) restricted to the union of
    the supports of p and q, and one ``torch.Generator`` seeded with ``seed`` that also drew the drafts.

    Returns the counts over the full vocabulary as a numpy array, or a :class:`FirstTokenSample`
    (counts, accepted rows, n) with ``return_details=True``.
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    p = _check_dist(p, "p")
    v = p.numel()
    if (q is None) == (deterministic_token is None):
        raise ValueError("give exactly one of q (a draft distribution) or deterministic_token")
    if q is not None:
        q = _check_dist(q, "q")
        if q.numel() != v:
            raise ValueError(f"p and q must have the same length, got {v} and {q.numel()}")
        support = torch.nonzero((p > 0) | (q > 0)).squeeze(1)
    else:
        if not 0 <= int(deterministic_token) < v:
            raise ValueError(f"deterministic_token must lie in [0, {v}), got {deterministic_token}")
        one_hot = torch.zeros(v, dtype=torch.bool)
        one_hot[int(deterministic_token)] = True
        support = torch.nonzero((p > 0) | one_hot).squeeze(1)
    local = {int(t): i for i, t in enumerate(support.tolist())}
    p_s = p[support]
    vs = support.numel()
    gen = torch.Generator().manual_seed(int(seed))
    target = p_s.expand(n, 2, vs)
    if q is not None:
        q_s = q[support]
        drafts = torch.multinomial(q_s.expand(n, vs), 1, replacement=True, generator=gen)
        draft_probs = q_s.expand(n, 1, vs)
    else:
        drafts = torch.full((n, 1), local[int(deterministic_token)], dtype=torch.long)
        draft_probs = None
    tokens, num_accepted = sampler(target, drafts, draft_probs, generator=gen)
    first = tokens[:, 0]
    if (first < 0).any() or (first >= vs).any():
        raise RuntimeError("the sampler emitted no valid first token in some rows")
    counts = np.zeros(v, dtype=np.int64)
    counts[support.numpy()] = np.bincount(first.numpy(), minlength=vs)
    if not return_details:
        return counts
    return FirstTokenSample(counts, int((num_accepted >= 1).sum()), n)


def acceptance_probability(p, q) -> float:
    """P(accept) = sum_x min(p(x), q(x)) = 1 - total variation distance(p, q) (for any non-negative
    vectors, normalised here; ``analysis.acceptance_with_q`` is the same for rows of distributions)."""
    from ...analysis import acceptance_with_q

    return float(acceptance_with_q(_check_dist(p, "p"), _check_dist(q, "q")))


def randomized_pit(probs, tokens, generator: torch.Generator | None = None) -> np.ndarray:
    """Randomized probability integral transform of each token under its own distribution.

    probs: [N, V] the distribution each token was supposedly drawn from (e.g. the target's p at
    every generated position, from one teacher-forced forward). tokens: [N]. Returns
    u_i = F_i(t_i - 1) + V_i * p_i(t_i) with F_i the cumulative distribution over token ids and V_i
    uniform. If t_i ~ p_i given everything before it, the u_i are i.i.d. Uniform(0, 1) - also along
    one autoregressive sequence, where each p_i depends on the earlier tokens.
    """
    probs = torch.as_tensor(probs).detach().cpu().double()
    tokens = torch.as_tensor(tokens).detach().cpu().long().reshape(-1)
    if probs.dim() != 2 or probs.shape[0] != tokens.numel():
        raise ValueError(f"probs must be [N, V] with N = len(tokens) = {tokens.numel()}, got {tuple(probs.shape)}")
    probs = probs / probs.sum(-1, keepdim=True)
    below = torch.cumsum(probs, -1).gather(1, tokens[:, None]).squeeze(1)
    p_tok = probs.gather(1, tokens[:, None]).squeeze(1)
    if (p_tok <= 0).any():
        raise ValueError(f"{int((p_tok <= 0).sum())} token(s) have probability 0 under their own distribution")
    v = torch.rand(tokens.numel(), generator=generator, dtype=torch.float64)
    return (below - p_tok + v * p_tok).clamp(0.0, 1.0).numpy()


def uniformity_test(u) -> float:
    """Kolmogorov-Smirnov p-value of the hypothesis "u are i.i.d. Uniform(0, 1)"."""
    u = np.asarray(u, dtype=float).ravel()
    if u.size == 0:
        raise ValueError("no values to test")
    return float(_scipy_stats.kstest(u, "uniform").pvalue)
