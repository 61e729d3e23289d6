"""Lab 5 with the reference package switched in: the same names as student.py, as thin adapters
over ``specdecode_ref.trees`` and ``specdecode_ref.verify``."""
from __future__ import annotations

import torch

from specdecode_ref import trees
from specdecode_ref.verify import tree_greedy_verify as _tree_greedy_verify


def tree_depths(parents):
    return trees.tree_depths(parents)


def tree_attention_mask(parents, past_len, dtype=torch.float32):
    return trees.tree_attention_mask(parents, past_len, dtype=dtype)


def tree_position_ids(parents, past_len):
    return trees.tree_position_ids(parents, past_len)


def tree_greedy_verify(target_logits, parents, draft_tokens):
    return _tree_greedy_verify(target_logits, parents, torch.as_tensor(draft_tokens, dtype=torch.long))
