"""Bootstrap intervals of the benchmark: paired (prompt-to-prompt variation cancels), stratified
over categories, covering the truth about 95 % of the time, and refusing unpaired data."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from specdecode_ref.measure.harness import bench, intervals
from specdecode_ref.measure.harness.intervals import bootstrap_summary, contains_one


def frame(speedups: dict, per_category: int = 8, seed: int = 0, noise: float = 0.0, tokens: int = 48) -> pd.DataFrame:
    """Rows as run_benchmark writes them: plain and "fast" on every prompt; prompt lengths and
    machine speed vary from prompt to prompt (shared by both methods), the speedup per category is
    ``speedups[cat]`` times a per-prompt noise factor exp(noise * N(0, 1))."""
    rng = np.random.default_rng(seed)
    rows = []
    for cat, s in speedups.items():
        for i in range(per_category):
            pid = f"{cat}-{i}"
            base = rng.uniform(0.5, 4.0)  # seconds for plain: prompts differ a lot
            ratio = s * np.exp(noise * rng.standard_normal())
            for m, secs, emitted, steps in (("plain", base, tokens - 1, tokens - 1),
                                            ("fast", base / ratio, tokens - 1, int((tokens - 1) / 2))):
                rows.append({"category": cat, "prompt_id": pid, "method": m, "tokens": tokens, "seconds": secs,
                             "emitted": emitted, "steps": steps})
    return pd.DataFrame(rows)


def test_paired_intervals_cancel_prompt_to_prompt_variation():
    """Every prompt 1.25x faster, prompts 8x apart in length: a paired interval has no width (an
    unpaired one would be wide)."""
    out = bootstrap_summary(frame({"qa": 1.25, "code": 1.25}))
    fast = out[out.method == "fast"].set_index("category")
    assert fast.loc["qa", "speedup"] == pytest.approx(1.25)
    assert fast.loc["qa", "speedup_hi"] - fast.loc["qa", "speedup_lo"] == pytest.approx(0.0, abs=1e-12)
    assert fast.loc["overall", "tau"] == pytest.approx(47 / 23)


def test_overall_resamples_within_each_category():
    """Two categories at exactly 2.0x and 1.0x, same seconds per prompt: a stratified bootstrap keeps
    4 prompts of each in every draw, so the pooled ratio never moves; pooling the prompts would."""
    df = frame({"a": 2.0, "b": 1.0}, per_category=4)
    df.loc[df.method == "plain", "seconds"] = 1.0
    df.loc[df.method == "fast", "seconds"] = np.where(df[df.method == "fast"].category == "a", 0.5, 1.0)
    row = bootstrap_summary(df).set_index(["category", "method"]).loc[("overall", "fast")]
    assert row.speedup == pytest.approx(16 / 12)  # tokens 8*48 over (2 + 4) s against 8*48 over 8 s
    assert row.speedup_hi - row.speedup_lo == pytest.approx(0.0, abs=1e-12)


def test_intervals_cover_the_true_speedup():
    """200 simulated benchmarks of 8 prompts with a true speedup of 1.1 and 10 % noise per prompt:
    the 95 % interval contains 1.1 in at least 85 % of them (a percentile bootstrap on 8 prompts
    undercovers a little), and excludes 1 in most."""
    covered, shown = 0, 0
    for seed in range(200):
        out = bootstrap_summary(frame({"qa": 1.1}, seed=seed, noise=0.1), n_boot=400, seed=seed)
        r = out[(out.method == "fast") & (out.category == "qa")].iloc[0]
        covered += r.speedup_lo <= 1.1 <= r.speedup_hi
        shown += not contains_one(r.speedup_lo, r.speedup_hi)
    assert covered >= 170 and shown >= 100


def test_latency_percentiles_and_hf_rows():
    df = frame({"qa": 1.5})
    df.loc[df.method == "fast", ["emitted", "steps"]] = np.nan  # a Hugging Face method: no counters
    out = bootstrap_summary(df).set_index(["category", "method"])
    fast = out.loc[("qa", "fast")]
    per_token = (df[df.method == "fast"].seconds / df[df.method == "fast"].tokens * 1e3).to_numpy()
    assert fast.tpot_p50_ms == pytest.approx(np.median(per_token))
    assert fast.tpot_p99_ms == pytest.approx(np.percentile(per_token, 99))
    assert np.isnan(fast.tau) and np.isnan(fast.tau_lo)


def test_unpaired_or_referenceless_data_is_refused():
    df = frame({"qa": 1.2})
    with pytest.raises(ValueError, match="did not run on every prompt"):
        bootstrap_summary(df.drop(index=df.index[1]))
    with pytest.raises(ValueError, match="reference method 'plain' did not run"):
        bootstrap_summary(df[df.method == "fast"])


def test_the_benchmark_tables_and_heat_map_carry_the_intervals(tmp_path):
    df = frame({"qa": 1.3, "code": 1.0}, noise=0.15)
    for col, val in (("prompt_tokens", 100), ("identical", True), ("drafted", 10), ("accepted", 5)):
        df[col] = val
    df["tokens_per_s"] = df.tokens / df.seconds
    summary = bench.summarize(df)
    assert {"speedup_lo", "speedup_hi", "tau_lo", "tpot_p99_ms"} <= set(summary.columns)
    text = bench.format_tables(summary)
    assert "95% CI" in text and "ms/tok p50" in text
    fig = bench.plot_speedups(summary, path=tmp_path / "s.png")
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert any(t.startswith("≈") for t in labels) and any("–" in t for t in labels)


def test_too_few_prompts_give_no_interval():
    out = bootstrap_summary(frame({"qa": 1.2, "code": 1.1, "math": 1.3}, per_category=1, noise=0.1))
    assert out.speedup_lo.isna().all() and out.tau_hi.isna().all()
    assert out.speedup.notna().all()


def test_tpot_leaves_the_prefill_out_when_it_is_known():
    """vLLM's TPOT: (end-to-end - time to first token) / (tokens - 1). A method whose rows carry
    prefill_s is measured that way; the planted wrong definition (prefill kept) would differ."""
    df = frame({"qa": 1.5})
    df["prefill_s"] = np.where(df.method == "fast", 0.25 * df.seconds, np.nan)
    out = bootstrap_summary(df).set_index(["category", "method"])
    rows = df[df.method == "fast"]
    decode = ((rows.seconds - rows.prefill_s) / (rows.tokens - 1) * 1e3).to_numpy()
    assert out.loc[("qa", "fast")].tpot_p50_ms == pytest.approx(np.median(decode))
    assert out.loc[("qa", "fast")].tpot_p90_ms == pytest.approx(np.percentile(decode, 90))
    assert out.loc[("qa", "fast")].tpot_p50_ms != pytest.approx(np.median(rows.seconds / rows.tokens * 1e3))
    plain = df[df.method == "plain"]  # no prefill known: the old definition
    assert out.loc[("qa", "plain")].tpot_p50_ms == pytest.approx(np.median(plain.seconds / plain.tokens * 1e3))


def test_wilson_interval():
    """Known values, and a rate of 0 keeps its upper bound honest (the normal approximation gives 0 to 0)."""
    lo, hi = intervals.wilson(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)
    lo, hi = intervals.wilson(0, 20)
    assert lo == pytest.approx(0.0, abs=1e-12) and 0.1 < hi < 0.2
