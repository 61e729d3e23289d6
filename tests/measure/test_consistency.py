"""measure/consistency.py: the speedup ceiling and the check that flags a contaminated baseline
(synthetic SpecStats, no model, no timing thresholds)."""
from __future__ import annotations

import pandas as pd
import pytest

from specdecode_ref.measure.consistency import check_speedups, speedup_ceiling
from specdecode_ref.metrics import SpecStats


def test_ceiling_is_tau_over_the_cheapest_step():
    assert speedup_ceiling(2.0, 3, 0.0) == pytest.approx(2.0)           # free drafts, V = 1: S <= tau
    assert speedup_ceiling(1.5, 1, 0.25) == pytest.approx(1.5 / 1.25)
    assert speedup_ceiling(1.5, 1, 0.25, v_min=0.9) > speedup_ceiling(1.5, 1, 0.25)  # V(k) < 1 raises it
    assert speedup_ceiling(1.0, 0, 0.0) == pytest.approx(1.0)           # plain decoding
    for bad in ((0.5, 1, 0.1), (1.2, -1, 0.1), (1.2, 1, -0.1)):
        with pytest.raises(ValueError):
            speedup_ceiling(*bad)
    with pytest.raises(ValueError):
        speedup_ceiling(1.2, 1, 0.1, v_min=0.0)


def _run(tokens, steps, drafted, step_s, draft_s, prefill_s=0.05):
    """A run with ``tokens`` emitted over ``steps`` steps of ``step_s`` seconds each."""
    s = SpecStats(drafted=drafted, accepted=max(tokens - steps, 0), steps=steps, emitted=tokens,
                  new_tokens=tokens + 1, draft_time_s=draft_s, prefill_time_s=prefill_s)
    s.wall_time_s = prefill_s + steps * step_s
    s.target_time_s = prefill_s + steps * step_s - draft_s
    return s


T1 = 0.04


def _table(plain_step_s):
    # tau = 48 / 36 = 1.33 with one draft per step at c = 0.25: the ceiling is 1.33 / 1.25 = 1.07.
    rows = []
    for pid, cat, plain_s in (("a-01", "qa", T1), ("b-01", "chat", plain_step_s)):
        rows.append({"category": cat, "prompt_id": pid, "method": "plain",
                     "stats": _run(48, 48, 0, plain_s, 0.0)})
        rows.append({"category": cat, "prompt_id": pid, "method": "exit",
                     "stats": _run(48, 36, 36, T1 * 1.30, 36 * 0.25 * T1)})
        rows.append({"category": cat, "prompt_id": pid, "method": "hf", "stats": None})  # no counters: skipped
    return pd.DataFrame(rows)


def test_a_fair_baseline_passes_and_a_slowed_one_is_flagged():
    checks = check_speedups(_table(plain_step_s=T1), T1)
    assert list(checks["method"]) == ["exit", "exit"] and not checks["impossible"].any()
    assert checks["ceiling"].iloc[0] == pytest.approx((48 / 36) / 1.25)
    assert checks["decode speedup"].iloc[0] < checks["ceiling"].iloc[0]

    slowed = check_speedups(_table(plain_step_s=1.6 * T1), T1)  # prompt b's plain run hit by other load
    assert list(slowed["impossible"]) == [False, True]
    assert slowed.loc[slowed["impossible"], "prompt_id"].tolist() == ["b-01"]
    # Within the margin nothing is flagged; without a margin the same row is.
    mild = _table(plain_step_s=1.2 * T1)
    assert not check_speedups(mild, T1)["impossible"].any()
    assert check_speedups(mild, T1, margin=0.0)["impossible"].any()


def test_missing_reference_is_an_error():
    df = _table(T1)
    with pytest.raises(ValueError, match="plain"):
        check_speedups(df[df["method"] != "plain"], T1)
    with pytest.raises(ValueError):
        check_speedups(df, 0.0)
