"""Lab 8 grading tests (visible): the checks the notebook walks you through.

Run them with ``python -m specdecode_ref.grading labs/lab08_router --visible-only`` (your
student.py) or add ``--reference``. The small tables here are made by hand, so every answer is
known exactly; the last test fits your router on the stored benchmark table and scores it on the
held-out table. Every score is computed from stored timings by the code in this file, not by
your functions, so a router is graded the same whatever your other functions return.

The hidden tests add edge cases (ties, tokens that differ between methods, candidates that are
a subset of what the table timed, errors) and grade your router's held-out regret in bands; the
bands are in ``fit_router``'s docstring and the notebook prints their values.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from specdecode_ref.grading import lab_fixture, points
from specdecode_ref.measure import routing

lab = lab_fixture(__file__)
REFERENCE_PATTERNS = [r"specdecode_ref\.measure\.routing\b|from specdecode_ref\.measure import[^\n]*\brouting\b",
                      r"specdecode_ref\.proposers\.router\b|RouterPolicy"]
CANDIDATES = list(routing.CANDIDATES)
TOL = 1e-12


# --- hand-made tables ---------------------------------------------------------------------------

def make_table(seconds: dict, tokens: dict | None = None, tau: dict | None = None, categories=None,
               features=None, split: str = "benchmark") -> dict:
    """A timing table in the stored format. seconds: method -> per-prompt seconds (the first
    method's list sets the number of prompts); tokens: method -> per-prompt tokens (48 each
    when left out); tau likewise (plain 1.0, others 2.0 when left out)."""
    methods = list(seconds)
    n = len(next(iter(seconds.values())))
    tokens = {m: [48] * n for m in methods} | dict(tokens or {})
    tau = {m: [1.0 if m == "plain" else 2.0] * n for m in methods} | dict(tau or {})
    categories = list(categories) if categories is not None else [f"cat{i % 2}" for i in range(n)]
    rng = np.random.default_rng(n)
    prompts = []
    for i in range(n):
        f = features[i] if features is not None else {
            "log_prompt_tokens": float(np.log(50 + 10 * i)), "self_copy_rate": 0.1, "repeated_trigrams": 0.05,
            "distinct_tokens": 0.6, "hidden": rng.standard_normal(8).round(5).tolist()}
        prompts.append({"id": f"p{i}", "category": categories[i], "prompt_tokens": 50 + 10 * i, "features": f,
                        "seconds": {m: float(seconds[m][i]) for m in methods},
                        "tokens": {m: int(tokens[m][i]) for m in methods},
                        "tau": {m: tau[m][i] for m in methods}})
    return {"meta": {"split": split, "methods": methods, "machine": "hand-made", "max_new_tokens": 48,
                     "date": "2026-01-01"}, "prompts": prompts}


# Each test gets fresh tables (a function call each time), so that an implementation that
# modifies a table it is given cannot change what later tests see.

def pooled_table() -> dict:
    """Two prompts, one short and one long: n-gram halves the short one's time and leaves the long
    one as it is, so the mean of the per-prompt speedups says 1.5x while the pooled speedup is
    11/10.5."""
    return make_table({"plain": [1.0, 10.0], "ngram": [0.5, 10.0], "draft": [0.8, 6.0]})

def tau_table() -> dict:
    """Three prompts where the method with the highest tau is not the fastest: on prompt 0 the
    draft model verifies more tokens per step but its drafting costs more; on prompt 2 both
    drafters are slower than plain decoding."""
    return make_table({"plain": [2.0, 2.0, 1.0], "ngram": [1.0, 1.6, 1.2], "draft": [1.5, 1.2, 1.1]},
                      tau={"ngram": [2.0, 3.1, 1.6], "draft": [3.0, 2.5, 1.9]})


TAU_ORACLE = ("ngram", "draft", "plain")

def single_table() -> dict:
    """The best single method by pooled speedup is the draft model (1.25x on both prompts); by the
    mean of per-prompt speedups it would be n-gram (4x on a short prompt, slower on a long one)."""
    return make_table({"plain": [1.0, 10.0], "ngram": [0.25, 12.0], "draft": [0.8, 8.0]})


# --- trusted scoring (written apart from any implementation under test) --------------------------

def rate(table: dict, choices) -> float:
    """Pooled tokens per second of per-prompt choices."""
    prompts = table["prompts"]
    assert len(choices) == len(prompts), f"{len(choices)} choices for {len(prompts)} prompts"
    return sum(p["tokens"][c] for p, c in zip(prompts, choices)) / sum(p["seconds"][c] for p, c in zip(prompts, choices))


def oracle(table: dict, candidates) -> list:
    out = []
    for p in table["prompts"]:
        speeds = [p["tokens"][c] / p["seconds"][c] for c in candidates]
        out.append(candidates[speeds.index(max(speeds))])
    return out


def true_regret(table: dict, choices, candidates) -> float:
    return rate(table, oracle(table, candidates)) / rate(table, choices) - 1.0


def request_features(table: dict) -> list:
    """Each prompt's features as route() receives them: hidden as an array, plus the category."""
    return [{**p["features"], "hidden": np.asarray(p["features"]["hidden"], dtype=float), "category": p["category"]}
            for p in table["prompts"]]


_STORED: dict = {}


def tables() -> tuple:
    """Fresh copies of the stored benchmark and held-out tables (read from disk once)."""
    if not _STORED:
        _STORED.update({split: json.dumps(routing.load_table(split)) for split in ("benchmark", "heldout")})
    return json.loads(_STORED["benchmark"]), json.loads(_STORED["heldout"])


def routed(lab, train: dict, test: dict, candidates) -> list:
    """Fit the lab's router on ``train`` and route every prompt of ``test``; every choice must be
    one of ``candidates`` (a str)."""
    router = lab.fit_router(train, list(candidates))
    choices = [lab.route(router, f) for f in request_features(test)]
    bad = sorted({repr(c) for c in choices if not isinstance(c, str) or c not in candidates})
    assert not bad, f"route returned {', '.join(bad)}, which is not a candidate ({candidates})"
    return choices


# --- the tests ----------------------------------------------------------------------------------

@points(2)
def test_pooled_speedup_is_pooled(lab):
    """pooled_speedup: total tokens / total seconds against plain's, not the mean of ratios."""
    got = lab.pooled_speedup(pooled_table(), ["ngram", "ngram"])
    assert abs(got - 11.0 / 10.5) < TOL, f"n-gram everywhere: got {got}, want 11/10.5 = {11 / 10.5:.6f} " \
                                         "(1.5 would be the mean of the per-prompt speedups)"
    got = lab.pooled_speedup(pooled_table(), ["ngram", "draft"])
    assert abs(got - 11.0 / 6.5) < TOL, f"n-gram then draft: got {got}, want 11/6.5"
    assert lab.pooled_speedup(pooled_table(), ["plain", "plain"]) == pytest.approx(1.0, abs=TOL)
    assert isinstance(got, float)


@points(1)
def test_pooled_speedup_refuses_bad_choices(lab):
    """pooled_speedup: ValueError for the wrong number of choices or a method the table lacks."""
    for bad in (["ngram"], ["ngram", "ngram", "ngram"]):
        with pytest.raises(ValueError):
            lab.pooled_speedup(pooled_table(), bad)
    with pytest.raises(ValueError):
        lab.pooled_speedup(pooled_table(), ["ngram", "eagle"])


@points(2)
def test_oracle_choices_by_speed(lab):
    """oracle_choices: the fastest candidate of each prompt (by tokens / seconds, not by tau)."""
    got = list(lab.oracle_choices(tau_table(), ["plain", "ngram", "draft"]))
    assert got == list(TAU_ORACLE), f"got {got}, want {list(TAU_ORACLE)}"
    got = list(lab.oracle_choices(tau_table(), ["ngram", "draft"]))
    assert got == ["ngram", "draft", "draft"], f"without plain: got {got}"


@points(2)
def test_regret_example(lab):
    """regret = oracle's pooled speed / the choices' pooled speed - 1."""
    cands = ["plain", "ngram", "draft"]
    assert lab.regret(tau_table(), list(TAU_ORACLE), cands) == pytest.approx(0.0, abs=TOL)  # the oracle itself
    want = (3 * 48 / (1.0 + 1.2 + 1.0)) / (3 * 48 / (1.0 + 1.6 + 1.2)) - 1  # n-gram everywhere: 3.8 / 3.2 - 1
    got = lab.regret(tau_table(), ["ngram"] * 3, cands)
    assert abs(got - want) < TOL, f"n-gram everywhere: got {got}, want {want:.6f} (oracle speed / n-gram's - 1)"
    assert isinstance(got, float)


@points(1)
def test_best_single_is_pooled(lab):
    """best_single: the highest pooled speedup (the draft model), not the highest mean ratio."""
    got = lab.best_single(single_table(), ["plain", "ngram", "draft"])
    assert got == "draft", f"got {got!r}, want 'draft' (pooled 1.25x; n-gram's pooled speedup is {11 / 12.25:.3f})"


@points(4)
def test_router_beats_plain_on_held_out_prompts(lab):
    """fit_router on the benchmark table, route on the held-out table: candidates only, and
    faster than plain decoding in pooled speed."""
    train, test = tables()
    choices = routed(lab, train, test, CANDIDATES)
    speedup = rate(test, choices) / rate(test, ["plain"] * len(choices))
    assert speedup > 1.0, f"your router's pooled speedup on the held-out prompts is {speedup:.3f}x: " \
                          "no faster than plain decoding"


# --- the bands of the held-out regret (the hidden tests grade them; the notebook prints them) -----

def regret_bands() -> dict:
    """The held-out regrets that set the bands, all fitted on the benchmark table and scored on
    the held-out table with the six candidates:

    best: the best single candidate on the benchmark table, ``best_regret`` its held-out regret;
    reference_regret: the course's reference router's (``routing.fit``, ridge regression);
    bands: name -> the highest regret that earns the band's points: "1.5x best single" (1.5 times
      the best single's regret), "best single" (its regret) and "full" (halfway from the best
      single's regret to the reference router's).
    """
    train, test = tables()
    n = len(test["prompts"])
    best = max(CANDIDATES, key=lambda c: (rate(train, [c] * len(train["prompts"])), -CANDIDATES.index(c)))
    best_regret = true_regret(test, [best] * n, CANDIDATES)
    reference_regret = true_regret(test, routing.choose(routing.fit(train, CANDIDATES), test), CANDIDATES)
    return {"best": best, "best_regret": best_regret, "reference_regret": reference_regret,
            "bands": {"1.5x best single": 1.5 * best_regret,
                      "best single": best_regret,
                      "full": (best_regret + reference_regret) / 2}}
