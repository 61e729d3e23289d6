"""Lab 7 with the reference package switched in: the same names as student.py.

``prefix_weights``, ``stop_probabilities`` and ``block_verify`` are the package's own
(specdecode_ref.verify); the package computes the residual at the stopping point inline, so that
one is written out here.
"""
from __future__ import annotations

import torch

from specdecode_ref.verify import block_verify, prefix_weights, stop_probabilities  # noqa: F401


def prefix_residual(p: torch.Tensor, q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # The same arithmetic as verify.block_verify, exposed for the lab.
    residual = (w.float()[..., None] * p.float() - q.float()).clamp(min=0.0)
    mass = residual.sum(dim=-1, keepdim=True)
    return torch.where(mass > 1e-12, residual / mass.clamp(min=1e-30), p.float())
