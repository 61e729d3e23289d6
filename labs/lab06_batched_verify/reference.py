"""Lab 6 with the reference package switched in: the same names as student.py, as thin adapters
over ``specdecode_ref.batch`` (bound at import, so a test may swap the engine's functions for
these without recursion)."""
from __future__ import annotations

import torch

from specdecode_ref.batch import compaction_index as _compaction_index
from specdecode_ref.batch import greedy_verify_rows as _greedy_verify_rows
from specdecode_ref.batch import left_pad_layout as _left_pad_layout
from specdecode_ref.masks import ragged_attention_mask as _ragged_attention_mask
from specdecode_ref.batch import rollback_slot_positions as _rollback_slot_positions


def step_layout(rows_ids, lengths, pad_id=0):
    return _left_pad_layout([[int(t) for t in r] for r in rows_ids], list(lengths), pad_id)


def ragged_attention_mask(slot_pos, query_pos, dtype=torch.float32):
    return _ragged_attention_mask(slot_pos, query_pos, dtype)


def verify_rows(logits, drafts):
    return _greedy_verify_rows(logits, [[int(t) for t in d] for d in drafts])


def rollback(slot_pos, keep):
    return _rollback_slot_positions(slot_pos, list(keep))


def compaction_index(slot_pos):
    return _compaction_index(slot_pos)
