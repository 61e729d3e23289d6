"""Lab 6 — the batched heart of speculative decoding. Fill in the five functions below (torch only).

A batch holds B requests of different lengths in ONE padded KV cache: each layer keeps a tensor
[B, heads, S, head_dim], and row b's keys sit in its own row, in S **slots**. Which key a slot
holds is recorded in ``slot_pos`` (LongTensor [B, S]): the **position** of that key in its
request (0 for the request's first token), or -1 for an **empty** slot (left padding, a draft
that was rejected, a column another row needed).

One engine step: every row feeds its last committed token plus its draft (rows differ in length),
left-padded into [B, N]; the new keys are appended as N new slots for every row; one target
forward scores all rows; each row is verified on its own; each row is rolled back to its own
committed length. Holes accumulate, so from time to time the cache is compacted.

The rule that makes all of this exact: a query of row b at position p may attend to exactly the
slots of row b whose position is between 0 and p. Each row's output then equals decoding that
request alone.
"""
from __future__ import annotations

import torch


def step_layout(rows_ids, lengths, pad_id=0):
    """Left-pad the rows' new tokens for one batched forward.

    rows_ids: a list of B lists of token ids (rows may differ in length; a row may be empty).
    lengths: a list of B ints, the positions row b already holds (its next token's position).
    Returns ``(ids, query_pos)``, two LongTensors [B, N] with N the longest row: row b's tokens
    fill the LAST len(rows_ids[b]) columns (left padding, ``pad_id`` before them), and
    query_pos[b] holds their positions lengths[b], lengths[b] + 1, ... and -1 in padded columns.
    """
    raise NotImplementedError("step_layout")


def ragged_attention_mask(slot_pos, query_pos, dtype=torch.float32):
    """The additive 4-D attention mask for N new queries per row over S slots.

    slot_pos: LongTensor [B, S], the position held by each slot (the N new slots are the last N
    columns), -1 for empty. query_pos: LongTensor [B, N], each query's position, -1 for padding.
    Returns [B, 1, N, S] of the given floating dtype: 0.0 where query j of row b may attend to
    slot s, ``torch.finfo(dtype).min`` where it may not. A query at position p >= 0 sees exactly
    the slots of its row with 0 <= slot_pos <= p. A padding query (position -1) must still see at
    least one slot (its own, column S - N + j), so that no softmax row is empty.
    """
    raise NotImplementedError("ragged_attention_mask")


def verify_rows(logits, drafts):
    """Greedy verification of every row.

    logits: FloatTensor [B, N, V] from the batched forward of ``step_layout``'s ids, where row b
    fed its last committed token plus drafts[b] (a list of ids, maybe empty): row b's
    len(drafts[b]) + 1 positions are the LAST columns of its row (left padding). Column j of
    those is the target's prediction after the j-th fed token.
    Accept drafts[b][i] while it equals the target's argmax at its position; then emit the
    target's argmax after the last accepted token. Returns ``(emitted, num_accepted)``: emitted
    a list of B lists (accepted drafts, then one target token), num_accepted a list of B ints.
    """
    raise NotImplementedError("verify_rows")


def rollback(slot_pos, keep):
    """Roll every row back to its own committed length.

    slot_pos: LongTensor [B, S]; keep: a list of B ints. Row b keeps positions 0 .. keep[b] - 1;
    every slot of row b holding a position >= keep[b] becomes empty (-1). Returns a NEW tensor
    (leave the argument unchanged); the cache itself is not touched: emptying the slot is enough.
    """
    raise NotImplementedError("rollback")


def compaction_index(slot_pos):
    """Plan a compaction: move each row's live slots (position >= 0) to the end of its row.

    Returns ``(index, new_slot_pos)``, two LongTensors [B, W] with W the largest number of live
    slots in any row: new slot w of row b is old slot index[b, w] (the cache gathers
    keys[b, :, index[b, w]]), and new_slot_pos[b, w] its position. Row b's live slots come in
    increasing position order and fill the LAST columns; the columns before them (fewer live
    slots than W) are empty: new_slot_pos -1, index any valid slot.
    """
    raise NotImplementedError("compaction_index")
