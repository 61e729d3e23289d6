"""Planted bug: the draft stops at the end of the context instead of continuing the repeat, so
it is shorter than k when the match is close to the end.

caught by: test_k_larger_than_what_follows, test_match_at_the_very_end, test_against_brute_force
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution, one function replaced below


@patch
def _continue(tokens, e, k):
    period = len(tokens) - 1 - e  # distance from the occurrence to the suffix
    return tokens[e + 1:e + 1 + k]
