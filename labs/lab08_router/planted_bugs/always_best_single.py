"""Planted bug: a "router" that picks the best single candidate of the benchmark table for every
prompt: what a deployment does when it ships one drafter. It reaches the best single
candidate's regret, not the full band (and on the shipped tables the best single candidate is
plain decoding, so it is no faster than plain either).

caught by: test_router_regret_full_band
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution, one function replaced below


@patch
def fit_router(table, candidates):
    return {"candidates": list(candidates), "best": best_single(table, candidates)}  # BUG: no features


@patch
def route(router, features):
    return router["best"]
