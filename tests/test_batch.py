"""generate_batch: every row is its own request.

Greedy (fp32, the embedded model): each row equals plain decoding of that prompt alone, token for
token, for plain, n-gram and draft-model drafting, with prompts of very different lengths, rows
finishing at different steps and rows accepting 0 and all k drafts in the same step. Sampling
(a tiny model, thousands of rows in one batch): rows follow the target's joint distribution and
do not depend on each other's seeds. Planted bugs (rollback, mask, positions, row bookkeeping)
each make the greedy check fail.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import specdecode_ref.batch as batch
import specdecode_ref.kv as kv
import specdecode_ref.ragged_cache as ragged_cache
from specdecode_ref import autoregressive_generate, chat_ids, generate, generate_batch
from specdecode_ref.ragged_cache import RaggedCache
from specdecode_ref.proposers import Draft, NgramProposer, Proposer, load_proposer
from specdecode_ref.sampling import SamplingParams
from specdecode_ref.measure.harness.workloads import load_workloads

from support import RandomDraftProposer, RandomTreeProposer, assert_law, chi2_pvalue, exact_joint, make_tiny_llama, plant

NEW = 16


# --- fixtures: three prompts of very different lengths and their plain greedy continuations ----

@pytest.fixture(scope="module")
def prompts(embedded):
    _, tok = embedded
    code = load_workloads(["code"], per_category=2)["code"][1]["messages"]
    return [
        torch.tensor(tok.encode("Once upon a time, in a small village by the sea,")),  # no chat template
        chat_ids(tok, code),  # ~100 tokens, input-grounded
        chat_ids(tok, "Repeat exactly: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat."),
    ]


@pytest.fixture(scope="module")
def budgets():
    return [NEW, NEW - 6, NEW - 3]  # rows finish at different steps


@pytest.fixture(scope="module")
def references(embedded, prompts, budgets):
    model, _ = embedded
    return [autoregressive_generate(model, p, max_new_tokens=m).tokens.tolist() for p, m in zip(prompts, budgets)]


def mismatched_rows(model, prompts, budgets, references, proposer=None, **kw) -> list:
    results = generate_batch(model, prompts, proposer=proposer, max_new_tokens=budgets, **kw)
    return [i for i, (r, ref) in enumerate(zip(results, references)) if r.tokens.tolist() != ref]


# --- greedy: every row equals plain decoding of its prompt alone -----------------------------

@pytest.mark.embedded
@pytest.mark.parametrize("name", ["plain", "ngram", "draft"])
def test_greedy_rows_equal_plain_decoding(embedded, prompts, budgets, references, name):
    model, _ = embedded
    proposer = {"plain": lambda: None, "ngram": lambda: NgramProposer(k=4),
                "draft": lambda: load_proposer("draft", model, k=3)}[name]()
    results = generate_batch(model, prompts, proposer=proposer, max_new_tokens=budgets)
    for i, (r, ref) in enumerate(zip(results, references)):
        assert r.tokens.tolist() == ref, f"row {i} ({name}) differs from plain decoding"
        assert len(r.token_kinds) == len(ref) and r.stats.new_tokens == len(ref)
        assert r.stats.emitted == len(ref) - 1  # the prefill's token is not a step's
        if name == "plain":
            assert r.stats.steps == len(ref) - 1 and r.stats.drafted == 0
    if name != "plain":
        assert sum(r.stats.accepted for r in results) > 0  # speculation actually happened


@pytest.mark.embedded
def test_eos_mid_batch(embedded, prompts, budgets, references):
    """A row that emits the EOS id stops there (EOS included) while the others go on."""
    model, _ = embedded
    eos = references[2][5]  # a token that row 2 emits at its 6th step
    # Greedy decoding with an EOS id is plain decoding cut after the first EOS.
    refs = [ref[: ref.index(eos) + 1] if eos in ref else ref for ref in references]
    assert len(refs[2]) <= 6 and any(len(r) == m for r, m in zip(refs, budgets))  # someone outlives it
    for proposer in (None, NgramProposer(k=4)):
        results = generate_batch(model, prompts, proposer=proposer, max_new_tokens=budgets, eos_token_id=eos)
        for i, (r, ref) in enumerate(zip(results, refs)):
            assert r.tokens.tolist() == ref, f"row {i}"
            assert r.finish_reason == ("eos" if ref[-1] == eos else "length")


class OracleOrGarbage(Proposer):
    """Drafts the true continuation for prompts in ``oracle`` (all k accepted) and a wrong token
    for the others (0 accepted): ragged acceptance within every step."""

    def __init__(self, k, continuations: dict, oracle: set):
        super().__init__(k)
        self.continuations, self.oracle = continuations, oracle

    def propose(self, state):
        key = tuple(state.token_list[: state.prompt_len])
        done = len(state.token_list) - state.prompt_len
        true = self.continuations[key][done: done + self.k]
        toks = true if key in self.oracle else [(t + 1) % 49152 for t in true]
        return Draft(torch.tensor(toks, dtype=torch.long))


@pytest.fixture(scope="module")
def ragged(prompts, budgets, references):
    """A proposer accepting all k drafts on rows 0 and 2 and none on row 1."""
    conts = {tuple(p.tolist()): ref for p, ref in zip(prompts, references)}
    return lambda: OracleOrGarbage(3, conts, {tuple(prompts[0].tolist()), tuple(prompts[2].tolist())})


@pytest.mark.embedded
def test_rows_accept_zero_and_all_in_the_same_step(embedded, prompts, budgets, references, ragged):
    model, _ = embedded
    results = generate_batch(model, prompts, proposer=ragged(), max_new_tokens=budgets)
    for i, (r, ref) in enumerate(zip(results, references)):
        assert r.tokens.tolist() == ref, f"row {i}"
    # The first step: rows 0 and 2 accepted all 3 drafts, row 1 none.
    assert [r.stats.accepted_lengths[0] for r in results] == [3, 0, 3]
    assert results[1].stats.accepted == 0 and results[1].stats.drafted > 0
    assert all(a == d for a, d in zip(results[0].stats.accepted_lengths, results[0].stats.draft_lengths))


@pytest.mark.embedded
def test_sampled_rows_equal_generate_with_row_seed(embedded, prompts):
    """Row i draws exactly what generate(prompt_i, seed=seed + i) draws, the draft model's q included."""
    model, _ = embedded
    s = SamplingParams(temperature=0.8, top_k=20)
    make = lambda: load_proposer("draft", model, k=3)  # noqa: E731
    results = generate_batch(model, prompts, proposer=make(), max_new_tokens=10, sampling=s, seed=11)
    for i, r in enumerate(results):
        ref = generate(model, prompts[i], proposer=make(), max_new_tokens=10, sampling=s, seed=11 + i)
        assert r.tokens.tolist() == ref.tokens.tolist(), f"row {i}"


# --- sampling: the target distribution, independent rows (a tiny model, many rows) ----------

@pytest.fixture(scope="module")
def small_vocab_model():
    return make_tiny_llama(vocab_size=6, sharpness=3.0, seed=2)


def joint_counts(model, prompt, factory, sampling, n, steps=3, seed=0):
    results = generate_batch(model, [prompt] * n, proposer=factory(), max_new_tokens=steps, sampling=sampling, seed=seed)
    v = model.config.vocab_size
    counts = np.zeros(v ** steps)
    for r in results:
        counts[int(np.ravel_multi_index(r.tokens.tolist(), (v,) * steps))] += 1
    return counts, results


SAMPLED_CASES = [("plain", lambda: None, SamplingParams(temperature=1.0), "leaked_top_k"),
                 ("ngram", lambda: NgramProposer(k=3, min_n=1), SamplingParams(temperature=1.0), "resample_from_p"),
                 ("random_q", lambda: RandomDraftProposer(3, 6), SamplingParams(temperature=0.8), "resample_from_p"),
                 ("sampled_tree", lambda: RandomTreeProposer(6), SamplingParams(temperature=0.9), "resample_from_p")]


@pytest.mark.parametrize("factory,sampling,bug", [
    pytest.param(f, s, b, id=f"{name}-{'planted-' + b if b else 'correct'}")
    for name, f, s, twin in SAMPLED_CASES for b in (None, twin)])
def test_sampled_rows_follow_target_joint(small_vocab_model, factory, sampling, bug, monkeypatch):
    """Each case, and its twin with a bug planted (tests/support.plant) at the same size."""
    plant(monkeypatch, bug)
    prompt = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    counts, _ = joint_counts(small_vocab_model, prompt, factory, sampling, n=3000)
    assert_law(chi2_pvalue(counts, exact_joint(small_vocab_model, prompt, 3, sampling)), bug)


@pytest.mark.parametrize("factory", [lambda: None, lambda: NgramProposer(k=3), lambda: RandomDraftProposer(3, 64),
                                     lambda: RandomTreeProposer(64)])
def test_sampled_rows_equal_generate_tiny(tiny_model, factory):
    prompts = [torch.tensor([1, 2, 3, 1, 2, 3, 1]), torch.tensor([5]), torch.tensor([7, 8, 9, 10, 7, 8])]
    s = SamplingParams(temperature=1.0, top_p=0.9)
    results = generate_batch(tiny_model, prompts, proposer=factory(), max_new_tokens=[15, 9, 12], sampling=s, seed=3)
    for i, (r, m) in enumerate(zip(results, [15, 9, 12])):
        ref = generate(tiny_model, prompts[i], proposer=factory(), max_new_tokens=m, sampling=s, seed=3 + i)
        assert r.tokens.tolist() == ref.tokens.tolist(), f"row {i}"


def test_sampled_batch_with_shared_generator_fails(small_vocab_model, monkeypatch):
    """Planted: every row draws from row 0's generator. Rows are then not independent requests and
    row i no longer equals generate(seed=i); the joint test alone would not notice, the per-row
    equality does."""
    prompt = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    s = SamplingParams(temperature=1.0)
    real = batch.verify_rows
    monkeypatch.setattr(batch, "verify_rows", lambda logits, drafts, sampling, gens, *rest: real(
        logits, drafts, sampling, [gens[0]] * len(gens), *rest))
    res = generate_batch(small_vocab_model, [prompt] * 8, max_new_tokens=4, sampling=s, seed=0)
    alone = [generate(small_vocab_model, prompt, max_new_tokens=4, sampling=s, seed=i).tokens.tolist() for i in range(8)]
    assert [r.tokens.tolist() for r in res] != alone


def test_rows_are_independent(small_vocab_model):
    """Changing one row's seed (or its neighbour's prompt) leaves every other row's output alone,
    and the first tokens of neighbouring rows are uncorrelated."""
    prompt, other = torch.tensor([0, 1, 2, 0, 1]), torch.tensor([3, 4, 5, 3, 4, 5, 3, 4, 5, 3])
    s = SamplingParams(temperature=1.0)
    make = lambda: NgramProposer(k=3)  # noqa: E731
    a = generate_batch(small_vocab_model, [prompt, prompt, prompt], make(), 12, s, seed=[5, 6, 7])
    b = generate_batch(small_vocab_model, [prompt, prompt, prompt], make(), 12, s, seed=[99, 6, 7])
    c = generate_batch(small_vocab_model, [other, prompt, prompt], make(), 12, s, seed=[5, 6, 7])
    for x in (b, c):
        assert [r.tokens.tolist() for r in x[1:]] == [r.tokens.tolist() for r in a[1:]]
    assert a[0].tokens.tolist() != b[0].tokens.tolist()
    # Contingency table of (row 2j's first token, row 2j+1's first token) over 2,000 pairs.
    _, results = joint_counts(small_vocab_model, prompt, make, s, n=4000, steps=1)
    first = np.array([int(r.tokens[0]) for r in results]).reshape(-1, 2)
    table = np.zeros((6, 6))
    np.add.at(table, (first[:, 0], first[:, 1]), 1)
    from scipy.stats import chi2_contingency

    keep_r, keep_c = table.sum(1) >= 20, table.sum(0) >= 20
    assert chi2_contingency(table[keep_r][:, keep_c]).pvalue > 1e-3


# --- the ragged cache itself ------------------------------------------------------------------

def test_ragged_cache_rollback_and_compaction_match_fresh_rows(tiny_model):
    """After rollback, compaction and a row leaving, each row's next logits equal a fresh forward
    of that row alone."""
    rows = [[1, 2, 3, 4, 5, 6, 7], [9, 8], [5, 5, 6, 1]]
    cache = RaggedCache(tiny_model, 3)
    cache.forward(rows)
    extra = [[10, 11, 12], [13], [14, 15]]
    cache.forward(extra)
    cache.rollback([8, 2, 5])  # keep one, none, one of the new tokens
    kept = [rows[0] + [10], rows[1], rows[2] + [14]]
    assert cache.holes() > 0
    cache.compact()
    assert cache.num_slots == max(len(k) for k in kept) and cache.holes() < 0.5
    cache.select_rows([2, 0])
    out = cache.forward([[3], [4]])
    for b, (ids, nxt) in enumerate([(kept[2], 3), (kept[0], 4)]):
        fresh = tiny_model(input_ids=torch.tensor([ids + [nxt]])).logits[0, -1]
        torch.testing.assert_close(out.logits[b, -1], fresh, rtol=1e-4, atol=1e-4)


def test_bad_inputs(tiny_model):
    ok = torch.tensor([1, 2, 3])
    with pytest.raises(ValueError, match="empty"):
        generate_batch(tiny_model, [])
    with pytest.raises(ValueError, match="prompt 1: the prompt is empty"):
        generate_batch(tiny_model, [ok, torch.tensor([], dtype=torch.long)])
    with pytest.raises(ValueError, match="prompt 2: .*context window"):
        generate_batch(tiny_model, [ok, ok, torch.zeros(250, dtype=torch.long)], max_new_tokens=10)
    with pytest.raises(ValueError, match="prompt 0: .*integer"):
        generate_batch(tiny_model, [torch.tensor([1.0, 2.0]), ok])
    with pytest.raises(ValueError, match="prompt 1: .*token ids"):
        generate_batch(tiny_model, [ok, torch.tensor([1, 999])])
    with pytest.raises(TypeError, match="list"):
        generate_batch(tiny_model, torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="seeds"):
        generate_batch(tiny_model, [ok, ok], seed=[1, 2, 3])
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_batch(tiny_model, [ok, ok], max_new_tokens=[3])


@pytest.mark.embedded
@pytest.mark.parametrize("name", ["medusa", "eagle", "pard"])
def test_rows_draft_what_each_request_drafts_alone(embedded, prompts, budgets, name):
    """Drafters that read the target's hidden states get each row's own (its prompt's columns in
    the padded prefill, its root and accepted path after each step): every row then drafts and
    accepts exactly what ``generate`` does for that request alone (fp32), tree or chain."""
    model, _ = embedded
    k = {"medusa": 8, "eagle": 2, "pard": 2}[name]  # fixed sizes: a sized drafter could stand aside here
    rows = generate_batch(model, prompts, proposer=load_proposer(name, model, k=k), max_new_tokens=budgets)
    for p, m, row in zip(prompts, budgets, rows):
        alone = generate(model, p, proposer=load_proposer(name, model, k=k), max_new_tokens=m)
        assert row.tokens.tolist() == alone.tokens.tolist()
        assert (row.stats.drafted, row.stats.accepted_lengths) == (alone.stats.drafted, alone.stats.accepted_lengths)


def _tree_logits_alone(model, prompt, tree_ids, parents):
    """A tree scored after its prompt in one request's own cache, as generate() scores it."""
    from specdecode_ref import kv, trees

    cache = kv.new_cache(model)
    out = model(input_ids=prompt[None, :-1], past_key_values=cache, use_cache=True)
    past = prompt.numel() - 1
    ids = torch.cat([prompt[-1:], torch.tensor(tree_ids)])[None]
    return model(input_ids=ids, past_key_values=out.past_key_values, use_cache=True,
                 attention_mask=trees.tree_attention_mask(parents, past),
                 position_ids=trees.tree_position_ids(parents, past)).logits[0]


def test_each_row_scores_its_tree_as_one_request_would(tiny_model):
    """Rows of different lengths, two different trees and a chain in ONE batched forward: every
    row's logits (root and every node) equal that request's own tree forward. This is the
    property that makes tree rows exact; the planted twin below breaks it."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 64, (n,), generator=g) for n in (7, 3, 11)]
    row_trees = [[-1, -1, 0, 0, 1, 2], [-1, 0, 1], [-1, -1, -1, 0, 3]]  # the middle one is a chain
    tree_ids = [torch.randint(0, 64, (len(t),), generator=g).tolist() for t in row_trees]

    def batched():
        cache = RaggedCache(tiny_model, len(prompts))
        cache.forward([p[:-1].tolist() for p in prompts])
        out = cache.forward([[int(p[-1])] + ids for p, ids in zip(prompts, tree_ids)],
                            parents=[ragged_cache.row_parents(1, t) for t in row_trees])
        return [out.logits[b, out.logits.shape[1] - len(t) - 1:] for b, t in enumerate(row_trees)]

    with torch.no_grad():
        alone = [_tree_logits_alone(tiny_model, p, ids, t) for p, ids, t in zip(prompts, tree_ids, row_trees)]
        rows = batched()
        for b in range(len(prompts)):
            torch.testing.assert_close(rows[b], alone[b], atol=1e-4, rtol=1e-4)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ragged_cache, "ragged_tree_attention_mask", _tree_mask_as_chain)
            planted = batched()
    # With cousins visible, some node of each real tree reads the wrong keys.
    assert all(not torch.allclose(planted[b], alone[b], atol=1e-3) for b in (0, 2))
    torch.testing.assert_close(planted[1], alone[1], atol=1e-4, rtol=1e-4)  # a chain has no cousins


_real_row_hidden_states = batch.row_hidden_states


def _hidden_one_position_late(hidden_states, row, length):
    """Planted: a row's prompt hidden states are off by one position (each position gets the one
    before it), as when the row's columns are counted from the wrong end of the padding."""
    return tuple(torch.roll(h, 1, dims=0) for h in _real_row_hidden_states(hidden_states, row, length))


@pytest.mark.embedded
def test_planted_hidden_state_slip_is_caught(embedded, prompts, budgets, monkeypatch):
    """The check above has power: with each row's prompt features shifted by one position, the
    batch rows no longer draft what the requests draft alone (the tokens stay exact: lossless)."""
    model, _ = embedded
    monkeypatch.setattr(batch, "row_hidden_states", _hidden_one_position_late)
    rows = generate_batch(model, prompts, proposer=load_proposer("eagle", model, k=2), max_new_tokens=budgets)
    alone = [generate(model, p, proposer=load_proposer("eagle", model, k=2), max_new_tokens=m)
             for p, m in zip(prompts, budgets)]
    assert [r.tokens.tolist() for r in rows] == [a.tokens.tolist() for a in alone]
    assert [r.stats.accepted_lengths for r in rows] != [a.stats.accepted_lengths for a in alone]


# --- planted bugs: each one makes the greedy check fail -----------------------------------------

_real_rollback = RaggedCache.rollback
_real_select_rows = kv.select_rows


def _same_amount_rollback(self, keep):
    """Planted: every row rolls back by row 0's amount."""
    removed = self.lengths[0] - keep[0]
    return _real_rollback(self, [min(max(length - removed, 0), length) for length in self.lengths])


def _mask_without_empty_test(slot_pos, query_pos, dtype):
    """Planted: the mask forgets to hide empty slots (padding and rejected drafts)."""
    b, s = slot_pos.shape
    visible = slot_pos[:, None, :] <= query_pos[:, :, None]
    mask = torch.zeros(b, query_pos.shape[1], s, dtype=dtype)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)[:, None]


def _positions_from_columns(self, query_pos):
    """Planted: no per-row positions; the model numbers the new tokens by padded column."""
    return None


def _select_first_rows(cache, rows):
    """Planted: when rows leave, the cache keeps its first rows instead of the staying ones, so a
    row reads a finished neighbour's keys."""
    _real_select_rows(cache, torch.arange(len(rows)))


def _tree_mask_as_chain(slot_pos, query_pos, new_visible, dtype):
    """Planted: a tree row's nodes follow the ragged rule alone, so they see their cousins."""
    return ragged_cache.ragged_attention_mask(slot_pos, query_pos, dtype)


def _discard_nothing(self, row, slots):
    """Planted: tree nodes off the accepted path stay in the cache (a sibling sits at an accepted
    node's position, so later tokens read it)."""


TREE_PLANTED = {
    "off_path_nodes_kept": ("RaggedCache.discard", _discard_nothing),
}


@pytest.mark.embedded
@pytest.mark.parametrize("bug", sorted(TREE_PLANTED))
def test_planted_tree_bugs_are_caught(embedded, prompts, budgets, references, monkeypatch, bug):
    """Tree drafts in a batch (Medusa's 8-node tree, every row's tree in one forward) are exact
    (test_exactness_matrix) and each of these bugs breaks that."""
    model, _ = embedded
    assert not mismatched_rows(model, prompts, budgets, references, proposer=load_proposer("medusa", model, k=8))
    where, fn = TREE_PLANTED[bug]
    if where == "RaggedCache.discard":
        monkeypatch.setattr(RaggedCache, "discard", fn)
    else:
        monkeypatch.setattr(ragged_cache, where, fn)
    bad = mismatched_rows(model, prompts, budgets, references, proposer=load_proposer("medusa", model, k=8))
    assert bad, f"planted bug {bug!r} went unnoticed"


PLANTED = {
    "same_rollback": ("RaggedCache.rollback", _same_amount_rollback),
    "mask_sees_rejected_and_padding": ("ragged_attention_mask", _mask_without_empty_test),
    "positions_not_per_row": ("RaggedCache.position_ids", _positions_from_columns),
    "row_sees_other_rows_keys": ("kv.select_rows", _select_first_rows),
}


@pytest.mark.embedded
@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_bugs_are_caught(embedded, prompts, budgets, references, ragged, monkeypatch, bug):
    model, _ = embedded
    where, fn = PLANTED[bug]
    if where == "RaggedCache.rollback":
        monkeypatch.setattr(RaggedCache, "rollback", fn)
    elif where == "RaggedCache.position_ids":
        monkeypatch.setattr(RaggedCache, "position_ids", fn)
    elif where == "kv.select_rows":
        monkeypatch.setattr(kv, "select_rows", fn)
    else:
        monkeypatch.setattr(ragged_cache, where, fn)
    # Each bug is caught by its wrong tokens, or by the batch step's own invariant check (a cache
    # row that claims to hold more than was committed); any other crash fails the test.
    try:
        bad = mismatched_rows(model, prompts, budgets, references, proposer=ragged())
    except RuntimeError as err:
        assert "already holds every committed token" in str(err), err
        return
    assert bad, f"planted bug {bug!r} went unnoticed"


# --- the measurement helpers (no timing is asserted) -----------------------------------------

def test_batch_bench_helpers(tiny_model):
    import pandas as pd

    from specdecode_ref.measure import batch_bench

    surface = batch_bench.measure_cost_surface(tiny_model, batch_sizes=(1, 2), ns=(1, 2, 3), context_len=8,
                                               repeats=1, warmup=0)
    assert list(surface.columns[:3]) == ["B", "n", "time_s"] and len(surface) == 6 and (surface.time_s > 0).all()
    # A synthetic surface: flat at B = 1, steep at B = 8; crossover and K per batch follow from it.
    rows = [{"B": b, "n": n, "time_s": (1.0 if b == 1 else 1.0 + 0.5 * (n - 1))} for b in (1, 8) for n in range(1, 10)]
    synthetic = pd.DataFrame(rows)
    table = batch_bench.choose_k_per_batch(synthetic, alpha=0.4, ks=range(1, 9))
    assert table.set_index("B").k.to_dict() == {1: 8, 8: 0}  # K = 0: do not speculate at B = 8
    speed = pd.DataFrame({"B": [1, 2, 4, 8], "speedup": [1.5, 1.2, 1.05, 0.8]})
    assert 4 < batch_bench.crossover(speed) < 8
    assert batch_bench.crossover(speed.assign(speedup=[1.5, 1.4, 1.3, 1.2])) is None
