"""Mutant: the oracle keeps the last of equally fast candidates (>= in the running maximum).

caught by: test_oracle_ties_go_to_the_earlier_candidate
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def oracle_choices(table, candidates):
    candidates = _check_candidates(table, candidates)
    out = []
    for p in table["prompts"]:
        best, best_speed = None, -1.0
        for c in candidates:
            speed = p["tokens"][c] / p["seconds"][c]
            if speed >= best_speed:  # BUG: a tie replaces the earlier candidate
                best, best_speed = c, speed
        out.append(best)
    return out
