"""A padded KV cache for many requests of different lengths (generate_batch, the scheduler, the
batched draft model).

How the ragged batch sits in the cache (the design choice). A paged KV cache (vLLM
``vllm/v1/core/kv_cache_manager.py`` allocates blocks, ``vllm/v1/worker/block_table.py`` maps
each request's positions to physical slots; transformers ``generation/continuous_batching/cache.py``
``PagedAttentionCache`` does the same with read/write indices) needs an attention kernel that
reads keys through a block table. On this CPU, with transformers' stock ``DynamicCache`` and the
eager/SDPA attention, the practical choice is a *padded* cache: one ``[B, heads, S, head_dim]``
tensor per layer, where every slot s of row b carries the *position* of the key it holds,
``slot_pos[b, s]`` (``EMPTY_SLOT``, -1, for an empty slot: padding, a rejected draft, a finished neighbour's
column). Then one rule gives the 4-D attention mask: a query of row b at position p sees exactly
the slots of row b with ``0 <= slot_pos <= p``. That single rule hides left padding, hides
rejected drafts after rollback, and is causal inside the step; position ids are per row (the
row's own length), so rotary embeddings match what the request would see alone. Rollback is
bookkeeping only (mark slots with ``slot_pos >= keep`` empty, no copy, like vLLM's rollback of
``num_computed_tokens``); new tokens are appended at the end for all rows, so holes accumulate and
the cache is *compacted* (each row's live slots gathered to the front) when more than half of
it is holes. Finished rows are removed from the batch dimension. transformers' cache API stays
inside kv.py (``select_rows``, ``gather_slots``, ``crop_to``).
"""
from __future__ import annotations

import time

import torch

from . import kv, trees
from .masks import ragged_attention_mask, ragged_tree_attention_mask

# A slot of the cache that holds no key (padding, a rejected draft, a finished neighbour's column);
# in a layout of new tokens, a padding column.
EMPTY_SLOT = -1

# Compact the cache when more than this share of its slots are holes.
COMPACT_FRACTION = 0.5


def left_pad_layout(rows_ids: list, lengths: list, pad_token_id: int = 0, device=None):
    """Left-pad each row's new tokens into ids [B, N] (N = the longest row); query positions [B, N]
    continue each row at its own length ``lengths[b]`` (EMPTY_SLOT marks padding)."""
    n = max(len(r) for r in rows_ids)
    ids = torch.full((len(rows_ids), n), pad_token_id, dtype=torch.long)
    pos = torch.full((len(rows_ids), n), EMPTY_SLOT, dtype=torch.long)
    for b, row in enumerate(rows_ids):
        if len(row):
            ids[b, n - len(row):] = torch.as_tensor(row, dtype=torch.long)
            pos[b, n - len(row):] = torch.arange(lengths[b], lengths[b] + len(row))
    return ids.to(device), pos.to(device)


def row_parents(num_pending: int, tree_parents) -> torch.Tensor:
    """The parents of a row's new tokens (LongTensor [num_pending + n], ``trees.ROOT`` first): the
    ``num_pending`` committed tokens not yet in the cache as a chain, then a draft tree hanging
    from the last of them (its root, the last committed token). ``tree_parents``: the draft's
    ``Draft.parents`` [n] (``trees.ROOT`` for the root's children)."""
    tree_parents = trees.validate_parents(tree_parents)
    chain = torch.arange(num_pending, dtype=torch.long) - 1
    below = torch.where(tree_parents == trees.ROOT, num_pending - 1, tree_parents + num_pending)
    return torch.cat([chain, below])


def tree_layout(rows_parents: list, lengths: list, width: int, device=None):
    """Positions and visibility of left-padded new tokens when rows hold trees.

    rows_parents: per row the parents of its new tokens (``row_parents``; a row of m tokens
    without a tree passes ``trees.chain_parents(m)``). Returns (query positions [B, width]: row b's
    token at depth d from its first new token sits at ``lengths[b] + d``, EMPTY_SLOT for padding;
    visibility [B, width, width]: a token sees itself and its ancestors, a padding column itself).
    """
    pos = torch.full((len(rows_parents), width), EMPTY_SLOT, dtype=torch.long)
    visible = torch.eye(width, dtype=torch.bool).repeat(len(rows_parents), 1, 1)
    for b, parents in enumerate(rows_parents):
        m = len(parents)
        if m == 0:
            continue
        depth = trees.tree_depths(parents) - 1  # the first new token is at depth 0
        pos[b, width - m:] = lengths[b] + depth
        visible[b, width - m:, width - m:] = trees.ancestor_matrix(parents)
    return pos.to(device), visible.to(device)


def rollback_slot_positions(slot_pos: torch.Tensor, keep: list) -> torch.Tensor:
    """Row b keeps positions 0..keep[b]-1: every slot holding a later position becomes empty (EMPTY_SLOT).
    slot_pos: LongTensor [B, S]; returns a new [B, S] tensor (nothing is copied in the cache)."""
    keep_t = torch.as_tensor(keep, dtype=torch.long, device=slot_pos.device)
    return slot_pos.masked_fill(slot_pos >= keep_t[:, None], EMPTY_SLOT)


def compaction_index(slot_pos: torch.Tensor):
    """Where each row's live slots go when the cache is compacted: (index [B, W], new slot_pos
    [B, W]) with W the most live slots of any row; row b's live slots in position order, at the
    end of its row (left padding, index pointing at any slot, slot_pos EMPTY_SLOT)."""
    width = int((slot_pos >= 0).sum(1).max()) if slot_pos.numel() else 0
    sorted_pos, idx = torch.sort(slot_pos, dim=1, stable=True)  # empty (EMPTY_SLOT < 0) first, then by position
    s = slot_pos.shape[1]
    return idx[:, s - width:], sorted_pos[:, s - width:]


class RaggedCache:
    """A padded KV cache for B rows of different lengths (see the module docstring).

    lengths[b]: positions row b holds (its keys sit at positions 0..lengths[b]-1, anywhere in the
    row); slot_pos: LongTensor [B, S] with each slot's position or EMPTY_SLOT.
    """

    def __init__(self, model, num_rows: int, pad_token_id: int = 0):
        self.model = model
        self.cache = kv.new_cache(model)
        self.device = next(model.parameters()).device
        self.dtype = model.get_input_embeddings().weight.dtype
        self.slot_pos = torch.empty(num_rows, 0, dtype=torch.long, device=self.device)
        self.lengths = [0] * num_rows
        self.pad_token_id = pad_token_id
        self.forwards = 0
        self.time_s = 0.0

    @property
    def num_rows(self) -> int:
        return len(self.lengths)

    @property
    def num_slots(self) -> int:
        return int(self.slot_pos.shape[1])

    def layout(self, rows_ids: list):
        return left_pad_layout(rows_ids, self.lengths, self.pad_token_id, self.device)

    def position_ids(self, query_pos: torch.Tensor) -> torch.Tensor:
        """Each row's own positions [B, N] (padding at 0): row b continues at ``lengths[b]``.
        Left to the model, positions would follow the padded column instead, and a row's rotary
        phases would depend on its neighbours' lengths and on the holes of rejected drafts."""
        return query_pos.clamp(min=0)

    def forward(self, rows_ids: list, module=None, parents: list | None = None, **kwargs):
        """Append each row's new tokens (``rows_ids[b]``, a list of ids, may be empty) and run
        ``module`` (default: the model) on them in one forward; returns its output.

        The new tokens are left-padded, so column -1 holds every non-empty row's last token
        (``logits_to_keep=1`` works), and row b's tokens are columns ``N - len(rows_ids[b]):``.
        parents: None when every row's new tokens are a chain (each after the one before);
        otherwise per row None (a chain) or the parents of its new tokens (``row_parents``: a
        draft tree after the committed tokens), and each tree node then sits at its row's length
        plus its depth and sees only its ancestors, as ``trees.tree_attention_mask`` for one request.
        """
        if len(rows_ids) != self.num_rows:
            raise ValueError(f"{len(rows_ids)} rows of ids for a cache of {self.num_rows} rows")
        t0 = time.perf_counter()
        ids, query_pos = self.layout(rows_ids)
        if parents is not None and any(p is not None for p in parents):
            rows_parents = [trees.chain_parents(len(r)) if p is None else trees.validate_parents(p, len(r))
                            for r, p in zip(rows_ids, parents)]
            query_pos, visible = tree_layout(rows_parents, self.lengths, ids.shape[1], self.device)
            slot_pos = torch.cat([self.slot_pos, query_pos], dim=1)
            mask = ragged_tree_attention_mask(slot_pos, query_pos, visible, self.dtype)
        else:
            slot_pos = torch.cat([self.slot_pos, query_pos], dim=1)
            mask = ragged_attention_mask(slot_pos, query_pos, self.dtype)
        module = self.model if module is None else module
        out = module(input_ids=ids, attention_mask=mask, position_ids=self.position_ids(query_pos),
                     past_key_values=self.cache, use_cache=True, **kwargs)
        self.cache = out.past_key_values
        self.slot_pos = slot_pos
        self.lengths = [length + len(row) for length, row in zip(self.lengths, rows_ids)]
        self.forwards += 1
        self.time_s += time.perf_counter() - t0
        return out

    def rollback(self, keep: list) -> None:
        """Row b keeps its first ``keep[b]`` positions; later slots (rejected drafts) become empty."""
        if len(keep) != self.num_rows:
            raise ValueError(f"{len(keep)} rollback lengths for {self.num_rows} rows")
        for b, (k, length) in enumerate(zip(keep, self.lengths)):
            if not 0 <= k <= length:
                raise ValueError(f"row {b}: cannot roll back a row of {length} positions to {k}")
        self.slot_pos = rollback_slot_positions(self.slot_pos, keep)
        self.lengths = list(keep)

    def discard(self, row: int, slots: list) -> None:
        """Mark ``slots`` of ``row`` empty (the tree nodes off the accepted path); ``rollback``
        then sets the row's length. A discarded node's position may lie inside the kept range (a
        sibling of an accepted node sits at its depth), so rollback by position alone would keep it."""
        if slots:
            index = torch.as_tensor(slots, dtype=torch.long, device=self.device)
            self.slot_pos[row, index] = EMPTY_SLOT

    def truncate(self, num_slots: int) -> None:
        """Drop every slot from ``num_slots`` on (all rows): undo forwards, e.g. between timed runs."""
        kv.crop_to(self.cache, num_slots)
        self.slot_pos = self.slot_pos[:, :num_slots]
        self.lengths = [int(x) for x in (self.slot_pos >= 0).sum(1).tolist()]

    def select_rows(self, rows: list) -> None:
        """Keep only the rows ``rows`` (indices into the current rows, in the new order)."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        kv.select_rows(self.cache, idx)
        self.slot_pos = self.slot_pos.index_select(0, idx)
        self.lengths = [self.lengths[r] for r in rows]

    def join(self, other: "RaggedCache") -> None:
        """Append ``other``'s rows after this cache's rows (newly prefilled requests joining a
        running batch): both are left-padded to one width with empty slots, so every row keeps
        its positions and nothing is recomputed. ``other`` should not be used afterwards."""
        if other.model is not self.model:
            raise ValueError("cannot join the caches of two different models")
        kv.concat_rows(self.cache, other.cache)
        width = max(self.num_slots, other.num_slots)
        pad = lambda sp: torch.nn.functional.pad(sp, (width - sp.shape[1], 0), value=EMPTY_SLOT)  # noqa: E731
        self.slot_pos = torch.cat([pad(self.slot_pos), pad(other.slot_pos)], dim=0)
        self.lengths = self.lengths + other.lengths
        self.forwards += other.forwards
        self.time_s += other.time_s

    def holes(self) -> float:
        """Share of the cache's slots that hold no live key."""
        total = self.slot_pos.numel()
        return 0.0 if total == 0 else 1.0 - sum(self.lengths) / total

    def compact(self) -> None:
        """Gather each row's live slots, in position order, to the end of its row (left padding)."""
        idx, self.slot_pos = compaction_index(self.slot_pos)
        kv.gather_slots(self.cache, idx)

    def maybe_compact(self, fraction: float = COMPACT_FRACTION) -> bool:
        if self.num_slots and self.holes() > fraction:
            self.compact()
            return True
        return False



def check_compact_fraction(value) -> float:
    """compact_fraction is a share of the cache's slots: a number in [0, 1] (NaN is not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"compact_fraction must be a number in [0, 1] (the share of holes that triggers "
                         f"compaction), got {value!r}")
    return float(value)
