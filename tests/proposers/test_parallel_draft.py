"""The parallel drafter (PARD) on tiny random Llamas: the training layout computes what inference
computes (and a planted mask slip is caught), conditional drop keeps every chain whole, greedy
output is exact with the cache holding only committed tokens after every step, batched rows draft
what one request drafts, sampled output follows the target (with planted twins), the low-rank
update merges into the same function and survives saving, and bad input is refused clearly."""
import pytest
import torch

from support import RecordsAccepted, assert_cache_is_fresh_prefill, check_joint_law, make_tiny_llama, noisy, twins
from specdecode_ref import SamplingParams, autoregressive_generate, generate, generate_batch, kv
from specdecode_ref.proposers.draft_model import build_draft_model
from specdecode_ref.proposers.parallel_draft import (MaskedEmbedding, ParallelDraftProposer, add_mask_token,
                                                     load_parallel_draft, merge_low_rank, save_parallel_draft)
from specdecode_ref.training import parallel_draft as tp

V = 64
PROMPT = torch.tensor([5, 9, 2, 33, 7])


def parallel_draft(target, positions=4, scale=0.3, seed=0, rank=None):
    """A two-layer draft with a mask token; noise on its layers (never on the shared embeddings and
    head) so that it is right only sometimes; with ``rank``, a random low-rank update too."""
    draft = build_draft_model(target, (0, 1))
    noisy(draft.model.layers, scale, seed)
    masked = add_mask_token(draft, positions)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        masked.mask.add_(torch.randn(masked.mask.shape, generator=g) * 0.3)
    wrapped = None
    if rank is not None:
        wrapped = tp.add_low_rank(draft, rank, 2.0)
        for w in wrapped.values():
            w.B.data.normal_(0, 0.05, generator=g)
    return draft.eval().requires_grad_(False), wrapped


@pytest.fixture(scope="module")
def target2():
    return make_tiny_llama(vocab_size=V, sharpness=1.0, seed=3, layers=2, init_range=0.3)


# --- training computes what inference computes ---------------------------------------------------

@pytest.mark.parametrize("drop", [False, True], ids=["every-entry", "conditional-drop"])
def test_layout_entries_equal_inference_forwards(target2, drop):
    draft, _ = parallel_draft(target2, rank=2)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, V, (14,), generator=g), torch.randint(0, V, (9,), generator=g)]
    gen = torch.Generator().manual_seed(2) if drop else None
    assert tp.layout_error(draft, seqs, [6, 3], 4, (0.7, 0.49, 0.343), gen) < 1e-4


def test_planted_layout_slip_is_caught(target2):
    """Let every mask also see the real token at its own position (the token it must not know):
    the entries no longer equal inference, and the check says so."""
    draft, _ = parallel_draft(target2)
    seqs = [torch.randint(0, V, (12,), generator=torch.Generator().manual_seed(4))]

    lay = tp.pard_layout(seqs, [4], 3, V)
    leak = lay["visible"].clone()
    for c in torch.nonzero(lay["ids"][0] == V).flatten().tolist():
        leak[0, 0, c, int(lay["pos"][0, c])] = True
    assert tp.layout_error(draft, seqs, [4], 3) < 1e-4
    assert tp.layout_error(draft, seqs, [4], 3, visible=leak) > 1e-3


def test_conditional_drop_keeps_chains_and_shares():
    g = torch.Generator().manual_seed(0)
    kept = tp.conditional_drop(200, 4, (0.7, 0.49, 0.343), g)
    assert [len(k) for k in kept] == [140, 98, 69]
    prev = set(range(200))
    for depth in kept:  # an entry at depth j needs its chain's entry at depth j - 1, one position earlier
        assert all(a - 1 in prev for a in depth)
        prev = set(depth)
    assert tp.conditional_drop(5, 3, (0.7,), None) == [[1, 2, 3, 4], [2, 3, 4]]


def test_layout_refuses_bad_input():
    with pytest.raises(ValueError, match="answer start"):
        tp.pard_layout([torch.arange(5)], [5], 3, V)
    with pytest.raises(ValueError, match="positions"):
        tp.pard_layout([torch.arange(5)], [2], 0, V)


# --- the low-rank update ------------------------------------------------------------------------

def test_low_rank_update_merges_into_the_same_function_and_survives_saving(target2, tmp_path, monkeypatch):
    draft, wrapped = parallel_draft(target2, rank=3)
    x = torch.randint(0, V, (1, 10))
    with torch.no_grad():
        wrapped_out = draft.model(input_ids=x).last_hidden_state
    factors = tp.remove_low_rank(draft, wrapped)
    assert not any(isinstance(m, tp.LowRankLinear) for m in draft.modules())
    with torch.no_grad():
        merged_out = draft.model(input_ids=x).last_hidden_state
    torch.testing.assert_close(merged_out, wrapped_out, atol=1e-5, rtol=1e-5)
    # saved (bf16) and merged into a fresh copy of the base layers: the same drafter up to bf16 rounding
    path = save_parallel_draft(factors, draft.get_input_embeddings().mask, 4, 2.0, tmp_path / "p.safetensors")
    base, _ = parallel_draft(target2)
    from specdecode_ref.proposers.shipped import load_weights
    state = load_weights(path)
    merge_low_rank(base, state, 2.0)
    assert set(state) == {"mask"} | {f"{n}.{x}" for n in factors for x in "AB"}
    for name, (a, b) in factors.items():
        w = base.get_submodule(name).weight
        assert w.shape == (b.shape[0], a.shape[1])


# --- the proposer: exact, cache invariant, batch, sampling --------------------------------------

class CheckedParallel(RecordsAccepted, ParallelDraftProposer):
    """After every step the draft cache holds exactly the committed tokens it was fed (no mask
    left in it) and equals a fresh prefill of them."""

    def check(self, state, outcome):
        n = kv.cache_len(self.cache)
        committed_before = len(state.token_list) - len(outcome.emitted)
        assert n == committed_before
        assert_cache_is_fresh_prefill(self.model, self.cache, state.token_list[:n])


@pytest.mark.parametrize("k", [1, 2, 4])
def test_greedy_exact_and_cache_holds_committed_tokens(target2, k):
    ref = autoregressive_generate(target2, PROMPT, max_new_tokens=60).tokens
    seen = set()
    for seed, scale in enumerate((0.0, 0.05, 0.2, 0.6)):
        p = CheckedParallel(parallel_draft(target2, scale=scale, seed=seed)[0], k=k)
        out = generate(target2, PROMPT, p, max_new_tokens=60)
        assert torch.equal(out.tokens, ref)
        seen |= set(p.accepted)
    assert 0 in seen and max(seen) >= min(k, 2), sorted(seen)


def test_tree_is_exact_and_built_from_per_position_candidates(target2):
    draft, _ = parallel_draft(target2, scale=0.05)
    choices = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
    p = ParallelDraftProposer(draft, choices=choices)
    ref = autoregressive_generate(target2, PROMPT, max_new_tokens=40).tokens
    out = generate(target2, PROMPT, p, max_new_tokens=40)
    assert torch.equal(out.tokens, ref)
    # the nodes are the per-position top-k of ONE forward: depth d takes position d - 1's candidates
    from specdecode_ref.proposers import DecodeState
    state = DecodeState(target=target2, sampling=SamplingParams(), generator=None, prompt_len=PROMPT.numel(),
                        token_list=PROMPT.tolist())
    p.begin(state)
    cache_before = kv.cache_len(p.cache)
    d = p.propose(state)
    assert kv.cache_len(p.cache) == cache_before + PROMPT.numel()
    q = ParallelDraftProposer(draft, k=3)
    q.begin(state)
    logits = q.position_logits(PROMPT.tolist(), 3)
    top = logits.topk(2, dim=-1).indices
    expect = [int(top[len(c) - 1, c[-1]]) for c in sorted(choices, key=lambda c: (len(c), c))]
    assert d.tokens.tolist() == expect and d.parents is not None


def test_batched_rows_draft_what_each_request_drafts_alone(target2):
    draft, _ = parallel_draft(target2, scale=0.1)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, V, (n,), generator=g) for n in (4, 9, 6)]
    budgets = [20, 14, 17]
    for kw in ({"k": 3}, {"choices": [(0,), (1,), (0, 0), (0, 0, 0)]}):
        rows = generate_batch(target2, prompts, proposer=ParallelDraftProposer(draft, **kw), max_new_tokens=budgets)
        for prompt, m, row in zip(prompts, budgets, rows):
            alone = generate(target2, prompt, ParallelDraftProposer(draft, **kw), max_new_tokens=m)
            ref = autoregressive_generate(target2, prompt, max_new_tokens=m).tokens
            assert row.tokens.tolist() == alone.tokens.tolist() == ref.tolist()
            assert row.stats.accepted_lengths == alone.stats.accepted_lengths


SMALL = dict(vocab_size=6, sharpness=3.0, seed=2, layers=2)


@pytest.fixture(scope="module")
def small2():
    return make_tiny_llama(**SMALL)


PROMPT6 = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])


def far_parallel_draft(target):
    """A drafter whose q is far from p (heavy noise, a random mask), so that a wrong acceptance
    rule shows in the output's law at the test's size."""
    draft = build_draft_model(target, (1,))
    noisy(draft.model.layers, 2.0, 0)
    masked = add_mask_token(draft, 3)
    with torch.no_grad():
        masked.mask.add_(torch.randn(masked.mask.shape, generator=torch.Generator().manual_seed(5)))
    return draft


@twins("always_accept")
def test_sampled_drafts_follow_the_target(small2, bug, monkeypatch):
    """q_j of position j depends on the context only, so drawing each position from its own q_j and
    rejection sampling keep the target's law; accepting every draft (the planted twin) does not."""
    draft = far_parallel_draft(small2)
    factory = lambda: ParallelDraftProposer(draft, k=3, draft_sampling="sample")  # noqa: E731
    check_joint_law(monkeypatch, bug, small2, PROMPT6, factory, SamplingParams(temperature=0.8, top_p=0.95),
                    batch_twin=True)


@twins("resample_from_p")
def test_greedy_drafts_follow_the_target_when_sampling(small2, bug, monkeypatch):
    """Drafting each position's argmax (q one-hot) at T > 0 is lossless too; resampling from p
    instead of the residual after a rejection (the planted twin) is not."""
    draft = far_parallel_draft(small2)
    factory = lambda: ParallelDraftProposer(draft, k=3, draft_sampling="greedy")  # noqa: E731
    check_joint_law(monkeypatch, bug, small2, PROMPT6, factory, SamplingParams(temperature=0.8, top_p=0.95),
                    batch_twin=True)


def test_each_position_reports_its_own_q(small2):
    """Draft.probs row j is the softmax of position j's logits (not position 0's for every row)."""
    from specdecode_ref.proposers import DecodeState
    from specdecode_ref.sampling import logits_to_probs

    draft = far_parallel_draft(small2)
    p = ParallelDraftProposer(draft, k=3)
    sampling = SamplingParams(temperature=0.8)
    state = DecodeState(target=small2, sampling=sampling, generator=torch.Generator().manual_seed(0),
                        prompt_len=8, token_list=PROMPT6.tolist())
    p.begin(state)
    d = p.propose(state)
    q = ParallelDraftProposer(draft, k=3)
    q.begin(state)
    expected = logits_to_probs(q.position_logits(PROMPT6.tolist(), 3).float(), sampling)
    torch.testing.assert_close(d.probs, expected)
    assert not torch.allclose(d.probs[1], d.probs[0])


@twins("resample_from_p")
def test_sampled_tree_follows_the_target(small2, bug, monkeypatch):
    draft = far_parallel_draft(small2)
    factory = lambda: ParallelDraftProposer(draft, choices=[(0,), (1,), (0, 0), (0, 1)])  # noqa: E731
    check_joint_law(monkeypatch, bug, small2, PROMPT6, factory, SamplingParams(temperature=1.0), batch_twin=True)


# --- clear errors -------------------------------------------------------------------------------

def test_refusals(target2):
    draft, _ = parallel_draft(target2, positions=3)
    with pytest.raises(ValueError, match="trained with 2 mask tokens"):
        ParallelDraftProposer(draft, k=4)
    with pytest.raises(ValueError, match="depth 4"):
        ParallelDraftProposer(draft, choices=[(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)])
    with pytest.raises(ValueError, match="no mask tokens"):
        ParallelDraftProposer(build_draft_model(target2, (0,)), k=2)
    with pytest.raises(ValueError, match="at least 2 positions"):
        MaskedEmbedding(target2.model.embed_tokens, 1)
    with pytest.raises(ValueError, match="greedy"):
        ParallelDraftProposer(draft, choices=[(0,), (1,)], draft_sampling="sample")
    with pytest.raises(ValueError, match="SmolLM2"):
        load_parallel_draft(target2)
