"""Mutant: the best single candidate by the mean of its per-prompt speedups, not pooled.

caught by: test_best_single_is_pooled
"""
from __future__ import annotations

import numpy as np

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def best_single(table, candidates):
    candidates = _check_candidates(table, candidates)
    speeds = _speeds(table, candidates)
    plain = np.array([p["tokens"]["plain"] / p["seconds"]["plain"] for p in table["prompts"]])
    return candidates[int(np.argmax((speeds / plain[:, None]).mean(axis=0)))]  # BUG: mean of ratios
