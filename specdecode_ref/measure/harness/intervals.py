"""How sure a benchmark is: paired bootstrap intervals on speedup and tau, and latency percentiles.

A speedup measured on eight prompts is one draw: other prompts of the same kind, or the same
prompts on a quieter minute, give another. The benchmark's speedup is a ratio of pooled rates
(total tokens over total seconds, the method's against plain decoding's on the *same* prompts), so
its interval comes from resampling prompts with replacement and recomputing that ratio, every
method on the same resampled prompts (paired: a prompt that is long or slow for everyone moves
every method alike and cancels in the ratio). Over all categories the resampling is stratified,
each category keeping its number of prompts, because the categories are a fixed design, not a
random draw. tau is pooled the same way (emitted tokens over verification steps).

The percentile bootstrap is what a reviewer expects and is honest at this size only if read as
what it is: with 8 prompts per category the interval covers prompt-to-prompt variation of this
machine's run, not a different machine. A cell whose interval contains 1.0 has not shown a
difference.

    from specdecode_ref.measure.harness import bench, intervals
    df = bench.run_benchmark(model, tok, ["plain", "ngram"], workloads)
    table = intervals.bootstrap_summary(df)   # one row per (category, method), with lo / hi
"""
from __future__ import annotations

import math

import numpy as np

OVERALL = "overall"
REFERENCE = "plain"
MIN_PROMPTS = 3  # fewer prompts in a category give no interval (see claims.compare_paired)


def _matrix(df, methods, column) -> np.ndarray:
    """[methods, prompts] of ``column``, prompts in one order for every method (paired)."""
    wide = df.pivot_table(index="prompt_id", columns="method", values=column, aggfunc="first", sort=False)
    return wide.reindex(columns=methods).to_numpy(dtype=float).T


def stratified_indices(groups: list, n_boot: int, rng) -> np.ndarray:
    """[n_boot, total] row indices: each bootstrap draw resamples with replacement within every
    group (an array of row indices), keeping each group's size (a stratified bootstrap)."""
    parts = [g[rng.integers(0, len(g), size=(n_boot, len(g)))] for g in groups]
    return np.concatenate(parts, axis=1)


def _interval(boots: np.ndarray, confidence: float) -> tuple:
    boots = boots[np.isfinite(boots)]
    if boots.size == 0:
        return float("nan"), float("nan")
    tail = (1 - confidence) / 2
    lo, hi = np.quantile(boots, [tail, 1 - tail])
    return float(lo), float(hi)


def bootstrap_summary(df, reference: str = REFERENCE, n_boot: int = 2000, confidence: float = 0.95,
                      seed: int = 0):
    """Per (category, method) and over all prompts: speedup over ``reference`` and tau, each with a
    paired percentile-bootstrap interval, and the time per output token at the median, 90th and
    99th percentile over prompts. TPOT is vLLM's: the time after the first token over the tokens
    after it, (seconds - prefill_s) / (tokens - 1), so a long prompt's prefill (its time to first
    token) does not count; rows without a ``prefill_s`` (Hugging Face's generate) fall back to
    seconds / tokens. With a few dozen prompts the 99th percentile is in effect the slowest prompt.

    df: ``bench.run_benchmark``'s rows (category, prompt_id, method, tokens, seconds, emitted, steps).
    Returns a DataFrame: category, method, prompts, speedup, speedup_lo, speedup_hi, tau, tau_lo,
    tau_hi, tpot_p50_ms, tpot_p90_ms, tpot_p99_ms. Speedup and tau are pooled ratios, as in ``bench.summarize``.
    A category with fewer than ``MIN_PROMPTS`` prompts gets no interval (NaN), and so does the
    overall row when no category has two.
    """
    import pandas as pd

    if df.empty:
        raise ValueError("no benchmark rows to summarize")
    if reference not in set(df["method"]):
        raise ValueError(f"the reference method {reference!r} did not run; methods: {sorted(set(df['method']))}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    if not isinstance(n_boot, int) or n_boot < 100:
        raise ValueError(f"n_boot must be an int >= 100, got {n_boot!r}")
    methods = list(dict.fromkeys(df["method"]))
    cats = list(dict.fromkeys(df["category"]))
    rng = np.random.default_rng(seed)
    rows = []
    for cat in cats + [OVERALL]:
        part = df if cat == OVERALL else df[df["category"] == cat]
        order = list(dict.fromkeys(part["prompt_id"]))
        part = part.set_index("prompt_id").loc[order].reset_index()
        counts = part.groupby("method")["prompt_id"].nunique()
        missing = [m for m in methods if counts.get(m, 0) != len(order)]
        if missing:
            raise ValueError(f"{cat}: methods {missing} did not run on every prompt; a paired interval needs all")
        tokens, seconds = _matrix(part, methods, "tokens"), _matrix(part, methods, "seconds")
        emitted = _matrix(part, methods, "emitted") if "emitted" in part else np.full_like(tokens, np.nan)
        steps = _matrix(part, methods, "steps") if "steps" in part else np.full_like(tokens, np.nan)
        strata = [np.arange(len(order))] if cat != OVERALL else [
            np.flatnonzero(np.isin(order, list(dict.fromkeys(df[df.category == c].prompt_id)))) for c in cats]
        idx = stratified_indices(strata, n_boot, rng)  # [n_boot, prompts], shared by every method
        ref = methods.index(reference)
        rate = tokens.sum(1) / seconds.sum(1)
        rate_b = tokens[:, idx].sum(2) / seconds[:, idx].sum(2)  # [methods, n_boot]
        with np.errstate(invalid="ignore", divide="ignore"):
            tau = emitted.sum(1) / steps.sum(1)
            tau_b = emitted[:, idx].sum(2) / steps[:, idx].sum(2)
        prefill = _matrix(part, methods, "prefill_s") if "prefill_s" in part else np.full_like(tokens, np.nan)
        known = np.isfinite(prefill) & (tokens > 1)
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(known, (seconds - np.nan_to_num(prefill)) / (tokens - 1), seconds / tokens) * 1e3
        # Too few prompts to resample: a bootstrap over one or two prompts per category only spans
        # their own values, which says nothing about the next prompt. No interval then.
        resamplable = len(order) >= MIN_PROMPTS if cat != OVERALL else any(len(g) >= 2 for g in strata) \
            and len(order) >= MIN_PROMPTS
        for i, m in enumerate(methods):
            s_lo, s_hi = _interval(rate_b[i] / rate_b[ref], confidence) if resamplable else (float("nan"),) * 2
            t_lo, t_hi = _interval(tau_b[i], confidence) if np.isfinite(tau[i]) and resamplable else (float("nan"),) * 2
            rows.append({"category": cat, "method": m, "prompts": len(order),
                         "speedup": float(rate[i] / rate[ref]), "speedup_lo": s_lo, "speedup_hi": s_hi,
                         "tau": float(tau[i]), "tau_lo": t_lo, "tau_hi": t_hi,
                         "tpot_p50_ms": float(np.percentile(tpot[i], 50)),
                         "tpot_p90_ms": float(np.percentile(tpot[i], 90)),
                         "tpot_p99_ms": float(np.percentile(tpot[i], 99))})
    return pd.DataFrame(rows)


def wilson(successes: int, n: int, z: float = 1.96) -> tuple:
    """Wilson score interval of a binomial rate, e.g. an acceptance rate at one draft position (kept
    drafts over drafts that reached it). Honest at small n and at rates near 0 or 1, where the
    normal approximation gives bounds outside [0, 1]; (nan, nan) when nothing was tested."""
    if n <= 0:
        return float("nan"), float("nan")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def contains_one(lo: float, hi: float) -> bool:
    """True when an interval on a ratio does not exclude 1 (no difference shown)."""
    return bool(np.isfinite(lo) and np.isfinite(hi) and lo <= 1.0 <= hi)


def per_position_acceptance(df, method: str, category: str | None = None) -> list:
    """vLLM's per-position acceptance for one method, pooled over prompts (of one category): drafts
    whose first i+1 tokens were kept / drafts that reached position i."""
    from functools import reduce

    from ...metrics import SpecStats

    part = df[(df.method == method) & ((df.category == category) if category is not None else True)]
    stats = [s for s in part["stats"] if isinstance(s, SpecStats)] if "stats" in part else []
    if not stats:
        raise ValueError(f"no SpecStats for method {method!r} (a Hugging Face method, or rows read back from a file)")
    return reduce(SpecStats.merge, stats).per_position_acceptance
