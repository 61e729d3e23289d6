"""Planted bug: the pooled speedup as the mean of the per-prompt speedups, so that a short prompt
where a drafter shines weighs as much as a long one where it does not.

caught by: test_pooled_speedup_is_pooled, test_tokens_of_the_chosen_method
"""
from __future__ import annotations

import numpy as np

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution, one function replaced below


@patch
def pooled_speedup(table, choices):
    _totals(table, choices)  # the same checks as the solution
    ratios = [(p["tokens"][c] / p["seconds"][c]) / (p["tokens"]["plain"] / p["seconds"]["plain"])
              for p, c in zip(table["prompts"], choices)]
    return float(np.mean(ratios))  # BUG: mean of ratios, not pooled
