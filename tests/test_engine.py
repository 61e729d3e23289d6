"""The draft-verify-rollback engine on a tiny random Llama: exactness, rollback, sampling law."""
import itertools

import pytest
import torch

from support import RandomDraftProposer, check_joint_law, make_tiny_llama, twins
from specdecode_ref import SamplingParams, autoregressive_generate, generate, kv
from specdecode_ref.proposers import Draft, NgramProposer, Proposer


class ScriptedProposer(Proposer):
    """Drafts the target's own greedy continuation, corrupted from a chosen position on, so every
    acceptance length 0..k occurs. Checks that the engine's state matches what it committed."""

    def __init__(self, k, reference, wrong_at):
        super().__init__(k)
        self.reference = reference  # the plain greedy continuation (full sequence)
        self.wrong_at = wrong_at  # iterator of positions where the draft turns wrong
        self.seen = []

    def propose(self, state):
        pos = state.num_tokens
        assert state.token_list == self.reference[:pos], "engine state diverged from greedy"
        truth = self.reference[pos:pos + self.k]
        j = next(self.wrong_at)
        draft = [t if i < j else (t + 1) % 64 for i, t in enumerate(truth)]
        return Draft(torch.tensor(draft, dtype=torch.long))

    def on_verified(self, state, outcome):
        self.seen.append(outcome.num_accepted)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_rollback_at_every_acceptance_length(tiny_model, k):
    prompt = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    ref = autoregressive_generate(tiny_model, prompt, max_new_tokens=60)
    reference = prompt.tolist() + ref.tokens.tolist() + [0] * k
    wrong = itertools.cycle(range(k + 1))  # 0, 1, ..., k correct tokens, then repeat
    proposer = ScriptedProposer(k, reference, wrong)
    out = generate(tiny_model, prompt, proposer=proposer, max_new_tokens=60)
    assert out.tokens.tolist() == ref.tokens.tolist()
    assert set(proposer.seen) == set(range(k + 1))  # every acceptance length was exercised
    assert out.stats.accepted == sum(proposer.seen)


@pytest.mark.parametrize("k,min_n", [(1, 1), (2, 1), (4, 2), (7, 1)])
def test_greedy_ngram_equals_plain(tiny_model, k, min_n):
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        base = torch.randint(0, 64, (6,), generator=g)
        prompt = torch.cat([base, base, base[:3]])  # repetition so the n-gram proposer drafts
        plain = autoregressive_generate(tiny_model, prompt, max_new_tokens=48)
        spec = generate(tiny_model, prompt, proposer=NgramProposer(k=k, min_n=min_n), max_new_tokens=48)
        assert spec.tokens.tolist() == plain.tokens.tolist()
        assert spec.stats.drafted > 0
        assert len(spec.tokens) == 48 and spec.stats.new_tokens == 48


def test_stats_are_consistent(tiny_model):
    prompt = torch.tensor([1, 2, 3, 1, 2, 3, 1, 2])
    r = generate(tiny_model, prompt, proposer=NgramProposer(k=4), max_new_tokens=40)
    s = r.stats
    assert s.emitted + 1 == s.new_tokens == len(r.tokens) == len(r.token_kinds)
    assert s.target_forwards == s.steps + 1  # one prefill, one forward per step
    assert s.accepted == r.token_kinds.count("accepted")
    assert s.mean_accepted_length == pytest.approx(s.emitted / s.steps)
    assert 0 <= s.acceptance_rate <= 1 and s.mean_accepted_length >= 1
    plain = autoregressive_generate(tiny_model, prompt, max_new_tokens=40)
    assert plain.stats.mean_accepted_length == 1.0 and plain.stats.drafted == 0


def test_max_new_tokens_exact_and_eos(tiny_model):
    prompt = torch.tensor([5, 6, 7, 5, 6, 7, 5, 6])
    plain = autoregressive_generate(tiny_model, prompt, max_new_tokens=30)
    for n in [1, 2, 3, 7, 13]:
        r = generate(tiny_model, prompt, proposer=NgramProposer(k=5), max_new_tokens=n)
        assert r.tokens.tolist() == plain.tokens[:n].tolist() and r.finish_reason == "length"
    # Pick a token that appears mid-way as EOS: generation stops right after it, in both engines.
    eos = int(plain.tokens[10])
    first = plain.tokens.tolist().index(eos)
    for proposer in [None, NgramProposer(k=5)]:
        r = generate(tiny_model, prompt, proposer=proposer, max_new_tokens=30, eos_token_id=eos)
        assert r.tokens.tolist() == plain.tokens[: first + 1].tolist() and r.finish_reason == "eos"


def test_kv_crop_matches_fresh_forward(tiny_model):
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7]])
    cache = kv.new_cache(tiny_model)
    tiny_model(input_ids=ids, past_key_values=cache, use_cache=True)
    kv.crop_to(cache, 4)
    assert kv.cache_len(cache) == 4
    after = tiny_model(input_ids=torch.tensor([[9]]), past_key_values=cache, use_cache=True).logits[0, -1]
    fresh = tiny_model(input_ids=torch.tensor([[1, 2, 3, 4, 9]])).logits[0, -1]
    torch.testing.assert_close(after, fresh, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError):
        kv.crop_to(cache, 99)


def test_kv_keep_positions(tiny_model):
    cache = kv.new_cache(tiny_model)
    tiny_model(input_ids=torch.tensor([[1, 2, 3, 8, 4]]), past_key_values=cache, use_cache=True)
    kv.keep_positions(cache, torch.tensor([0, 1, 2, 4]))  # drop the token at position 3
    assert kv.cache_len(cache) == 4
    # Keys carry rotary positions, so only the first three match a fresh [1, 2, 3] prefix exactly.
    fresh = kv.new_cache(tiny_model)
    tiny_model(input_ids=torch.tensor([[1, 2, 3]]), past_key_values=fresh, use_cache=True)
    torch.testing.assert_close(cache.layers[0].keys[..., :3, :], fresh.layers[0].keys)


# --- sampling: the engine's output follows the target's joint distribution --------------------

@pytest.fixture(scope="module")
def small_vocab_model():
    return make_tiny_llama(vocab_size=6, sharpness=3.0, seed=2)


@pytest.mark.parametrize("factory,sampling", [
    (lambda: NgramProposer(k=3, min_n=1), SamplingParams(temperature=1.0)),
    (lambda: RandomDraftProposer(3, 6), SamplingParams(temperature=0.8)),
    (lambda: RandomDraftProposer(2, 6, seed=1), SamplingParams(temperature=1.0, top_k=3)),
])
@twins("resample_from_p")
def test_sampled_generate_follows_target_joint(small_vocab_model, factory, sampling, bug, monkeypatch):
    """Each case, and its twin with the classic bug planted in the engine (resample from p, not the
    residual; drawn as one generate_batch, whose rows equal generate's), at the same size."""
    prompt = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    check_joint_law(monkeypatch, bug, small_vocab_model, prompt, factory, sampling, batch_twin=True)


def test_reference_probs_pin_temperature_then_top_k_then_top_p():
    """The oracle's reference_probs and the package agree, and the cases pin the order: at T = 0.5
    top-p 0.8 keeps {0} (before the temperature it would keep {0, 1}); top-k 2 then top-p 0.6 at
    T = 2 keeps {0} (top-p first, on all four tokens, keeps {0, 1, 2}; top-k 2 then leaves {0, 1})."""
    from support import reference_probs
    from specdecode_ref.sampling import logits_to_probs

    cases = [(torch.tensor([2.0, 1.0, 0.0, -1.0]), SamplingParams(temperature=0.5, top_p=0.8), [1, 0, 0, 0]),
             (torch.tensor([2.0, 1.0, 0.9, 0.8]), SamplingParams(temperature=2.0, top_k=2, top_p=0.6), [1, 0, 0, 0]),
             (torch.tensor([2.0, 1.0, 0.9, 0.8]), SamplingParams(temperature=2.0, top_k=3), [1, 1, 1, 0])]
    for logits, s, kept in cases:
        ref = reference_probs(logits, s)
        assert (ref > 0).long().tolist() == kept, s
        torch.testing.assert_close(logits_to_probs(logits, s).double(), ref, atol=1e-6, rtol=1e-5)
    # the wrong orders keep more: top-p at T = 1, and top-p on the four tokens before top-k
    assert (reference_probs(cases[0][0], SamplingParams(temperature=1.0, top_p=0.8)) > 0).sum() == 2
    assert (reference_probs(cases[1][0], SamplingParams(temperature=2.0, top_p=0.6)) > 0).sum() == 3


def test_same_seed_same_sample(tiny_model):
    prompt = torch.tensor([1, 2, 3, 1, 2])
    s = SamplingParams(temperature=1.0, top_p=0.9)
    a = generate(tiny_model, prompt, proposer=NgramProposer(k=3), max_new_tokens=20, sampling=s, seed=5)
    b = generate(tiny_model, prompt, proposer=NgramProposer(k=3), max_new_tokens=20, sampling=s, seed=5)
    assert a.tokens.tolist() == b.tokens.tolist()


# --- bad input gets a clear error ---------------------------------------------------------------

def test_bad_inputs(tiny_model):
    ok = torch.tensor([1, 2, 3])
    with pytest.raises(ValueError, match="empty"):
        generate(tiny_model, torch.tensor([], dtype=torch.long))
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(tiny_model, ok, max_new_tokens=0)
    with pytest.raises(ValueError, match="context window"):
        generate(tiny_model, torch.zeros(250, dtype=torch.long), max_new_tokens=10)
    with pytest.raises(ValueError, match="context window"):
        generate(tiny_model, torch.zeros(300, dtype=torch.long), max_new_tokens=1)
    with pytest.raises(ValueError, match="k"):
        generate(tiny_model, ok, proposer=NgramProposer(k=0))
    with pytest.raises(ValueError, match="token ids"):
        generate(tiny_model, torch.tensor([1, 999]))
    with pytest.raises(ValueError, match="one request"):
        generate(tiny_model, torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(TypeError):
        generate(tiny_model, ok, sampling=0.7)


class GreedyLiar(Proposer):
    def propose(self, state):
        return Draft(torch.zeros(self.k + 2, dtype=torch.long))


def test_proposer_drafting_more_than_k_is_an_error(tiny_model):
    with pytest.raises(ValueError, match="more than its k"):
        generate(tiny_model, torch.tensor([1, 2, 3]), proposer=GreedyLiar(2), max_new_tokens=10)
