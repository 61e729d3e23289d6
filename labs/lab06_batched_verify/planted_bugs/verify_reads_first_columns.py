"""Planted bug: verification reads each row's scores from the first len + 1 columns, as if the
batch were right-padded; with left padding a short row then checks its draft against padding.

caught by: test_verify_rows_examples, test_verify_rows_random_bruteforce, test_your_functions_drive_the_engine
"""
from __future__ import annotations

import importlib.util as _ilu
from pathlib import Path as _Path

import torch

# Everything not redefined below is the worked solution.
_spec = _ilu.spec_from_file_location("_planted_base", _Path(__file__).resolve().parents[1] / "solution.py")
_base = _ilu.module_from_spec(_spec)
_spec.loader.exec_module(_base)
globals().update({_n: _v for _n, _v in vars(_base).items() if not _n.startswith("__")})


def verify_rows(logits, drafts):
    emitted, accepted = [], []
    for b, draft in enumerate(drafts):
        draft = [int(t) for t in draft]
        best = logits[b, : len(draft) + 1].argmax(-1).tolist()  # BUG: the padded columns
        a = 0
        while a < len(draft) and draft[a] == best[a]:
            a += 1
        emitted.append(draft[:a] + [best[a]])
        accepted.append(a)
    return emitted, accepted
