"""BlockManager: slots in fixed-size blocks, lookahead for drafts, trim, free, and its invariants."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from specdecode_ref.serving.blocks import BlockManager, blocks_for


def req(rid, computed=0):
    return SimpleNamespace(request_id=rid, num_computed_tokens=computed)


def test_allocate_lookahead_trim_free():
    bm = BlockManager(num_blocks=6, block_size=4)
    a = req("a")
    assert len(bm.allocate_slots(a, 5)) == 2  # a 5-token prompt: 2 blocks
    a.num_computed_tokens = 5
    assert len(bm.allocate_slots(a, 1, num_lookahead_tokens=4)) == 1  # 5 + 1 + 4 = 10 slots: 3 blocks
    assert bm.num_slots(a) == 12
    a.num_computed_tokens = 7  # one draft accepted: 7 tokens in the cache
    assert len(bm.trim(a)) == 1 and bm.num_slots(a) == 8
    bm.check({"a": 7})
    b = req("b")
    assert bm.allocate_slots(b, 17) is None and "b" not in bm.tables  # 5 blocks > 4 free: nothing taken
    assert len(bm.allocate_slots(b, 16)) == 4 and bm.num_free_blocks == 0
    bm.check({"a": 7, "b": 16})
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 6 and bm.peak_used == 6
    bm.check({})


def test_errors_and_invariants():
    bm = BlockManager(num_blocks=4, block_size=4)
    a = req("a")
    bm.allocate_slots(a, 4)
    with pytest.raises(KeyError, match="freed twice"):
        bm.free(a)
        bm.free(a)
    with pytest.raises(ValueError, match="computed tokens"):
        bm.allocate_slots(req("c", computed=3), 1)  # claims tokens it has no slot for
    with pytest.raises(ValueError, match=">= 0"):
        bm.allocate_slots(req("d"), -1)
    bm.allocate_slots(req("e"), 8)
    with pytest.raises(ValueError, match="cannot grow"):
        bm.trim(req("e"), 9)
    with pytest.raises(AssertionError, match="owns"):
        bm.check({"e": 4})  # holds 4 tokens but owns 2 blocks: a leak
    bm.tables["e"].append(bm.tables["e"][0])  # corrupt: a block listed twice
    with pytest.raises(AssertionError):
        bm.check()
    assert blocks_for(0, 16) == 0 and blocks_for(16, 16) == 1 and blocks_for(17, 16) == 2
