"""Planted bug: the acceptance test is inverted, accepting with probability min(1, q/p). Drafts
the target considers unlikely now pass most easily.

caught by: test_accept_mask_examples, test_first_token_follows_p, test_acceptance_rate_is_overlap
"""
from __future__ import annotations

import importlib.util as _ilu
from pathlib import Path as _Path

# Everything not redefined below is the worked solution; the buggy functions are patched into it
# too, so the solution's other functions call them (as they would in one student file).
_spec = _ilu.spec_from_file_location("_planted_base", _Path(__file__).resolve().parents[1] / "solution.py")
_base = _ilu.module_from_spec(_spec)
_spec.loader.exec_module(_base)
globals().update({_n: _v for _n, _v in vars(_base).items() if not _n.startswith("__")})


def accept_mask(p_draft, q_draft, u):
    return u * p_draft < q_draft


_base.accept_mask = accept_mask
