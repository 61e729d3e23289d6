"""Planted bug: the oracle picks the candidate with the most tokens per verification step (tau)
instead of the most tokens per second: a drafter that verifies long drafts but drafts slowly
looks best, and plain decoding (tau 1) never wins.

caught by: test_oracle_choices_by_speed, test_regret_example, test_oracle_on_the_held_out_table
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution, one function replaced below


@patch
def oracle_choices(table, candidates):
    candidates = _check_candidates(table, candidates)
    out = []
    for p in table["prompts"]:
        taus = [p["tau"][c] if p["tau"][c] is not None else 1.0 for c in candidates]  # plain: 1 token a step
        out.append(candidates[taus.index(max(taus))])  # BUG: tau, not tokens / seconds
    return out
