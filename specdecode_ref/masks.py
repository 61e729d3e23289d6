"""Attention masks: which cached or new positions each query may attend to.

The engine feeds tokens in four shapes, and each needs its own mask:

* a run of new tokens after a cached prefix (a chain draft, a prefill): the **causal** mask;
* a candidate tree after the prefix: the **tree** mask (a node sees the prefix, the root and its
  own ancestors, never its siblings; see trees.py);
* EAGLE's training-time test, where later unrolled steps read the head's own outputs: the
  **unrolled** mask;
* a batch of rows of different lengths in one padded cache (batch.py): the **ragged** mask, one
  row per request, built from the position each slot holds.

All masks are 4D, ``[1, 1, q, keys]``, keys being the cached positions followed by the new ones.
transformers 5 passes a 4D ``attention_mask`` through untouched as a custom mask
(``masking_utils._preprocess_mask_arguments``). A boolean mask
works with SDPA only; the **additive** form (0 where visible, ``torch.finfo(dtype).min`` elsewhere,
the most negative finite number rather than -inf, so a softmax row never becomes NaN) works with
every attention back-end (eager adds it to the scores, SDPA takes it as ``attn_mask``). Pass the
model's dtype: SDPA wants a float mask in the dtype of its queries.
"""
from __future__ import annotations

import torch

# A tree's mask is built from its structure (ancestors, depths), so it lives in trees.py, which
# imports nothing from here; it is listed with the other masks.
from .trees import tree_attention_mask


def causal_mask(q_len: int, past_len: int, device=None) -> torch.Tensor:
    """Boolean [1, 1, q_len, past_len + q_len]: query i (at position past_len + i) sees keys
    0..past_len + i."""
    rows = torch.arange(q_len, device=device)[:, None] + past_len
    cols = torch.arange(past_len + q_len, device=device)[None, :]
    return (cols <= rows)[None, None]


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean visibility mask (any shape) as an additive float mask of ``dtype``, same shape."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch dtype (the model's), got {dtype!r}")
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)


def causal_additive_mask(q_len: int, past_len: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """[1, 1, q_len, past_len + q_len] in ``dtype``: the additive form of :func:`causal_mask`."""
    return additive_mask(causal_mask(q_len, past_len, device), dtype)


def unrolled_mask(q: int, step: int, device=None) -> torch.Tensor:
    """Boolean [1, 1, q-step+1, keys] for unroll ``step`` >= 2 of training-time test (EAGLE-3's idea).

    Keys are step 1's q entries (real inputs, positions 0..q-1) followed by the entries of steps
    2..step, step s holding q-s+1 entries (index j at position j+s-1). Query j of this step sits at
    position j+step-1, as the head's (step)-th drafted token does at inference: it sees the real
    entries at positions 0..j and, from every unrolled step, its own chain's entry, index j.
    """
    rows = q - step + 1
    j = torch.arange(rows, device=device)[:, None]
    blocks = [torch.arange(q, device=device)[None] <= j]
    for s in range(2, step + 1):
        blocks.append(torch.arange(q - s + 1, device=device)[None] == j)
    return torch.cat(blocks, dim=1)[None, None]


__all__ = ["causal_mask", "additive_mask", "causal_additive_mask", "tree_attention_mask", "unrolled_mask",
           "ragged_attention_mask", "ragged_tree_attention_mask"]


def ragged_attention_mask(slot_pos: torch.Tensor, query_pos: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive 4-D mask [B, 1, N, S] for N new queries per row over S cache slots.

    slot_pos: LongTensor [B, S], the position of the key in each slot (the N new slots last),
        -1 for an empty slot. query_pos: LongTensor [B, N], each query's position, -1 for padding.
    A query at position p of row b sees the slots of row b with 0 <= slot_pos <= p: its own
    committed keys and the draft tokens before it, never padding, a rejected draft or (since each
    row has its own cache row) another request. A padding query sees only its own slot, so no
    softmax row is empty. 0 = visible, ``finfo(dtype).min`` = hidden (finite: no NaN).
    """
    b, s = slot_pos.shape
    n = query_pos.shape[1]
    keys = slot_pos[:, None, :]
    visible = (keys >= 0) & (keys <= query_pos[:, :, None])  # [B, N, S]
    pad_query = query_pos < 0
    if bool(pad_query.any()):
        own = torch.zeros(b, n, s, dtype=torch.bool, device=slot_pos.device)
        j = torch.arange(n, device=slot_pos.device)
        own[:, j, s - n + j] = True
        visible |= own & pad_query[:, :, None]
    mask = torch.zeros(b, n, s, dtype=dtype, device=slot_pos.device)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[:, None]


def ragged_tree_attention_mask(slot_pos: torch.Tensor, query_pos: torch.Tensor, new_visible: torch.Tensor,
                               dtype: torch.dtype) -> torch.Tensor:
    """The ragged mask [B, 1, N, S] when some rows' new tokens form a tree (tree drafts in a batch).

    new_visible: bool [B, N, N], which of its row's new tokens each new token may see (itself and
    its ancestors; the diagonal always, so a padding query still sees its own slot). The ragged
    rule alone would let a node see every new slot at a lower position, its cousins included;
    the tree rule narrows the last N slots to the ancestors. Slots before them (the committed
    keys) follow the ragged rule unchanged.
    """
    mask = ragged_attention_mask(slot_pos, query_pos, dtype)
    n, s = query_pos.shape[1], slot_pos.shape[1]
    mask[:, 0, :, s - n:].masked_fill_(~new_visible.to(mask.device), torch.finfo(dtype).min)
    return mask
