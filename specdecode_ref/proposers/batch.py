"""Drafting for a whole batch (batch.py's ``generate_batch``).

A :class:`BatchProposer` drafts for every active row of a batch and rolls back each row's own
state. ``Proposer.batch_proposer()`` returns one (the first two are defined in base.py):

* :class:`PerRowBatchProposer` (the default): one independent copy of the proposer per row, each
  driven exactly as ``generate`` drives it. Right for proposers whose work per row is cheap and
  has nothing to share across rows (n-gram lookup is a dictionary probe).
* :class:`BatchedDraftModelProposer`: the draft model drafts for all rows at once, one draft
  forward per draft position, with its own padded cache rolled back per row (ragged_cache.RaggedCache);
  it lives in draft_model.py, beside the proposer it batches.

Proposers that read the target's hidden states (Medusa, EAGLE, early-exit adapters) or run the
verification themselves (early exit) refuse with a clear error: their batched forms need the
target's hidden states per row and position, which this engine does not collect.

Counterparts: vLLM ``vllm/v1/spec_decode/ngram_proposer.py`` (a loop over requests) and
``vllm/v1/spec_decode/draft_model.py`` / ``eagle.py`` (one batched drafter forward per position).
"""
from __future__ import annotations

# BatchProposer, PerRowBatchProposer and fork live in base.py (Proposer.batch_proposer returns
# them, and imports flow one way: batch.py imports base.py, never the reverse); re-exported here.
from .base import BatchProposer, PerRowBatchProposer, fork
from .draft_model import BatchedDraftModelProposer

__all__ = ["BatchProposer", "PerRowBatchProposer", "fork", "BatchedDraftModelProposer"]
