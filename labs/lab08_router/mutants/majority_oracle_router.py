"""Mutant: a router that ignores the features and always picks the candidate the oracle chose
most often on the benchmark prompts.

caught by: test_router_regret_full_band
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def fit_router(table, candidates):
    picks = oracle_choices(table, candidates)
    return {"pick": max(candidates, key=picks.count)}  # BUG: the same answer for every prompt


@patch
def route(router, features):
    return router["pick"]
