"""Lab 2 with the reference package switched in: the same names as student.py, as thin adapters
over ``specdecode_ref.proposers.NgramProposer``.

The package's proposer keeps the contract of student.py: the list object it indexed, grown, is
trusted without looking back (the engine's case, O(new tokens) per call); any other list is
compared with the indexed prefix and re-indexed from scratch when it differs."""
from __future__ import annotations

from specdecode_ref.proposers import NgramProposer as _ReferenceNgram


def ngram_lookup(tokens: list, k: int, min_n: int = 1, max_n: int = 4) -> list:
    # A fresh proposer indexes the whole context once: O(L * max_n) for this one call.
    return _ReferenceNgram(k=k, min_n=min_n, max_n=max_n).lookup(list(tokens))


class NgramProposer(_ReferenceNgram):
    name = "reference-ngram"

    def __init__(self, k: int = 5, min_n: int = 1, max_n: int = 4):
        super().__init__(k=k, min_n=min_n, max_n=max_n)

    def reset(self) -> None:
        self._reset()
