"""Planted bug: position ids count slots (past_len, past_len + 1, ...) instead of depths, so a
node's rotary embedding places it after every earlier node of the tree.

caught by: test_position_ids_example, test_tree_forward_matches_paths, test_position_ids_random_trees
"""
from __future__ import annotations

import torch

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution, one function replaced below


@patch
def tree_position_ids(parents, past_len):
    n = len(_parent_list(parents))
    return (torch.arange(n + 1) + past_len)[None]  # BUG: the slot, not the depth
