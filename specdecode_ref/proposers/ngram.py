"""N-gram (prompt lookup) drafting: no model, just copy what followed the same suffix earlier.

Find the longest suffix of the context (n from max_n down to min_n) that occurred before, and
propose the up-to-k tokens that followed its most recent earlier occurrence. The index maps each
n-gram to the position where it last ended and is updated incrementally, so a step costs
O(max_n) dictionary operations whatever the context length (no O(L^2) scan).

Counterparts: vLLM ``vllm/v1/spec_decode/ngram_proposer.py`` (KMP over the reversed context);
transformers ``generation/candidate_generator.py`` (``PromptLookupCandidateGenerator``, a sliding
window scan).
"""
from __future__ import annotations

import torch

from .base import DecodeState, Draft, Proposer, with_sizing


class NgramProposer(Proposer):
    name = "ngram"

    def __init__(self, k: int = 5, min_n: int = 1, max_n: int = 4, occurrence: str = "recent",
                 k_per_matched_token: int | None = None, extend_periodically: bool = True):
        super().__init__(k)
        # A match near the end of the context has fewer than k followers. Repeating them with the
        # match's period keeps drafting through loops and lists; vLLM's proposer instead stops at
        # the end of the context (extend_periodically=False, with occurrence="first", is its rule).
        self.extend_periodically = bool(extend_periodically)
        if k_per_matched_token is not None and (not isinstance(k_per_matched_token, int) or k_per_matched_token < 1):
            raise ValueError(f"k_per_matched_token must be None or an int >= 1, got {k_per_matched_token!r}")
        # A longer suffix match predicts a longer accepted run (notebook 04 measures it), so a
        # match of n tokens may draft at most k_per_matched_token * n: short, doubtful matches
        # then cost little verify time. None drafts k whatever the match length.
        self.k_per_matched_token = k_per_matched_token
        if occurrence not in ("recent", "first"):
            raise ValueError(f"occurrence must be 'recent' or 'first', got {occurrence!r}")
        self.occurrence = occurrence
        if not isinstance(min_n, int) or not isinstance(max_n, int) or min_n < 1 or max_n < min_n:
            raise ValueError(f"need integers 1 <= min_n <= max_n, got min_n={min_n!r}, max_n={max_n!r}")
        self.min_n, self.max_n = min_n, max_n
        self._reset()

    def _reset(self):
        self._index: dict = {}  # n-gram tuple -> last position where it ends (with a follower)
        self._indexed = 0  # n-grams ending before this position are in the index
        self._copy: list = []  # the indexed prefix, to notice a rewritten context
        self._source = None  # the list object last synced

    def begin(self, state: DecodeState) -> None:
        self._reset()

    def _sync(self, tokens: list) -> None:
        """Index every n-gram that ends before the last token (so each has a follower)."""
        if self._indexed and not (tokens is self._source and len(tokens) > self._indexed):
            # A different list (or one that shrank): keep the index only if it still describes
            # this context's prefix. The engine always passes the same growing list, so this
            # O(L) comparison runs only for ad-hoc calls (notebooks, labs).
            if len(tokens) <= self._indexed or tokens[: self._indexed] != self._copy:
                self._reset()
        self._source = tokens
        for end in range(self._indexed, len(tokens) - 1):
            for n in range(self.min_n, min(self.max_n, end + 1) + 1):
                key = tuple(tokens[end - n + 1 : end + 1])
                if self.occurrence == "recent" or key not in self._index:
                    self._index[key] = end
        if len(tokens) - 1 > self._indexed:
            self._copy.extend(tokens[self._indexed : len(tokens) - 1])
            self._indexed = len(tokens) - 1

    def lookup(self, tokens: list) -> list:
        """Draft for a plain list of ids (used by ``propose``; handy in notebooks and labs)."""
        self._sync(tokens)
        length = len(tokens)
        for n in range(min(self.max_n, length), self.min_n - 1, -1):
            end = self._index.get(tuple(tokens[length - n :]))
            if end is None:
                continue
            period = length - 1 - end  # distance from that occurrence to the suffix
            size = self.k if self.k_per_matched_token is None else min(self.k, self.k_per_matched_token * n)
            if not self.extend_periodically:
                return tokens[end + 1 : end + 1 + size]
            # Past the end of the context the continuation repeats with that period.
            return [tokens[end + 1 + (j % period)] for j in range(size)]
        return []

    def propose(self, state: DecodeState) -> Draft:
        draft = self.lookup(state.token_list)
        return Draft(torch.tensor(draft, dtype=torch.long, device=state.device))

    def __repr__(self) -> str:
        extra = "" if self.k_per_matched_token is None else f", k_per_matched_token={self.k_per_matched_token}"
        if not self.extend_periodically:
            extra += ", extend_periodically=False"
        return with_sizing(self, f"NgramProposer(k={self.k}, min_n={self.min_n}, max_n={self.max_n}, "
                                 f"occurrence={self.occurrence!r}{extra})")
