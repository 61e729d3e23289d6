"""Planted bug: the draft stops at the end of the context instead of continuing the repeat, so
it is shorter than k when the match is close to the end.

caught by: test_k_larger_than_what_follows, test_match_at_the_very_end, test_against_brute_force
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


def _continue(tokens, e, k):
    period = len(tokens) - 1 - e  # distance from the occurrence to the suffix
    return tokens[e + 1:e + 1 + k]


_base._continue = _continue
