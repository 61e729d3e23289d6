"""Lab 2 — the n-gram (prompt lookup) proposer. Fill in ``ngram_lookup`` and ``NgramProposer.lookup``.

An n-gram proposer drafts without any model: it looks for the end of the text earlier in the
text and proposes what followed there. The rule, precisely:

1. For n = max_n, max_n - 1, ..., min_n (longest first): take the suffix s = tokens[L-n:]
   (L = len(tokens)) and look for an earlier occurrence of s that ends at some position
   e <= L - 2, i.e. tokens[e-n+1 : e+1] == s, so that at least one token follows it.
2. Use the most recent such occurrence (the largest e). The first n that has one wins.
3. Propose the k tokens that follow it: draft[j] = tokens[e + 1 + j]. When k is larger than
   what follows (e + 1 + j reaches L), keep copying from the text *continued by the draft
   itself*: the occurrence at e and the suffix ending at L - 1 are P = L - 1 - e apart, so if the
   text repeats with period P, draft[j] = tokens[e + 1 + (j % P)].
4. No occurrence for any n in [min_n, max_n]: propose nothing ([]).

Example: tokens = [7, 1, 2, 3, 1, 2], k = 4, max_n = 2: the suffix [1, 2] occurred ending at
e = 2; what follows is [3, 1, 2] (P = 3), continued periodically: [3, 1, 2, 3].
"""
from __future__ import annotations

import torch

from specdecode_ref.proposers import Draft, Proposer


def ngram_lookup(tokens: list, k: int, min_n: int = 1, max_n: int = 4) -> list:
    """Draft up to k tokens for the context ``tokens`` (a list of ints) by the rule above.

    Returns a list of k ints, or [] when no suffix of length min_n..max_n occurred before.
    Raise ValueError unless k >= 1 and 1 <= min_n <= max_n. Do not modify ``tokens``.
    One call may scan the whole context (O(L * max_n) is fine here); the class below must not.
    """
    raise NotImplementedError("ngram_lookup: longest suffix, most recent occurrence, periodic copy")


class NgramProposer(Proposer):
    """The same rule as :func:`ngram_lookup`, incrementally: a proposer the engine can call every step.

    The engine calls ``propose`` once per decoding step with its list of committed tokens: the
    *same list object* every step, grown by the 1 to k + 1 tokens the step emitted (committed
    tokens never change). Rescanning the whole context every step costs O(L) per step and
    O(L^2) over a generation. Instead keep an index from each n-gram (a tuple, n in
    min_n..max_n) to the position where it last ended, add only the n-grams that became
    complete since the previous call, and answer a lookup with at most max_n dictionary
    look-ups. On that path the cost of a call must not grow with the length of the context: do
    not compare, copy or scan the whole list.

    Careful with the most recent occurrence: an n-gram may only be indexed once the token after
    it is known (ending at e <= L - 2), otherwise the suffix would find itself.
    """

    name = "student-ngram"

    def __init__(self, k: int = 5, min_n: int = 1, max_n: int = 4):
        super().__init__(k)  # checks k
        if not isinstance(min_n, int) or not isinstance(max_n, int) or not 1 <= min_n <= max_n:
            raise ValueError(f"need integers 1 <= min_n <= max_n, got {min_n!r}, {max_n!r}")
        self.min_n, self.max_n = min_n, max_n
        self.reset()

    def reset(self) -> None:
        """Forget the previous context (a new request starts). Set up your index here."""
        self.index = {}  # n-gram tuple -> the last position where it ended (with a follower)
        self.indexed = 0  # how far into the context the index is up to date (your choice)
        # ... and what you need to recognise the context next time (see lookup)

    def lookup(self, tokens: list) -> list:
        """Draft for ``tokens``: always exactly ``ngram_lookup(tokens, self.k, self.min_n, self.max_n)``.

        Two cases:

        * ``tokens`` is the list object of the previous call and has not shrunk (the engine's
          case): it is the old context plus new tokens. Index the new n-grams only.
        * anything else (another list, or a shorter one) may be a new context, even when it
          shares its length, its first or its last tokens with the old one. Check that the
          tokens you indexed are still its prefix (comparing them costs O(L), which is fine
          once per request) and otherwise call ``self.reset()`` and index it from scratch.
        """
        raise NotImplementedError("NgramProposer.lookup: update the index, then look up the suffix")

    # --- given: the glue to the engine ----------------------------------------------------
    def begin(self, state) -> None:
        self.reset()

    def propose(self, state) -> Draft:
        draft = self.lookup(state.token_list)
        return Draft(torch.tensor(draft, dtype=torch.long, device=state.device))
