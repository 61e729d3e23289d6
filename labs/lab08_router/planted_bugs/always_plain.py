"""Planted bug: a "router" that always decodes plainly: safe, never faster. On the shipped
tables plain decoding is also the best single candidate, so it keeps the two lower regret bands;
and it picks plain even when plain is not among the candidates.

caught by: test_router_beats_plain_on_held_out_prompts, test_router_regret_full_band, test_router_never_picks_a_non_candidate
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution, one function replaced below


@patch
def route(router, features):
    return "plain"  # BUG: ignores the router and the features
