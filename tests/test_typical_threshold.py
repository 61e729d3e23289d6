"""Typical acceptance's plausibility threshold, min(epsilon, delta * exp(-H(p))), on distributions
whose entropy is known in closed form."""
import math

import pytest
import torch

from specdecode_ref.verify import TYPICAL_DELTA, TYPICAL_EPSILON, typical_threshold


def test_threshold_on_known_entropies():
    one_hot = torch.zeros(8).index_fill_(0, torch.tensor([3]), 1.0)  # H = 0: the cap epsilon applies
    uniform = torch.full((8,), 1 / 8)  # H = ln 8: delta / 8
    got = typical_threshold(torch.stack([one_hot, uniform]))
    assert got.shape == (2,)
    assert got[0].item() == pytest.approx(min(TYPICAL_EPSILON, TYPICAL_DELTA))
    assert got[1].item() == pytest.approx(min(TYPICAL_EPSILON, TYPICAL_DELTA * math.exp(-math.log(8))))
    assert typical_threshold(uniform, epsilon=1.0, delta=0.5).item() == pytest.approx(0.5 / 8)


def test_negative_settings_are_refused():
    with pytest.raises(ValueError, match="epsilon and delta must be >= 0"):
        typical_threshold(torch.full((4,), 0.25), epsilon=-0.1)
