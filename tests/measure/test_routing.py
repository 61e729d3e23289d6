"""Scoring choosers on a timing table: pooled speedups, the oracle, regret and its interval, the
best single method, fitting and choosing; on a synthetic table where the answers are known."""
from __future__ import annotations

import numpy as np
import pytest

from specdecode_ref.measure import routing

METHODS = ["plain", "ngram", "draft"]


def table(n_per_cat=6, seed=0):
    """Copying prompts (self_copy_rate high): n-gram takes 0.7 of plain's seconds, the draft model
    0.8; the other prompts: n-gram 1.1, draft 0.8. Every method emits 40 tokens."""
    rng = np.random.default_rng(seed)
    prompts = []
    for cat, copying in (("summarization", True), ("qa", False)):
        for i in range(n_per_cat):
            base = rng.uniform(1, 3)
            sec = {"plain": base, "ngram": base * (0.7 if copying else 1.1), "draft": base * 0.8}
            prompts.append({"id": f"{cat}-{i}", "category": cat, "prompt_tokens": 100,
                            "features": {"log_prompt_tokens": 4.6, "self_copy_rate": (0.6 if copying else 0.05)
                                         + rng.uniform(0, 0.05), "repeated_trigrams": 0.3 if copying else 0.01,
                                         "distinct_tokens": 0.5, "hidden": rng.standard_normal(6).tolist()},
                            "seconds": sec, "tokens": {m: 40 for m in METHODS}, "tau": {m: 1.0 for m in METHODS}})
    return {"meta": {"split": "benchmark", "methods": METHODS, "machine": "test", "max_new_tokens": 40,
                     "date": "2026-01-01"}, "prompts": prompts}


def test_oracle_best_single_and_regret():
    t = table()
    assert routing.oracle_choices(t, METHODS) == ["ngram"] * 6 + ["draft"] * 6
    assert routing.best_single(t, METHODS) == "draft"  # 1.25x everywhere beats n-gram's mix
    out = routing.evaluate(t, {"draft": ["draft"] * 12, "plain": ["plain"] * 12}).set_index("chooser")
    assert out.loc["draft", "speedup"] == pytest.approx(1.25)
    assert out.loc["plain", "speedup"] == pytest.approx(1.0) and out.loc["oracle", "regret"] == 0.0
    tot = sum(p["seconds"]["plain"] for p in t["prompts"])
    oracle_s = sum(p["seconds"]["ngram" if p["category"] == "summarization" else "draft"] for p in t["prompts"])
    assert out.loc["oracle", "speedup"] == pytest.approx(tot / oracle_s)
    assert out.loc["draft", "regret"] == pytest.approx(out.loc["oracle", "speedup"] / 1.25 - 1)
    assert out.loc["draft", "lo"] == pytest.approx(1.25) and out.loc["draft", "hi"] == pytest.approx(1.25)
    assert out.loc["draft", "regret_lo"] <= out.loc["draft", "regret"] <= out.loc["draft", "regret_hi"]
    assert out.loc["draft", "oracle_agreement"] == 0.5


def test_a_fitted_router_reaches_the_oracle_on_held_out_prompts():
    policy = routing.fit(table(seed=0), METHODS, n_components=2)
    test = table(seed=1)
    picks = routing.choose(policy, test)
    assert picks == routing.oracle_choices(test, METHODS)
    out = routing.evaluate(test, {"router": picks}).set_index("chooser")
    assert out.loc["router", "regret"] == pytest.approx(0.0)
    ratio, lo, hi = routing.compare_choosers(test, picks, ["draft"] * 12)
    assert ratio > 1 and lo > 1
    assert policy.meta["fitted_on"] == "benchmark" and policy.meta["prompts"] == 12


def test_bad_choices_are_refused():
    t = table()
    with pytest.raises(ValueError, match="12 prompts"):
        routing.evaluate(t, {"short": ["plain"]})
    with pytest.raises(ValueError, match="no timings for"):
        routing.evaluate(t, {"eagle": ["eagle"] * 12})
    with pytest.raises(ValueError, match="no timings for"):
        routing.log_speedups(t, ["plain", "medusa"])
    with pytest.raises(ValueError, match="split must be"):
        routing.table_path("train")


def test_a_method_from_another_run_keeps_its_own_speedup_over_plain():
    """A method timed in another run (whose machine ran 8 % slower) joins the table with the
    speedup over plain that its own run measured, prompt by prompt; scaling by the other run's
    absolute seconds instead (the planted slip) would shrink it by that 8 %. A run at twice the
    time per step is refused: its figures cannot be set beside this table's."""
    t, other = table(seed=0), table(seed=0)
    t["meta"]["t1_s"], other["meta"]["t1_s"] = 0.020, 0.0216
    for p in other["prompts"]:
        p["seconds"] = {m: 1.08 * s for m, s in p["seconds"].items()}
        p["seconds"]["pard"] = p["seconds"]["plain"] / 1.3
        p["tokens"]["pard"] = 40
        p["tau"]["pard"] = 1.5
    other["meta"]["methods"] = METHODS + ["pard"]
    other["meta"]["counters"] = {}
    merged = routing.with_method_from(t, other, "pard")
    out = routing.evaluate(merged, {"pard": ["pard"] * 12}).set_index("chooser")
    assert out.loc["pard", "speedup"] == pytest.approx(1.3)
    slip = routing.evaluate({**merged, "prompts": [{**p, "seconds": {**p["seconds"], "pard": q["seconds"]["pard"]}}
                                                   for p, q in zip(merged["prompts"], other["prompts"])]},
                            {"pard": ["pard"] * 12}).set_index("chooser")
    assert slip.loc["pard", "speedup"] == pytest.approx(1.3 / 1.08)
    assert routing.best_single(merged, METHODS + ["pard"]) == "pard" and "pard" not in t["meta"]["methods"]
    with pytest.raises(ValueError, match="already has"):
        routing.with_method_from(merged, other, "pard")
    slow = {**other, "meta": {**other["meta"], "t1_s": 0.040}}
    with pytest.raises(ValueError, match="cannot be compared"):
        routing.with_method_from(t, slow, "pard")
