"""KV slot accounting in fixed-size blocks: the memory budget that decides admission and preemption.

A paged KV cache stores each request's keys and values in blocks of ``block_size`` token slots
taken from one shared pool; a request holding n tokens owns ceil(n / block_size) blocks, listed in
its block table. Speculation needs room *ahead* of the committed tokens: a step scores the last
committed token plus k drafted tokens, so before the step the request must own slots for
``num_computed_tokens + num_new_tokens + num_lookahead_tokens`` tokens, where (as in vLLM) the
scheduled drafts are part of ``num_new_tokens`` = 1 + k and ``num_lookahead_tokens`` is extra room
past them, which vLLM reserves only for drafters that write KV for the next step's drafts (EAGLE,
a draft model: ``VllmConfig.num_lookahead_tokens`` = k; 0 for n-gram). After verification the
slots of rejected drafts are given back (:meth:`BlockManager.trim`), so a request never holds a
block that only a rejected draft needed.

Counterparts: vLLM ``vllm/v1/core/block_pool.py`` (``BlockPool``: the free-block queue,
``get_new_blocks``, ``free_blocks``) and ``vllm/v1/core/kv_cache_manager.py``
(``KVCacheManager.allocate_slots(request, num_new_tokens, num_lookahead_tokens=...)`` returns
None when the pool cannot hold the request, ``free`` at finish or preemption). vLLM keeps the
blocks of rejected drafts until the request finishes and overwrites them next step; here they are
given back at once, so the accounting shows exactly what speculation costs in memory.

Every operation checks its input and raises on misuse (never a silent double free or a block owned
twice); :meth:`BlockManager.check` verifies the invariants: every block is free or owned by exactly
one request, free + used == total, and (given each request's computed tokens) no request holds
more or fewer blocks than its tokens need.
"""
from __future__ import annotations

from collections import deque

DEFAULT_BLOCK_SIZE = 16


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``num_tokens`` token slots: ceil(num_tokens / block_size)."""
    if num_tokens < 0:
        raise ValueError(f"a request cannot hold {num_tokens} tokens")
    return -(-num_tokens // block_size)


def _id(request):
    """A request object's id (or the id itself)."""
    return getattr(request, "request_id", request)


class BlockManager:
    """A pool of ``num_blocks`` blocks of ``block_size`` slots and one block table per request.

    A request is any object with ``request_id`` (hashable) and ``num_computed_tokens`` (tokens in
    the cache), like vLLM's ``Request``; the scheduler passes its ``ServingRequest``.
    """

    def __init__(self, num_blocks: int, block_size: int = DEFAULT_BLOCK_SIZE):
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be an int >= 1, got {num_blocks!r}")
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an int >= 1, got {block_size!r}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free: deque = deque(range(num_blocks))  # vLLM's free-block queue
        self._owner: list = [None] * num_blocks  # request id owning each block, or None
        self.tables: dict = {}  # request id -> list of block ids, in position order
        self.peak_used = 0

    # --- queries ---------------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        """Share of the pool in use (vLLM's ``kv_cache_usage``)."""
        return self.num_used_blocks / self.num_blocks

    def num_slots(self, request) -> int:
        """Token slots the request owns (a multiple of block_size)."""
        return len(self.tables.get(_id(request), ())) * self.block_size

    def blocks_needed(self, num_tokens: int) -> int:
        return blocks_for(num_tokens, self.block_size)

    # --- allocation ------------------------------------------------------------------------------

    def allocate_slots(self, request, num_new_tokens: int, num_lookahead_tokens: int = 0) -> list | None:
        """Make the request own slots for ``num_computed_tokens + num_new_tokens +
        num_lookahead_tokens`` tokens; returns the newly taken block ids ([] if it already had
        room), or None (nothing taken) when the pool has too few free blocks: the caller preempts
        another request or leaves this one waiting.

        request.num_computed_tokens: tokens already in the cache; num_new_tokens: tokens this step
        computes (a prompt, or the last committed token plus this step's drafts, as vLLM schedules
        ``num_tokens_with_spec - num_computed_tokens``); num_lookahead_tokens: slots past those, for
        a drafter that writes KV ahead of the target (vLLM: EAGLE and draft models; 0 for n-gram).
        Slots of rejected drafts are given back by :meth:`trim`. Same contract as vLLM's
        ``KVCacheManager.allocate_slots``.
        """
        request_id, num_computed_tokens = _id(request), request.num_computed_tokens
        for name, value in (("num_computed_tokens", num_computed_tokens), ("num_new_tokens", num_new_tokens),
                            ("num_lookahead_tokens", num_lookahead_tokens)):
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        table = self.tables.get(request_id, [])
        if len(table) < self.blocks_needed(num_computed_tokens):
            raise ValueError(f"request {request_id!r} claims {num_computed_tokens} computed tokens but owns "
                             f"{len(table)} blocks of {self.block_size} slots")
        need = self.blocks_needed(num_computed_tokens + num_new_tokens + num_lookahead_tokens) - len(table)
        if need > len(self._free):
            return None
        new = [self._free.popleft() for _ in range(max(need, 0))]
        for b in new:
            if self._owner[b] is not None:
                raise RuntimeError(f"block {b} is in the free queue but owned by request {self._owner[b]!r}")
            self._owner[b] = request_id
        self.tables[request_id] = table + new
        self.peak_used = max(self.peak_used, self.num_used_blocks)
        return new

    def trim(self, request, num_tokens: int | None = None) -> list:
        """Keep only the blocks the request's first ``num_tokens`` slots need (default: its
        ``num_computed_tokens``); free the rest (the slots of rejected drafts). Returns the freed
        block ids."""
        request_id = _id(request)
        num_tokens = request.num_computed_tokens if num_tokens is None else num_tokens
        if request_id not in self.tables:
            raise KeyError(f"request {request_id!r} owns no blocks")
        table = self.tables[request_id]
        keep = self.blocks_needed(num_tokens)
        if keep > len(table):
            raise ValueError(f"request {request_id!r} owns {len(table)} blocks, fewer than the {keep} its "
                             f"{num_tokens} tokens need: trim cannot grow a table (use allocate_slots)")
        freed = table[keep:]
        self.tables[request_id] = table[:keep]
        self._release(request_id, freed)
        return freed

    def free(self, request) -> list:
        """Give back every block of the request (it finished or was preempted). Returns them."""
        request_id = _id(request)
        if request_id not in self.tables:
            raise KeyError(f"request {request_id!r} owns no blocks (freed twice?)")
        freed = self.tables.pop(request_id)
        self._release(request_id, freed)
        return freed

    def _release(self, request_id, blocks: list) -> None:
        for b in blocks:
            if self._owner[b] != request_id:
                raise RuntimeError(f"block {b} is owned by {self._owner[b]!r}, not by request {request_id!r}")
            self._owner[b] = None
            self._free.append(b)

    # --- invariants ------------------------------------------------------------------------------

    def check(self, num_tokens: dict | None = None) -> None:
        """Raise AssertionError unless the pool is consistent: every block is either free (once)
        or owned by exactly one request whose table lists it once; free + used == total.

        num_tokens: optional {request id: tokens it holds}; then each listed request must own
        exactly the blocks those tokens need (more = a leak, e.g. rejected-draft slots never
        given back; fewer = tokens without a slot), and no other request may own any block.
        """
        free = list(self._free)
        assert len(set(free)) == len(free), "a block is in the free queue twice"
        seen = {}
        for rid, table in self.tables.items():
            for b in table:
                assert b not in seen, f"block {b} is owned by both {seen[b]!r} and {rid!r}"
                seen[b] = rid
                assert self._owner[b] == rid, f"block {b} is in {rid!r}'s table but owned by {self._owner[b]!r}"
        assert not set(free) & set(seen), f"blocks {sorted(set(free) & set(seen))} are both free and owned"
        assert len(free) + len(seen) == self.num_blocks, (
            f"{len(free)} free + {len(seen)} used != {self.num_blocks} blocks: some block is lost")
        for b, rid in enumerate(self._owner):
            assert (rid is None) == (b not in seen), f"block {b}: owner {rid!r} disagrees with the tables"
        if num_tokens is not None:
            extra = {rid for rid, table in self.tables.items() if table} - set(num_tokens)
            assert not extra, f"requests {sorted(extra, key=str)} own blocks but hold no tokens (leaked)"
            for rid, n in num_tokens.items():
                have, need = len(self.tables.get(rid, ())), self.blocks_needed(n)
                assert have == need, (f"request {rid!r} holds {n} tokens ({need} blocks of {self.block_size}) "
                                      f"but owns {have} blocks")

    def __repr__(self) -> str:
        return (f"BlockManager({self.num_used_blocks}/{self.num_blocks} blocks used, block_size={self.block_size}, "
                f"{len(self.tables)} requests)")
