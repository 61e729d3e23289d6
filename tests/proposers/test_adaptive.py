"""Adaptive-K controllers: lossless (only the draft length changes) and moving k the right way."""
import numpy as np
import pytest
import torch

from specdecode_ref import SamplingParams, autoregressive_generate, generate
from specdecode_ref.measure.replay import draft_match_profile, replay
from specdecode_ref.proposers.adaptive import FixedK, GoodputK, HeuristicK
from specdecode_ref.proposers import Draft, NgramProposer, Proposer

RISING = lambda k: 1.0 + 0.1 * k  # noqa: E731  a verify cost that grows with k, so long drafts must earn their keep


def prompts(n=4, length=6, seed=0):
    """Prompts with repetition so the n-gram proposer finds something to draft."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        base = torch.randint(0, 64, (length,), generator=g)
        out.append(torch.cat([base, base, base[:3]]))
    return out


def controllers():
    return [FixedK(NgramProposer(k=3)),
            HeuristicK(NgramProposer(k=2)),
            HeuristicK(NgramProposer(k=2), k_max=5, carry_over=True),
            GoodputK(NgramProposer(k=3), verify_cost=RISING, k_max=8),
            GoodputK(NgramProposer(k=3), verify_cost=1.0, c_step=0.01, k_max=12, halflife=2.0)]


@pytest.mark.parametrize("idx", range(5))
def test_greedy_output_identical_to_plain(tiny_model, idx):
    for prompt in prompts():
        ctrl = controllers()[idx]
        plain = autoregressive_generate(tiny_model, prompt, max_new_tokens=48)
        spec = generate(tiny_model, prompt, proposer=ctrl, max_new_tokens=48)
        assert spec.tokens.tolist() == plain.tokens.tolist()
        assert spec.stats.drafted > 0 and len(ctrl.history) == spec.stats.steps
        assert [r.accepted for r in ctrl.history] == spec.stats.accepted_lengths


def test_wrapper_is_transparent_under_sampling(tiny_model):
    """FixedK only forwards calls: same tokens and counters as the bare proposer, same seed."""
    sp = SamplingParams(temperature=1.0)
    for prompt in prompts(2):
        bare = generate(tiny_model, prompt, proposer=NgramProposer(k=3), max_new_tokens=40, sampling=sp, seed=5)
        wrapped = generate(tiny_model, prompt, proposer=FixedK(NgramProposer(k=3)), max_new_tokens=40,
                           sampling=sp, seed=5)
        assert wrapped.tokens.tolist() == bare.tokens.tolist()
        assert wrapped.stats.accepted_lengths == bare.stats.accepted_lengths


def test_k_actually_changes_and_is_used(tiny_model):
    ctrl = HeuristicK(NgramProposer(k=1))
    prompt = prompts(1)[0]
    generate(tiny_model, prompt, proposer=ctrl, max_new_tokens=60)
    drafted = [r for r in ctrl.history if r.drafted > 0]
    assert len(set(r.k for r in drafted)) > 1  # k moved during the request
    assert all(r.drafted <= r.k for r in ctrl.history)  # and bounded what was drafted


# ---- scripted acceptance: the direction of each controller's response ---------------------

def test_heuristic_rule():
    h = HeuristicK(NgramProposer(k=4))
    h.start_request()
    h.observe(4, 4)
    assert h.k == 6  # all accepted: +2
    h.observe(6, 2)
    assert h.k == 5  # a rejection: -1
    h.observe(0, 0)
    assert h.k == 5  # nothing drafted: no evidence, no change
    h.observe(3, 3)  # a draft cut short (budget) but fully accepted still counts as "all accepted"
    assert h.k == 7
    for _ in range(20):
        h.observe(h.k, 0)
    assert h.k == 1  # floored at 1
    capped = HeuristicK(NgramProposer(k=4), k_max=6)
    capped.start_request()
    for _ in range(5):
        capped.observe(capped.k, capped.k)
    assert capped.k == 6


def test_heuristic_carry_over():
    transient = HeuristicK(NgramProposer(k=3))
    persistent = HeuristicK(NgramProposer(k=3), carry_over=True)
    for h in (transient, persistent):
        h.start_request()
        h.observe(3, 3)
        h.start_request()
    assert transient.k == 3 and persistent.k == 5


def test_goodput_moves_k_with_acceptance():
    g = GoodputK(NgramProposer(k=3), verify_cost=RISING, k_max=12, prior_alpha=0.5)
    g.start_request()
    k0 = g.k
    for _ in range(15):
        g.observe(g.k, g.k)  # every draft accepted
    assert g.k > k0 and g.k == 12
    assert g.rates()[0] > 0.9
    ks = []
    for _ in range(40):
        g.observe(g.k, 0)  # every draft rejected at position 1
        ks.append(g.k)
    assert ks[-1] == 1 and all(b <= a for a, b in zip(ks, ks[1:]))  # k only goes down
    assert g.rates()[0] < 0.1
    high = g.expected_goodput()
    assert high.shape == (12,) and np.argmax(high) == 0


def test_goodput_tracks_position_profile():
    """Position 1 always accepted, position 2 never: the best draft is exactly one token."""
    g = GoodputK(NgramProposer(k=4), verify_cost=RISING, k_max=8)
    g.start_request()
    for _ in range(30):
        g.observe(g.k, min(1, g.k))
    assert g.k == 1 and g.rates()[0] > 0.9
    g2 = GoodputK(NgramProposer(k=4), verify_cost=RISING, k_max=8)
    g2.start_request()
    for _ in range(30):
        g2.observe(g2.k, min(3, g2.k))  # three tokens always pass, the fourth never
    assert g2.k == 3


def test_goodput_prefers_short_drafts_when_verification_is_expensive():
    cheap = GoodputK(NgramProposer(k=3), verify_cost=lambda k: 1.0 + 0.01 * k, k_max=16, prior_alpha=0.7)
    dear = GoodputK(NgramProposer(k=3), verify_cost=lambda k: 1.0 + 0.5 * k, k_max=16, prior_alpha=0.7)
    assert cheap.k > dear.k
    curve = {"ns": [1, 2, 3, 4, 5], "times_s": [10.0, 10.2, 9.8, 10.6, 10.8]}
    from_curve = GoodputK(NgramProposer(k=3), verify_cost=curve, k_max=8)
    assert from_curve.verify_cost(0) == pytest.approx(1.0)
    assert from_curve.verify_cost(2) >= from_curve.verify_cost(1)  # the noisy dip at n=3 is smoothed away


def test_goodput_resets_per_request():
    g = GoodputK(NgramProposer(k=3), verify_cost=RISING, k_max=10)
    g.start_request()
    k0 = g.k
    for _ in range(10):
        g.observe(g.k, g.k)
    assert g.k != k0
    g.start_request()
    assert g.k == k0 and np.all(g.rates() == pytest.approx(0.5))


class AlwaysRight(Proposer):
    """Drafts the target's own greedy continuation (precomputed), whatever k is."""

    def __init__(self, reference, k=1):
        super().__init__(k)
        self.reference = reference

    def propose(self, state):
        pos = state.num_tokens
        return Draft(torch.tensor(self.reference[pos:pos + self.k], dtype=torch.long))


class AlwaysWrong(AlwaysRight):
    def propose(self, state):
        d = super().propose(state)
        return Draft((d.tokens + 1) % 64)


def test_controllers_in_the_engine(tiny_model):
    prompt = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    ref = autoregressive_generate(tiny_model, prompt, max_new_tokens=80)
    reference = prompt.tolist() + ref.tokens.tolist() + [0] * 64
    for make in (lambda p: HeuristicK(p, k_init=2, k_max=16),
                 lambda p: GoodputK(p, verify_cost=RISING, k_init=2, k_max=16)):
        up = make(AlwaysRight(reference))
        out = generate(tiny_model, prompt, proposer=up, max_new_tokens=80)
        assert out.tokens.tolist() == ref.tokens.tolist()
        assert max(up.k_trace) > 2 and up.k_trace[-3] > up.k_trace[0]
        down = make(AlwaysWrong(reference))
        out = generate(tiny_model, prompt, proposer=down, max_new_tokens=80)
        assert out.tokens.tolist() == ref.tokens.tolist()
        assert down.k_trace[-1] == 1


def test_replay_matches_engine(tiny_model):
    """Offline replay of a match profile reproduces the engine's steps exactly (greedy, fp32)."""
    for prompt in prompts(3, seed=1):
        plain = autoregressive_generate(tiny_model, prompt, max_new_tokens=50)
        avail, matched = draft_match_profile(NgramProposer(k=2), prompt.tolist(), plain.tokens.tolist(), k_max=16)
        assert len(avail) == 49 and np.all(matched <= avail)
        for make in (lambda: FixedK(NgramProposer(k=3)), lambda: HeuristicK(NgramProposer(k=2)),
                     lambda: GoodputK(NgramProposer(k=3), verify_cost=RISING, k_max=10)):
            live = make()
            res = generate(tiny_model, prompt, proposer=live, max_new_tokens=50)
            rep = replay(make(), avail, matched, verify_cost=RISING)
            assert rep.records == live.history
            assert rep.steps == res.stats.steps and rep.tokens == len(res.tokens)
            assert rep.tau == pytest.approx(res.stats.mean_accepted_length)
            expected_cost = sum(RISING(r.drafted) if r.drafted else 1.0 for r in live.history)
            assert rep.cost == pytest.approx(expected_cost)


def test_bad_arguments():
    with pytest.raises(TypeError):
        HeuristicK("ngram")
    with pytest.raises(ValueError):
        HeuristicK(NgramProposer(k=2), k_min=0)
    with pytest.raises(ValueError):
        HeuristicK(NgramProposer(k=2), k_min=3, k_max=2)
    with pytest.raises(ValueError):
        GoodputK(NgramProposer(k=2), prior_alpha=1.5)
    with pytest.raises(ValueError):
        GoodputK(NgramProposer(k=2), verify_cost=0.0)
    h = HeuristicK(NgramProposer(k=2))
    with pytest.raises(ValueError):
        h.observe(2, 3)
    with pytest.raises(TypeError):
        draft_match_profile(object(), [1, 2], [3, 4])
