"""Lab 1 with the reference package switched in: the same names as student.py.

``rejection_sample`` and ``accepted_length`` are the package's own (specdecode_ref.verify); the
package computes the acceptance test and the residual inline, so those two are written out here.
"""
from __future__ import annotations

import torch

from specdecode_ref.verify import accepted_length as _accepted_length, rejection_sample  # noqa: F401


def accept_mask(p_draft: torch.Tensor, q_draft: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return u * q_draft < p_draft  # the test verify.rejection_sample applies


def accepted_length(accept: torch.Tensor) -> torch.Tensor:
    return _accepted_length(accept)


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    # The same arithmetic as verify.rejection_sample, exposed for the lab.
    residual = (p.float() - q.float()).clamp(min=0.0)
    mass = residual.sum(dim=-1, keepdim=True)
    return torch.where(mass > 1e-12, residual / mass.clamp(min=1e-30), p.float())
