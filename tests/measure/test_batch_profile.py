"""The step profiler of measure.batch_bench: it times generate_batch from outside without changing
what it computes, puts the engine's functions back, and its prediction helpers add up."""
import pandas as pd
import pytest
import torch

from specdecode_ref import batch, generate_batch, ragged_cache
from specdecode_ref.measure import batch_bench
from specdecode_ref.proposers import NgramProposer


def _prompts():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 64, (n,), generator=g) for n in (5, 9, 3)]


def test_profile_leaves_outputs_and_engine_unchanged(tiny_model):
    before = (batch.verify_rows, batch.verify_tree_row, batch._retire, ragged_cache.ragged_attention_mask,
              ragged_cache.ragged_tree_attention_mask, batch.RaggedCache.forward, batch.RaggedCache.layout,
              batch.RaggedCache.rollback, batch.RaggedCache.discard, batch.RaggedCache.maybe_compact)
    prompts = _prompts()
    ref = generate_batch(tiny_model, prompts, proposer=NgramProposer(k=3), max_new_tokens=12)
    prop = NgramProposer(k=3)
    res, prof = batch_bench.profile_generate_batch(tiny_model, prompts, proposer=prop, max_new_tokens=12)
    assert [r.tokens.tolist() for r in res] == [r.tokens.tolist() for r in ref]
    assert [r.stats.accepted_lengths for r in res] == [r.stats.accepted_lengths for r in ref]
    after = (batch.verify_rows, batch.verify_tree_row, batch._retire, ragged_cache.ragged_attention_mask,
              ragged_cache.ragged_tree_attention_mask, batch.RaggedCache.forward, batch.RaggedCache.layout,
              batch.RaggedCache.rollback, batch.RaggedCache.discard, batch.RaggedCache.maybe_compact)
    assert after == before and "batch_proposer" not in vars(prop)
    assert prof["steps"] == len(prof["forwards"]) == max(r.stats.steps for r in res)
    assert all(prof[p] >= 0 for p in batch_bench.STEP_PARTS) and prof["forward"] > 0 and prof["draft"] > 0
    assert sum(prof[p] for p in batch_bench.STEP_PARTS) <= prof["decode_s"] + 1e-9
    widths = [f["width"] for f in prof["forwards"]]
    assert all(1 <= w <= 4 for w in widths)
    # plain decoding: every step one token per row, nothing drafted
    _, plain = batch_bench.profile_generate_batch(tiny_model, prompts, max_new_tokens=6)
    assert plain["draft"] == 0 and {f["width"] for f in plain["forwards"]} == {1}


def test_run_policies_reuses_equal_k_and_predictions_add_up(tiny_model):
    runs = batch_bench.run_policies(tiny_model, _prompts(), (1, 2), {"plain": 0, "fixed": 2, "same": lambda b: 2},
                                    max_new_tokens=6)
    assert list(runs.policy) == ["plain", "fixed", "same"] * 2
    fixed, same = runs[runs.policy == "fixed"], runs[runs.policy == "same"]
    assert list(fixed.decode_s) == list(same.decode_s)  # the same K at the same B: one run
    surface = pd.DataFrame([{"B": b, "n": n, "time_s": b + n} for b in (1, 4) for n in (1, 3)])
    assert batch_bench.surface_time_at(surface, 2, 2) == 4.0  # linear in B and n
    fw = [{"rows": 2, "width": 2}, {"rows": 1, "width": 1}]
    assert batch_bench.predicted_decode_s(surface, fw, overhead_s=0.5) == 4.0 + 2.0 + 0.5
    # a step overhead shared by plain and speculation dilutes the forward's ratio: K can only grow
    flat = pd.DataFrame([{"B": 1, "n": n, "time_s": 1.0 + 0.3 * (n - 1)} for n in range(1, 10)])
    k0 = batch_bench.choose_k_per_batch(flat, 0.6).k.iloc[0]
    k1 = batch_bench.choose_k_per_batch(flat, 0.6, plain_overhead_s=2.0, spec_overhead_s=2.0).k.iloc[0]
    assert k1 >= k0


def test_run_policies_over_the_whole_pool_decodes_every_prompt_at_every_batch_size(tiny_model, monkeypatch):
    prompts = [torch.arange(n) % 50 for n in (5, 9, 3, 7)]
    calls = []
    real = batch_bench.profile_generate_batch

    def recording(model, batch_prompts, proposer=None, **kwargs):
        calls.append((len(batch_prompts), "plain" if proposer is None else proposer.k))
        return real(model, batch_prompts, proposer=proposer, **kwargs)

    monkeypatch.setattr(batch_bench, "profile_generate_batch", recording)
    runs = batch_bench.run_policies(tiny_model, prompts, (1, 2, 4), {"plain": 0, "fixed": 2}, max_new_tokens=5, rows=4)
    for b in (1, 2, 4):
        for policy in ("plain", "fixed"):
            r = runs[(runs.B == b) & (runs.policy == policy)].iloc[0]
            assert len(r.row_decode_s) == len(r.tokens_by_row) == 4  # every prompt, whatever the batch size
            assert r.tokens == sum(len(t) for t in r.tokens_by_row)
            assert sum(r.accepted_by_row, []) == r.accepted_lengths and len(r.drafted_by_row) == 4
    alone = [generate_batch(tiny_model, [p], max_new_tokens=5)[0].tokens.tolist() for p in prompts]
    for policy in ("plain", "fixed"):
        assert runs[(runs.B == 2) & (runs.policy == policy)].iloc[0].tokens_by_row == alone  # in the pool's order
    # interleaved batch by batch, and the order alternates (plain first, then fixed first, ...)
    assert len(calls) == 4 * 2 + 2 * 2 + 1 * 2
    assert [c[1] for c in calls[:4]] == ["plain", 2, 2, "plain"]
    # a separate proposer for one label is its own run, even at the same K
    calls.clear()
    batch_bench.run_policies(tiny_model, prompts, (2,), {"a": 2, "b": 2}, max_new_tokens=5, rows=4,
                             proposer_for={"b": lambda k: NgramProposer(k=k, max_n=1)})
    assert len(calls) == 2 * 2  # both labels on both batches
    with pytest.raises(ValueError, match="multiple of every batch size"):
        batch_bench.run_policies(tiny_model, prompts, (3,), {"plain": 0}, rows=4)


def test_a_surface_made_non_decreasing_keeps_rising_points_and_flattens_dips():
    raw = pd.DataFrame([{"B": b, "n": n, "time_s": t} for b, ts in ((1, (1.0, 1.2, 1.1, 1.5)), (2, (1.0, 2.0, 3.0, 4.0)))
                        for n, t in zip((1, 2, 4, 6), ts)])
    fixed = batch_bench.non_decreasing_in_n(raw)
    one = fixed[fixed.B == 1].time_s.tolist()
    assert one == sorted(one) and one[0] == 1.0 and one[-1] == 1.5 and abs(one[1] - 1.15) < 1e-12  # the dip pooled
    assert fixed[fixed.B == 2].time_s.tolist() == [1.0, 2.0, 3.0, 4.0] and fixed.attrs["dips"] == 2
    assert (fixed.relative == fixed.time_s / 1.0).all()


def test_measure_speculation_reports_the_iid_alpha(tiny_model):
    df = batch_bench.measure_speculation(tiny_model, _prompts(), "ngram", batch_sizes=(2,), k=3, max_new_tokens=8,
                                         repeats=1)
    # accepted / tested >= accepted / drafted: positions after a rejection were never tested
    assert (df.alpha >= df.acceptance_rate - 1e-12).all() and df.alpha.between(0, 1).all()


def test_batch_against_one_at_a_time_decodes_the_same_tokens(tiny_model):
    df = batch_bench.batch_against_one_at_a_time(tiny_model, _prompts(), max_new_tokens=5, repeats=2)
    assert len(df) == 2 and df.same_tokens.all() and (df.speedup > 0).all()
    assert 0 < df.prefill_padding.iloc[0] < 1  # prompts of 5, 9 and 3 tokens padded to 9
    assert (df[list(batch_bench.STEP_PARTS)] >= 0).all().all()
