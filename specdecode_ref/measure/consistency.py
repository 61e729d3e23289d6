"""Could a measured speedup have happened at all? A ceiling from τ and the measured costs.

One speculative step drafts k̄ tokens at c each (c in units of one plain step T(1)) and verifies
them in one target forward that costs V(k̄) plain steps; it emits τ tokens. Plain decoding emits
one token per T(1). So the decode-phase speedup is

    S = τ / (k̄·c + V(k̄) + overhead)  ≤  τ / (k̄·c + V_min),

where V_min is the cheapest verification on the measured cost curve: 1 on most machines, a little
below 1 where scoring a few tokens happens to be cheaper than scoring one (some CPU attention
kernels have a slow single-query path). A row above that ceiling, beyond a margin for noise, was
not measured against a fair baseline: its plain-decoding run was slowed by something else on the
machine, which inflates every method's speedup on that prompt. Such a prompt must be flagged and
left out of an average, not averaged in.

The check cannot see the opposite accident (a speculative run slowed down): that lowers a
speedup, and a low speedup is always possible.
"""
from __future__ import annotations

from ..metrics import SpecStats
from .harness.timing import decode_rate

__all__ = ["speedup_ceiling", "check_speedups", "DEFAULT_MARGIN"]

# Relative slack above the ceiling before a row counts as impossible: T(1) is measured at one
# context length while prompts differ, and a single run of a few dozen tokens is noisy by several
# per cent. A baseline slowed by a third still stands out.
DEFAULT_MARGIN = 0.2


def speedup_ceiling(tau: float, k_bar: float, c: float, v_min: float = 1.0) -> float:
    """The largest decode-phase speedup that τ allows: τ / (k̄·c + V_min).

    tau: tokens emitted per verification step (≥ 1). k_bar: drafted tokens per step (≥ 0).
    c: drafting time per drafted token in units of T(1) (≥ 0). v_min: the cheapest verification on
    the cost curve, in units of T(1) (> 0)."""
    if tau < 1 or k_bar < 0 or c < 0 or v_min <= 0:
        raise ValueError(f"need tau >= 1, k_bar >= 0, c >= 0 and v_min > 0; got tau={tau}, "
                         f"k_bar={k_bar}, c={c}, v_min={v_min}")
    return float(tau / (k_bar * c + v_min))


def check_speedups(df, t1_s: float, v_min: float = 1.0, margin: float = DEFAULT_MARGIN,
                   reference: str = "plain"):
    """Check every (prompt, method) row of a ``bench.run_benchmark`` table against its ceiling.

    t1_s: seconds of one plain target step (T(1) of the measured cost curve); v_min: the cheapest
    verification on that curve in units of T(1) (use ``min(1, min T(n) / T(1))``).

    Returns a DataFrame with one row per speculative (prompt, method): category, prompt_id,
    method, tau, k_bar, c, decode speedup over the reference on the same prompt, ceiling, and
    ``impossible`` (speedup > ceiling · (1 + margin)). A prompt with an impossible row has a
    suspect baseline for every method: leave the whole prompt out of overall figures.
    """
    import pandas as pd

    if t1_s <= 0 or margin < 0:
        raise ValueError(f"need t1_s > 0 and margin >= 0, got t1_s={t1_s}, margin={margin}")
    rows = []
    for pid, part in df.groupby("prompt_id", sort=False):
        ref = part[part["method"] == reference]
        if ref.empty:
            raise ValueError(f"prompt {pid!r} has no {reference!r} row to compare with")
        ref_stats = ref.iloc[0]["stats"]
        for _, r in part.iterrows():
            s = r["stats"]
            if r["method"] == reference or not isinstance(s, SpecStats) or s.steps == 0:
                continue
            k_bar = s.drafted / s.steps
            c = s.draft_time_s / s.drafted / t1_s if s.drafted else 0.0
            speedup = decode_rate(s) / decode_rate(ref_stats)
            ceiling = speedup_ceiling(max(s.mean_accepted_length, 1.0), k_bar, c, v_min)
            rows.append({"category": r["category"], "prompt_id": pid, "method": r["method"],
                         "tau": s.mean_accepted_length, "k_bar": k_bar, "c": c, "decode speedup": speedup,
                         "ceiling": ceiling, "impossible": bool(speedup > ceiling * (1 + margin))})
    return pd.DataFrame(rows, columns=["category", "prompt_id", "method", "tau", "k_bar", "c",
                                       "decode speedup", "ceiling", "impossible"])
