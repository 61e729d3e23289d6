"""The parallel-drafting table's per-position acceptance: each rate over the drafts that reached
its position, with a Wilson interval that stays wide where few drafts reached it."""
from __future__ import annotations

import numpy as np
import pytest

from specdecode_ref.measure import parallel as par


def _table(drafts, kept):
    return {"meta": {"counters": {"pard@4": {"spec_decode_num_drafts": drafts,
                                             "spec_decode_num_accepted_tokens_per_pos": kept}}}}


def test_rates_are_over_the_drafts_that_reached_each_position():
    pos = par.per_position(_table(200, [80, 20, 5, 0]), "pard@4")
    assert pos["reached"].tolist() == [200, 80, 20, 5]
    assert pos["conditional"] == pytest.approx([0.4, 0.25, 0.25, 0.0])
    assert pos["survival"] == pytest.approx([0.4, 0.1, 0.025, 0.0])
    assert np.all(pos["lo"] <= pos["conditional"]) and np.all(pos["conditional"] <= pos["hi"])
    # a rate of 0 from 5 drafts is not a rate of 0: its interval reaches far above it
    assert pos["hi"][3] > 0.4 and pos["hi"][0] - pos["lo"][0] < 0.15


def test_a_position_nobody_reached_has_no_rate():
    pos = par.per_position(_table(10, [0, 0]), "pard@4")
    assert np.isnan(pos["conditional"][1]) and np.isnan(pos["lo"][1]) and np.isnan(pos["hi"][1])
