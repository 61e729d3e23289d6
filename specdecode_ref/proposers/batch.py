"""Drafting for a whole batch (batch.py's ``generate_batch``).

A :class:`BatchProposer` drafts for every active row of a batch and rolls back each row's own
state. ``Proposer.batch_proposer()`` returns one (the first two are defined in base.py):

* :class:`PerRowBatchProposer` (the default): one independent copy of the proposer per row, each
  driven exactly as ``generate`` drives it. Right for proposers whose work per row is cheap and
  has nothing to share across rows (n-gram lookup is a dictionary probe).
* :class:`BatchedDraftModelProposer`: the draft model drafts for all rows at once, one draft
  forward per draft position, with its own padded cache rolled back per row (batch.RaggedCache).

Proposers that read the target's hidden states (Medusa, EAGLE, early-exit adapters) or run the
verification themselves (early exit) refuse with a clear error: their batched forms need the
target's hidden states per row and position, which this engine does not collect.

Counterparts: vLLM ``vllm/v1/spec_decode/ngram_proposer.py`` (a loop over requests) and
``vllm/v1/spec_decode/draft_model.py`` / ``eagle.py`` (one batched drafter forward per position).
"""
from __future__ import annotations

import torch

from ..sampling import logits_to_probs
# BatchProposer, PerRowBatchProposer and fork live in base.py (Proposer.batch_proposer returns
# them, and imports flow one way: batch.py imports base.py, never the reverse); re-exported here.
from .base import BatchProposer, Draft, PerRowBatchProposer, fork

__all__ = ["BatchProposer", "PerRowBatchProposer", "fork", "BatchedDraftModelProposer"]


class BatchedDraftModelProposer(BatchProposer):
    """A DraftModelProposer for many rows: one draft forward per draft position for all rows.

    Its cache keeps the engine's invariant per row (every committed token except the last): a
    step first feeds each row's pending tokens (1, or 2 after a fully accepted draft, or the whole
    prompt at the first step), left-padded, then k-1 single-token forwards; ``on_verified`` rolls
    each row back to ``committed_before + num_accepted``, its own length.
    """

    def __init__(self, proposer):
        super().__init__(proposer)
        self.cache = None

    def begin(self, states: list) -> None:
        from ..batch import RaggedCache

        self.cache = RaggedCache(self.proposer.model, len(states))

    def _logits(self, rows_ids: list) -> torch.Tensor:
        """Feed each row's ids after its cached prefix; logits at each row's last id [B, V']."""
        p = self.proposer
        if p.head is None:
            from .draft_model import fit_logits

            out = self.cache.forward(rows_ids, logits_to_keep=1)
            return fit_logits(out.logits[:, -1], p.target_size, p.shared_tokens)
        out = self.cache.forward(rows_ids, module=p.model.model)
        return p.head.logits(out.last_hidden_state[:, -1])

    def _choose(self, logits: torch.Tensor, states: list):
        """The next draft token per row [B] and, when sampling, each row's q [B, V] (its own generator);
        the argmax and no q with draft_sampling="greedy" (drafting.choose_token's rule)."""
        p = self.proposer
        sampling = states[0].sampling
        if sampling.is_greedy or p.draft_sampling == "greedy":
            index = logits.argmax(-1)
            return (index if p.head is None else p.head.ids[index]), None
        from .draft_model import fit_logits

        full = logits if p.head is None else fit_logits(p.head.full_logits(logits), p.target_size, None)
        q = logits_to_probs(full.float(), sampling)
        toks = [torch.multinomial(q[b], 1, generator=s.generator) for b, s in enumerate(states)]
        return torch.cat(toks), q

    def propose(self, states: list) -> list:
        from .draft_model import vocab_size_of

        if self.cache is None:
            raise RuntimeError("propose() before begin(): the engine calls begin() once per batch")
        p = self.proposer
        pending = [s.token_list[length:] for s, length in zip(states, self.cache.lengths)]
        if p.shared_tokens is not None:
            top = max(max(row) for row in pending)
            if top >= vocab_size_of(p.model):
                raise ValueError(f"the target produced id {top}, a row the draft's padded vocabulary "
                                 f"({vocab_size_of(p.model)} rows) does not have")
        logits = self._logits(pending)
        tokens, probs = [], []
        for i in range(self.k):
            tok, q = self._choose(logits, states)
            tokens.append(tok)
            if q is not None:
                probs.append(q)
            if i + 1 < self.k:
                logits = self._logits([[t] for t in tok.tolist()])
        tokens = torch.stack(tokens, dim=1).long()  # [B, k]
        probs = torch.stack(probs, dim=1) if probs else None  # [B, k, V]
        return [Draft(tokens[b], None if probs is None else probs[b]) for b in range(len(states))]

    def on_verified(self, states: list, outcomes: list) -> None:
        keep = []
        for s, o, length in zip(states, outcomes, self.cache.lengths):
            committed_before = len(s.token_list) - len(o.emitted)
            keep.append(min(length, committed_before + o.num_accepted))
        self.cache.rollback(keep)
        self.cache.maybe_compact()

    def keep_rows(self, rows: list) -> None:
        self.cache.select_rows(rows)
