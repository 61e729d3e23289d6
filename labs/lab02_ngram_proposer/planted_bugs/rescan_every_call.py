"""Planted bug: the proposer rescans the whole context on every call (correct drafts, but
O(L) per step and O(L^2) per generation).

caught by: test_proposer_cost_does_not_grow
"""
from __future__ import annotations
import torch
from specdecode_ref.proposers import Draft, Proposer

import importlib.util as _ilu
from pathlib import Path as _Path

# Everything not redefined below is the worked solution; the buggy functions are patched into it
# too, so the solution's other functions call them (as they would in one student file).
_spec = _ilu.spec_from_file_location("_planted_base", _Path(__file__).resolve().parents[1] / "solution.py")
_base = _ilu.module_from_spec(_spec)
_spec.loader.exec_module(_base)
globals().update({_n: _v for _n, _v in vars(_base).items() if not _n.startswith("__")})


class NgramProposer(Proposer):
    name = "student-ngram"

    def __init__(self, k=5, min_n=1, max_n=4):
        super().__init__(k)
        if not isinstance(min_n, int) or not isinstance(max_n, int) or not 1 <= min_n <= max_n:
            raise ValueError(f"need integers 1 <= min_n <= max_n, got {min_n!r}, {max_n!r}")
        self.min_n, self.max_n = min_n, max_n
        self.reset()

    def reset(self):
        self.index = {}  # n-gram -> last end position with a follower
        self.indexed = 0  # n-grams ending at positions < indexed are in the index
        self.last = None  # tokens[indexed - 1] when we indexed it

    def lookup(self, tokens):
        return ngram_lookup(tokens, self.k, self.min_n, self.max_n)  # BUG: a full scan every step
        L = len(tokens)
        if L - 1 < self.indexed or (self.indexed and tokens[self.indexed - 1] != self.last):
            self.reset()  # not a continuation of what we indexed: a new context
        for e in range(self.indexed, L - 1):  # n-grams that gained a follower since last time
            for n in range(self.min_n, min(self.max_n, e + 1) + 1):
                self.index[tuple(tokens[e - n + 1:e + 1])] = e
        self.indexed = max(self.indexed, L - 1)
        self.last = tokens[self.indexed - 1] if self.indexed else None
        for n in range(min(self.max_n, L), self.min_n - 1, -1):
            e = self.index.get(tuple(tokens[L - n:]))
            if e is not None:
                return _continue(tokens, e, self.k)
        return []

    def begin(self, state):
        self.reset()

    def propose(self, state):
        draft = self.lookup(state.token_list)
        return Draft(torch.tensor(draft, dtype=torch.long, device=state.device))


_base.NgramProposer = NgramProposer
