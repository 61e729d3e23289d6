"""Drafting for a whole batch (batch.py's ``generate_batch``).

A :class:`BatchProposer` drafts for every active row of a batch and rolls back each row's own
state; rows may join a running batch (``add_rows``, the serving scheduler) and leave it
(``keep_rows``). ``Proposer.batch_proposer()`` returns one (the first two are defined in base.py):

* :class:`PerRowBatchProposer` (the default): one independent copy of the proposer per row, each
  driven exactly as ``generate`` drives it, with that row's own hidden states when it reads them
  (``needs_hidden_states``: the engine then collects them in its batched forwards and hands each
  row its prompt's columns and, after each step, its root and accepted path). Right where the
  work per row is small or has nothing to share: n-gram lookup is a dictionary probe, Medusa and
  Hydra heads read one feature, EAGLE's one-layer head runs on one row's tokens.
* :class:`BatchedDraftModelProposer`: the draft model drafts for all rows at once, one draft
  forward per draft position, with its own padded cache rolled back per row
  (ragged_cache.RaggedCache); it lives in draft_model.py, beside the proposer it batches.
* ``early_exit.BatchedEarlyExitProposer``: the same for early exit, the draft stack being the
  target's first layers and the exit adapter, in a padded cache of its own.

A wrapper around early exit is refused (``base.refuse_own_scorer``): early exit verifies in one
request's own cache, and its batched form is what it returns from ``batch_proposer``.

Counterparts: vLLM ``vllm/v1/spec_decode/ngram_proposer.py`` (a loop over requests) and
``vllm/v1/spec_decode/draft_model.py`` / ``eagle.py`` (one batched drafter forward per position).
"""
from __future__ import annotations

# BatchProposer, PerRowBatchProposer and fork live in base.py (Proposer.batch_proposer returns
# them, and imports flow one way: batch.py imports base.py, never the reverse); re-exported here.
from .base import BatchProposer, PerRowBatchProposer, fork
from .draft_model import BatchedDraftModelProposer

__all__ = ["BatchProposer", "PerRowBatchProposer", "fork", "BatchedDraftModelProposer"]
