"""The speedup model: expected tokens per step, expected speedup, the best K, cost-curve fits.

Units: costs are in units of one single-token target step T(1). c is the cost of one draft step;
verify_cost is the cost of the (k+1)-token target pass, T(k+1)/T(1), which is close to 1 while
decoding is memory-bound (notebook 00 measures it). Leviathan, Kalman and Matias, "Fast Inference
from Transformers via Speculative Decoding" (arXiv 2211.17192, 2022), section 3.
"""
from __future__ import annotations

from typing import Callable, Iterator, NamedTuple, Sequence

import numpy as np

from .metrics import SpecStats


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


def as_verify_cost(verify_cost=1.0, smooth: bool = True) -> Callable[[float], float]:
    """V(k) = T(k+1)/T(1), the cost of verifying a k-token draft, as a function of k.

    verify_cost: a number (the same for every k), a function of k, or a measured cost curve (a
    ``bench.measure_cost_curve`` dict with "ns" and "times_s"; ``smooth`` first makes it
    non-decreasing with :func:`monotone_cost_curve`, so an optimiser does not chase timing
    noise). The function accepts a fractional k (a mean draft length); a whole k reaches a
    user function as an int. Every value must be > 0.
    """
    if isinstance(verify_cost, dict):  # a bench.measure_cost_curve result
        ns = sorted(int(n) for n in verify_cost["ns"])
        times = [t for _, t in sorted(zip(verify_cost["ns"], verify_cost["times_s"]))]
        if smooth:
            times = list(monotone_cost_curve(ns, times))
        verify_cost = verify_cost_from_curve(ns, times)
    if not callable(verify_cost):
        constant = float(verify_cost)
        if constant <= 0:
            raise ValueError("verify_cost must be > 0 (in units of one single-token target step)")
        return lambda k: constant
    fn = verify_cost

    def cost(k) -> float:
        v = float(fn(int(k) if float(k).is_integer() else k))
        if v <= 0:
            raise ValueError("verify_cost must be > 0 (in units of one single-token target step)")
        return v

    return cost


def _verify_costs(verify_cost, k):
    """V at every entry of ``k`` (an array of whole numbers); a constant may be an array too."""
    if callable(verify_cost) or isinstance(verify_cost, dict):
        return np.vectorize(as_verify_cost(verify_cost))(k)
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
    out = expected_tokens_per_step(alpha, kk) / (kk * np.asarray(c, dtype=float) + _verify_costs(verify_cost, kk))
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


# --------------------------------------------------------------------------------------------
# Notebooks 02 and 03: Monte Carlo, measured rates, predictions from measurements, the K rule.
# --------------------------------------------------------------------------------------------

def expected_accepted_per_step(alpha, k):
    """E[accepted drafts per step] = alpha (1 - alpha^k) / (1 - alpha) (alpha = 1 gives k).

    This is expected_tokens_per_step(alpha, k) - 1: every step also emits exactly one token
    sampled by the target (the correction after a rejection, or the bonus after k acceptances).
    """
    return expected_tokens_per_step(alpha, k) - 1.0


def _rates_for(alpha_or_rates, k: int) -> np.ndarray:
    """Per-position conditional acceptance rates for positions 1..k (a scalar is i.i.d.)."""
    r = np.asarray(alpha_or_rates, dtype=float)
    if r.ndim == 0:
        _check_alpha(r)
        return np.full(k, float(r))
    if r.ndim != 1 or r.size < k:
        raise ValueError(f"need a scalar alpha or at least k={k} per-position rates, got shape {r.shape}")
    _check_alpha(r)
    return r[:k].copy()


def simulate_tokens_per_step(alpha_or_rates, k: int, n_steps: int, rng=None,
                             count_bonus_twice: bool = False) -> np.ndarray:
    """Monte Carlo of speculative steps: the number of tokens each of ``n_steps`` steps emits.

    alpha_or_rates: a scalar alpha (i.i.d. acceptance at every draft position) or a sequence of
    conditional rates a_1, a_2, ... (a_i = P(position i accepted | positions 1..i-1 accepted)).
    One step draws the k accept/reject outcomes in order, stops at the first rejection, and
    emits the accepted drafts plus one target token (correction or bonus). With
    ``count_bonus_twice`` it credits a second target token per step: the bookkeeping of the
    popular mistake (``pitfalls.expected_tokens_bonus_counted_twice``), to compare against.
    rng: a numpy Generator or a seed (None = fresh entropy).
    """
    k = int(_check_k(k))
    if not isinstance(n_steps, (int, np.integer)) or n_steps < 1:
        raise ValueError(f"n_steps must be an int >= 1, got {n_steps!r}")
    rates = _rates_for(alpha_or_rates, k)
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    accepted = np.cumprod(rng.random((int(n_steps), k)) < rates, axis=1).sum(axis=1)
    return accepted + (2 if count_bonus_twice else 1)


def survival_from_lengths(accepted_lengths: Sequence[int], draft_lengths: Sequence[int], k_max: int | None = None):
    """Per-position counts from per-step records, in both conventions.

    Returns ``(reached, accepted, drafted)``, arrays over positions 1..k_max:
    drafted[i] = steps that drafted position i; reached[i] = steps that drafted position i and
    accepted every earlier position (so position i was actually tested); accepted[i] = steps that
    accepted position i. conditional rate = accepted / reached; vLLM's per-position rate (and
    SpecStats.per_position_acceptance) = accepted / drafted.
    """
    acc = np.asarray(accepted_lengths, dtype=int)
    dra = np.asarray(draft_lengths, dtype=int)
    if acc.shape != dra.shape or acc.ndim != 1:
        raise ValueError("accepted_lengths and draft_lengths must be 1-D and of equal length")
    if np.any(acc < 0) or np.any(acc > dra):
        raise ValueError("need 0 <= accepted <= drafted at every step")
    k_max = int(dra.max(initial=0)) if k_max is None else int(k_max)
    pos = np.arange(1, k_max + 1)[None, :]
    drafted = (dra[:, None] >= pos).sum(axis=0)
    reached = ((dra[:, None] >= pos) & (acc[:, None] >= pos - 1)).sum(axis=0)
    accepted = (acc[:, None] >= pos).sum(axis=0)
    return reached, accepted, drafted


def conditional_position_rates(per_position_acceptance: Sequence[float]) -> np.ndarray:
    """Turn vLLM-style per-position rates into conditional ones: a_i = S_i / S_(i-1), S_0 = 1.

    ``SpecStats.per_position_acceptance`` (like vLLM's metric) is S_i = accepted at position i /
    drafts that reached position i *in the draft*, i.e. P(at least i accepted): a survival
    curve, non-increasing when every draft has the same length. The i.i.d. formula and
    :func:`expected_tokens_from_position_rates` want the conditional rate a_i =
    P(i accepted | 1..i-1 accepted). Exact when all drafts have equal length; positions after a
    zero survival get rate 0.
    """
    s = np.asarray(per_position_acceptance, dtype=float)
    if np.any((s < 0) | (s > 1)):
        raise ValueError("per-position acceptance rates must lie in [0, 1]")
    prev = np.concatenate([[1.0], s[:-1]])
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(prev > 0, s / prev, 0.0)
    return np.clip(out, 0.0, 1.0)


def expected_tokens_from_survival(per_position_acceptance: Sequence[float]) -> float:
    """E[tokens per step] from vLLM-style per-position rates S_i = P(at least i accepted):
    1 + S_1 + ... + S_k (the same number as expected_tokens_from_position_rates of the
    conditional rates; feeding S_i to that function instead multiplies twice)."""
    s = np.asarray(per_position_acceptance, dtype=float)
    if np.any((s < 0) | (s > 1)):
        raise ValueError("per-position acceptance rates must lie in [0, 1]")
    return float(1.0 + s.sum())


def estimate_alpha(accepted_lengths: Sequence[int], draft_lengths: Sequence[int]) -> float:
    """Maximum-likelihood alpha under the i.i.d. model from per-step records.

    Each tested draft position is one Bernoulli(alpha) trial: a step that drafted n tokens and
    accepted m tested m + 1 positions (m successes, one failure) if m < n, else n positions (all
    successes). So alpha_hat = accepted / (accepted + number of steps with a rejection). Steps
    with an empty draft carry no information. Note that SpecStats.acceptance_rate (accepted /
    drafted, vLLM's "draft acceptance rate") is a different number: under i.i.d. acceptance it is
    E[accepted] / k, smaller than alpha.
    """
    acc = np.asarray(accepted_lengths, dtype=int)
    dra = np.asarray(draft_lengths, dtype=int)
    if acc.shape != dra.shape:
        raise ValueError("accepted_lengths and draft_lengths must have equal length")
    if np.any(acc < 0) or np.any(acc > dra):
        raise ValueError("need 0 <= accepted <= drafted at every step")
    used = dra > 0
    successes = int(acc[used].sum())
    failures = int((acc[used] < dra[used]).sum())
    if successes + failures == 0:
        raise ValueError("no drafted positions: alpha cannot be estimated")
    return successes / (successes + failures)


def _alpha_for_tokens_per_step(tokens: float, k: int) -> float:
    """The alpha at which expected_tokens_per_step(alpha, k) equals ``tokens`` (bisection: the
    closed form has no inverse, and it rises monotonically in alpha)."""
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if expected_tokens_per_step(mid, k) < tokens:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def alpha_from_tau(tau: float, k: int) -> float:
    """The i.i.d. alpha whose expected tokens per step (k drafts, bonus counted) equal tau.

    E is increasing in alpha from 1 (alpha = 0) to k + 1 (alpha = 1); solved by bisection.
    """
    k = int(_check_k(k))
    if not 1.0 <= tau <= k + 1.0:
        raise ValueError(f"tau must lie in [1, k+1] = [1, {k + 1}], got {tau!r}")
    return _alpha_for_tokens_per_step(tau, k)


def expected_speedup_from_position_rates(rates: Sequence[float], k: int, c: float,
                                         verify_cost: float | Callable[[int], float] = 1.0,
                                         c_step: float = 0.0) -> float:
    """Speedup with position-dependent acceptance: (1 + a_1 + a_1 a_2 + ...) / (c_step + k c + V(k)).

    rates: conditional rates a_1..a_k (at least k of them). c: cost per drafted token; c_step:
    fixed draft cost per step (e.g. an n-gram lookup); V(k) = verify_cost(k) = T(k+1)/T(1).
    All costs in units of one plain decoding step.
    """
    k = int(_check_k(k))
    if c < 0 or c_step < 0:
        raise ValueError("draft costs c and c_step must be >= 0")
    e = expected_tokens_from_position_rates(_rates_for(rates, k)) if k > 0 else 1.0
    return e / (c_step + k * c + as_verify_cost(verify_cost)(k))


def predicted_speedup_from_measurements(k: float, c: float, verify_cost: float | Callable = 1.0, *,
                                        tau: float | None = None, position_rates: Sequence[float] | None = None,
                                        alpha: float | None = None, c_step: float = 0.0,
                                        draft_fraction: float = 1.0) -> float:
    """Predicted speedup over plain decoding from measured quantities (all costs relative to T(1)).

    Give exactly one of
      tau: measured tokens per step (SpecStats.mean_accepted_length; already includes steps
           with empty drafts, so draft_fraction is not used with it);
      position_rates: measured *conditional* per-position rates a_1..a_k (see
           :func:`conditional_position_rates` for SpecStats' survival-style rates);
      alpha: an i.i.d. acceptance rate (e.g. :func:`estimate_alpha`).
    k: tokens drafted per drafting step (may be a mean, e.g. drafted / drafting steps).
    c: cost of one drafted token, c_step: fixed draft cost per step (an n-gram proposer costs a
    lookup per step, whatever k); verify_cost: T(k+1)/T(1), a number or a function of k.
    draft_fraction: share of steps where the proposer produced a draft; the other steps emit one
    token at cost c_step + 1 (a plain step plus the failed lookup).

    speedup = E[tokens per step] / E[cost per step]. With tau the acceptance part is measured and
    only the cost model is a prediction; with rates or alpha both are.
    """
    given = [x is not None for x in (tau, position_rates, alpha)]
    if sum(given) != 1:
        raise ValueError("give exactly one of tau, position_rates, alpha")
    if k < 0 or c < 0 or c_step < 0:
        raise ValueError("k, c and c_step must be >= 0")
    if not 0.0 <= draft_fraction <= 1.0:
        raise ValueError("draft_fraction must lie in [0, 1]")
    v = as_verify_cost(verify_cost)
    v_k, v_0 = v(k), v(0)
    if tau is not None:
        if tau < 1.0:
            raise ValueError("tau counts the target's token, so tau >= 1")
        cost = c_step + draft_fraction * (k * c + v_k) + (1.0 - draft_fraction) * v_0
        return float(tau / cost)
    kk = int(round(k))
    if position_rates is not None:
        e_draft = expected_tokens_from_position_rates(_rates_for(position_rates, kk))
    else:
        e_draft = float(expected_tokens_per_step(alpha, kk))
    e = draft_fraction * e_draft + (1.0 - draft_fraction) * 1.0
    cost = c_step + draft_fraction * (k * c + v_k) + (1.0 - draft_fraction) * v_0
    return float(e / cost)


def marginal_gain(alpha: float, k: int, c: float, verify_cost: float | Callable[[int], float] = 1.0):
    """What the (k+1)-th draft token adds: ``(extra tokens, extra cost, current speedup)``.

    Drafting one more token adds alpha^(k+1) expected tokens at cost c + V(k+1) - V(k): if one of
    the first k drafts is rejected nothing changes; if the first k pass and the (k+1)-th fails,
    its correction replaces the bonus (k+1 tokens either way); only when all k+1 pass
    (probability alpha^(k+1)) does the step emit k+2 tokens instead of k+1.
    Since (E + dE) / (C + dC) > E / C exactly when dE / dC > E / C, going from k to k+1 pays
    iff alpha^(k+1) / (c + dV) > current speedup: the marginal token must beat the average.
    """
    _check_alpha(alpha)
    k = int(_check_k(k))
    de = float(alpha) ** (k + 1)
    v = as_verify_cost(verify_cost)
    dc = c + v(k + 1) - v(k)
    s = float(expected_tokens_per_step(alpha, k)) / (k * c + v(k))
    return de, dc, s


def optimal_k_grid(alphas: Sequence[float], cs: Sequence[float],
                   verify_cost: float | Callable[[int], float] = 1.0, k_max: int = 64) -> np.ndarray:
    """optimal_k over a grid: array [len(cs), len(alphas)] (rows: c, columns: alpha), for heat maps."""
    return np.array([[optimal_k(float(a), float(c), verify_cost, k_max) for a in alphas] for c in cs])


def break_even_alpha(k: int, c: float, verify_cost: float | Callable[[int], float] = 1.0) -> float:
    """The i.i.d. acceptance alpha at which drafting k tokens per step is exactly as fast as plain
    decoding: expected_tokens_per_step(alpha, k) = k c + V(k).

    Below it speculation loses time, above it it wins. 0.0 when a step costs no more than a plain
    step (k c + V(k) <= 1: even a useless drafter breaks even); NaN when it costs more than k + 1
    plain steps (no acceptance rate can pay for it). Solved by bisection (E increases with alpha).
    """
    k = int(_check_k(k))
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k!r}")
    if c < 0:
        raise ValueError(f"c (draft cost relative to a target step) must be >= 0, got {c!r}")
    cost = k * float(c) + float(_verify_costs(verify_cost, k))
    if cost <= 1.0:
        return 0.0
    if cost > k + 1.0:
        return float("nan")
    return _alpha_for_tokens_per_step(cost, k)


def rule_of_thumb_k(alpha):
    """The popular rule of thumb k* ~ 1 / (1 - alpha): the expected tokens per step of an
    unlimited draft (E[N] for k -> infinity), used as "draft about as many tokens as you expect
    to get". It ignores the draft cost c and the verify cost V(k); compare it with
    :func:`optimal_k`, which does not (notebook 03 maps where the two agree). inf at alpha = 1.
    """
    a = _check_alpha(alpha)
    with np.errstate(divide="ignore"):
        out = np.where(a >= 1.0, np.inf, 1.0 / (1.0 - np.minimum(a, 1.0 - 1e-300)))
    return float(out) if out.ndim == 0 else out


def monotone_cost_curve(ns: Sequence[int], times: Sequence[float]) -> np.ndarray:
    """Non-decreasing least-squares fit of a measured cost curve (pool-adjacent-violators).

    Scoring more tokens in one forward never does less work, so a dip in a measured T(n) (say
    T(4) < T(3)) is timing noise; an optimiser fed the raw curve would chase it (pick k = 3
    because T(4) happened to be low). Returns fitted times in the order of sorted ``ns``.
    """
    ns = np.asarray(ns, dtype=float)
    ts = np.asarray(times, dtype=float)
    if ns.shape != ts.shape or ns.size < 1:
        raise ValueError("need equally long, non-empty ns and times")
    ts = ts[np.argsort(ns)]
    blocks = []  # [mean, weight]
    for t in ts:
        blocks.append([float(t), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2 = blocks.pop()
            m1, w1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2])
    return np.concatenate([np.full(int(w), m) for m, w in blocks])


class ChainStep(NamedTuple):
    """One replayed verification step."""

    generated: int  # new tokens committed before the step (the prefill's token included)
    drafted: int  # draft length after the budget limit (0: a plain step)
    accepted: int  # leading draft tokens equal to the continuation
    emitted: int  # tokens the step commits (accepted + one target token; accepted alone at the end)


def chain_steps(total: int, offer: Callable[[int], tuple], budget: int | None = None) -> Iterator[ChainStep]:
    """The engine's steps over a known continuation of ``total`` new tokens (the prefill's first).

    offer(generated) -> (tokens the drafter offers, how many of them lead the continuation) when
    ``generated`` tokens exist; it is called lazily, one step at a time, so a controller may move
    its k between steps. budget: the engine's max_new_tokens (default ``total``); a continuation
    shorter than the budget ended at EOS, and a draft matching through its last token ends there.
    """
    budget = total if budget is None else int(budget)
    generated = 1 if total else 0
    while generated < total:
        offered, matched = offer(generated)
        drafted = max(0, min(int(offered), budget - generated - 1))
        accepted = min(drafted, int(matched), total - generated)
        emitted = accepted if generated + accepted >= total else accepted + 1
        yield ChainStep(generated, drafted, accepted, emitted)
        generated += emitted


def replay_greedy_chain(matches: Sequence[bool], k: int) -> SpecStats:
    """Replay greedy speculative decoding of one known continuation with a chain drafter.

    With greedy verification the draft token at a position is accepted only if every earlier
    draft of the step was, i.e. only when the drafter saw the *true* prefix; so acceptance is fixed
    by one bit per position: ``matches[j]`` = "the drafter's greedy token after the prompt and the
    first j new tokens equals new token j", for j = 0 .. N-1 (``matches[0]`` is never used: the
    prefill emits token 0). Each step drafts min(k, tokens left - 1). Returns a ``SpecStats`` with
    the counters (tau, per-position rates, accepted/draft lengths) the engine would report; no
    timings. One pass of the drafter over prompt + continuation (``bench.draft_greedy_matches``)
    thus gives tau for every k at once.
    """
    if int(k) != k or k < 1:
        raise ValueError(f"k must be a whole number >= 1, got {k!r}")
    k = int(k)
    m = [bool(x) for x in matches]

    def offer(generated: int):
        run = 0
        while run < k and generated + run < len(m) and m[generated + run]:
            run += 1
        return k, run

    stats = SpecStats()
    for s in chain_steps(len(m), offer):
        stats.record_step(s.drafted, s.accepted, s.emitted)
    stats.new_tokens = len(m)
    stats.target_forwards = stats.steps + (1 if m else 0)
    return stats


# ---- per-token acceptance: drafting from q versus drafting the argmax -------------------------

def _as_probs(x, name: str):
    import torch

    t = torch.as_tensor(x).detach().float()
    if t.dim() < 1 or t.shape[-1] < 1:
        raise ValueError(f"{name} must be distributions over the vocabulary, shape [..., V]; got {tuple(t.shape)}")
    if (t < 0).any() or not torch.isfinite(t).all():
        raise ValueError(f"{name} must be finite and non-negative")
    mass = t.sum(-1)
    if (mass - 1).abs().max() > 1e-3:
        raise ValueError(f"each row of {name} must sum to 1 (got sums between {float(mass.min()):.4f} and "
                         f"{float(mass.max()):.4f}); process logits with sampling.logits_to_probs")
    return t


def acceptance_with_q(p, q):
    """Per-token acceptance when the draft token is drawn from q and q is reported:
    sum_x min(p(x), q(x)) = 1 - TV(p, q).

    p, q: [..., V] distributions (the target's and the drafter's, both processed with the same
    SamplingParams). Returns a FloatTensor [...]. Rejection sampling accepts x ~ q with probability
    min(1, p(x)/q(x)); averaged over x that is sum_x q(x) min(1, p(x)/q(x)) = sum_x min(p, q).
    """
    p, q = _as_probs(p, "p"), _as_probs(q, "q")
    if p.shape != q.shape:
        raise ValueError(f"p {tuple(p.shape)} and q {tuple(q.shape)} must have the same shape")
    import torch

    return torch.minimum(p, q).sum(-1)


def acceptance_one_hot(p, tokens):
    """Per-token acceptance when the drafter proposes ``tokens`` and reports no q (one-hot): p(a).

    With a = the drafter's argmax a* this is the "greedy drafting" regime (vLLM's). p: [..., V];
    tokens: LongTensor [...] (an int for a single distribution). Returns a FloatTensor [...].
    """
    import torch

    p = _as_probs(p, "p")
    a = torch.as_tensor(tokens, dtype=torch.long, device=p.device)
    if a.shape != p.shape[:-1]:
        raise ValueError(f"tokens {tuple(a.shape)} must have p's leading shape {tuple(p.shape[:-1])}")
    if a.numel() and (int(a.min()) < 0 or int(a.max()) >= p.shape[-1]):
        raise ValueError(f"token ids must lie in [0, {p.shape[-1]})")
    return p.gather(-1, a[..., None]).squeeze(-1)
