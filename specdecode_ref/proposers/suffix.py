"""Suffix decoding: draft from what this request and earlier requests already said (no model).

N-gram lookup copies what followed the context's suffix once, in this request. Suffix decoding
(Oliaro et al., arXiv 2411.04975) keeps frequency-counted suffix trees (suffix_tree.py): one
over this request's prompt and output, and one global tree over the outputs of earlier
requests. Each step it matches the context's last tokens in both, follows the most frequent
continuation and drafts as many tokens as the match earns (``max_spec_factor`` per matched
token, capped at k), stopping where the estimated probability falls below ``min_token_prob``.
Workloads whose requests repeat each other (one tool-call format, one JSON schema, one code base)
are where the global tree pays; on open-ended chat it behaves like prompt lookup.

The parameters carry vLLM's names (``--speculative-config '{"method": "suffix", ...}'``,
``vllm/config/speculative.py``: ``suffix_decoding_max_tree_depth`` = 24,
``suffix_decoding_max_cached_requests`` = 10000, ``suffix_decoding_max_spec_factor`` = 1.0,
``suffix_decoding_min_token_prob`` = 0.1; ``num_speculative_tokens`` is our k). vLLM's proposer,
``vllm/v1/spec_decode/suffix_decoding.py``, drives Arctic Inference's C++ trees the same way.

Drafts are deterministic (q one-hot), so verification is lossless at any temperature.
"""
from __future__ import annotations

import torch

from .base import BatchProposer, DecodeState, Draft, Proposer, StepOutcome, with_sizing
from .suffix_tree import SuffixCache


class SuffixProposer(Proposer):
    """Drafts for one request at a time from a :class:`SuffixCache` that outlives the request.

    Decode several requests with the same proposer (``generate`` one after another, or a batch)
    and the later ones draft from the earlier ones' outputs. ``cache`` may be shared between
    proposers; by default each proposer has its own.
    """

    name = "suffix"
    learns_across_requests = True  # benchmarks that repeat a prompt must not let it draft its own last answer

    def __init__(self, k: int = 24, max_tree_depth: int = 24, max_cached_requests: int = 10000,
                 max_spec_factor: float = 1.0, min_token_prob: float = 0.1, max_spec_offset: float = 0.0,
                 cache: SuffixCache | None = None):
        super().__init__(k)
        if not isinstance(max_tree_depth, int) or max_tree_depth < 1:
            raise ValueError(f"max_tree_depth must be an int >= 1, got {max_tree_depth!r}")
        if max_spec_factor < 0:
            raise ValueError(f"max_spec_factor must be >= 0, got {max_spec_factor!r}")
        if not 0 <= min_token_prob <= 1:
            raise ValueError(f"min_token_prob must be in [0, 1], got {min_token_prob!r}")
        if cache is not None and cache.max_tree_depth != max_tree_depth:
            raise ValueError(f"the cache's trees are {cache.max_tree_depth} deep, not max_tree_depth={max_tree_depth}")
        self.max_tree_depth = max_tree_depth
        self.max_spec_factor = float(max_spec_factor)
        self.max_spec_offset = float(max_spec_offset)
        self.min_token_prob = float(min_token_prob)
        self.cache = cache if cache is not None else SuffixCache(max_tree_depth, max_cached_requests)
        self._request = None  # this proposer's active request id in the cache
        self._fed = 0  # tokens of the request's token_list already in the trees
        self.last_match = None  # the SuffixMatch behind the latest draft (for notebooks)

    def history_mark(self) -> frozenset:
        """The requests the shared history holds now (for :meth:`forget_since`)."""
        return frozenset(self.cache.cached_requests)

    def forget_since(self, mark: frozenset) -> None:
        """Drop from the history every finished request cached after ``mark``: a benchmark that
        times one prompt several times must not let a repeat draft from the earlier answers."""
        self.stop()  # the last request is over (the engine leaves it open until the next begin)
        self._request = None
        for req_id in [r for r in self.cache.cached_requests if r not in mark]:
            self.cache.evict(req_id)

    def begin(self, state: DecodeState) -> None:
        self.stop()
        self._request = self.cache.new_request_id()
        self.cache.start_request(self._request, state.token_list[: state.prompt_len])
        self._fed = state.prompt_len

    def resume(self, state: DecodeState, request_id) -> None:
        """Pick a request up again after a pause (a server preempted it): its cached output is
        dropped and re-added from ``state``, so nothing is counted twice."""
        self.stop()
        if request_id in self.cache.cached_requests:
            self.cache.evict(request_id)
        self._request = request_id
        self.cache.start_request(request_id, state.token_list[: state.prompt_len])
        self._fed = state.prompt_len

    def stop(self) -> None:
        """The request is over (or paused): free its own tree; its output stays in the global tree."""
        if self._request is not None and self._request in self.cache.active_requests:
            self.cache.stop_request(self._request)

    def _sync(self, tokens: list) -> None:
        if len(tokens) < self._fed:
            raise RuntimeError("the request's committed tokens shrank; call begin() for a new request")
        if len(tokens) > self._fed:
            self.cache.add_response(self._request, tokens[self._fed:])
            self._fed = len(tokens)

    def propose(self, state: DecodeState) -> Draft:
        if self._request is None or self._request not in self.cache.active_requests:
            raise RuntimeError("SuffixProposer.propose before begin(): no active request")
        tokens = state.token_list
        self._sync(tokens)
        match = self.cache.speculate(self._request, tokens[-self.max_tree_depth:], self.k,
                                     self.max_spec_factor, self.max_spec_offset, self.min_token_prob)
        self.last_match = match
        return Draft(torch.tensor(match.tokens, dtype=torch.long, device=state.device))

    def on_verified(self, state: DecodeState, outcome: StepOutcome) -> None:
        self._sync(state.token_list)  # a request's last step feeds the global tree too

    def batch_proposer(self) -> "SuffixBatchProposer":
        return SuffixBatchProposer(self)

    def __repr__(self) -> str:
        return with_sizing(self, (f"SuffixProposer(k={self.k}, max_tree_depth={self.max_tree_depth}, "
                f"max_cached_requests={self.cache.max_cached_requests}, max_spec_factor={self.max_spec_factor}, "
                f"min_token_prob={self.min_token_prob})"))


class SuffixBatchProposer(BatchProposer):
    """One suffix drafter per row, all on the proposer's one cache: every row drafts from the
    global tree, which every row's output feeds as it is generated.

    A row that leaves (finished or preempted) stops its request; a preempted row that comes back
    (the scheduler hands the same DecodeState to ``add_rows``) resumes its request id, so its
    output is not counted twice in the global tree.
    """

    def __init__(self, proposer: SuffixProposer):
        super().__init__(proposer)
        self.rows: list = []  # per row: a SuffixProposer sharing the cache
        self._ids: dict = {}  # id(DecodeState) -> (state, request id); the state is kept so its id stays unique

    def _row(self, state: DecodeState) -> SuffixProposer:
        p = self.proposer
        row = SuffixProposer(p.k, p.max_tree_depth, p.cache.max_cached_requests, p.max_spec_factor,
                             p.min_token_prob, p.max_spec_offset, cache=p.cache)
        known = self._ids.get(id(state))
        if known is not None and known[0] is state:
            row.resume(state, known[1])
        else:
            row.begin(state)
            self._ids[id(state)] = (state, row._request)
        return row

    def begin(self, states: list) -> None:
        for row in self.rows:
            row.stop()
        self.rows = []
        self.add_rows(states)

    def add_rows(self, states: list) -> None:
        self.rows.extend(self._row(s) for s in states)

    def propose(self, states: list) -> list:
        return [row.propose(s) for row, s in zip(self.rows, states)]

    def on_verified(self, states: list, outcomes: list) -> None:
        for row, s, o in zip(self.rows, states, outcomes):
            row.on_verified(s, o)

    def keep_rows(self, rows: list) -> None:
        keep = set(rows)
        for j, row in enumerate(self.rows):
            if j not in keep:
                row.stop()
        self.rows = [self.rows[r] for r in rows]

    def row_proposer(self, row: int) -> Proposer:
        return self.rows[row]
