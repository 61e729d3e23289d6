"""Mutant: the oracle takes the fastest method the table timed, ignoring the candidates: on the
held-out table it picks the live "router" and "bandit" columns.

caught by: test_oracle_choices_by_speed, test_oracle_only_among_candidates, test_oracle_on_the_held_out_table
"""
from __future__ import annotations

import numpy as np

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def oracle_choices(table, candidates):
    _check_candidates(table, candidates)
    methods = list(table["meta"]["methods"])  # BUG: every timed method, not the candidates
    return [methods[i] for i in np.argmax(_speeds(table, methods), axis=1)]
