"""Draft-model and early-exit proposers on tiny random Llamas: exactness, cache rollback at every
acceptance length, the sampling law, clear errors, and that training lowers the loss."""
import copy

import pytest
import torch

from support import (RecordsAccepted, assert_cache_is_fresh_prefill, assert_law, check_joint_law, make_tiny_llama,
                     noisy, sampled_joint_pvalue, twins)
from specdecode_ref import SamplingParams, autoregressive_generate, generate, kv
from specdecode_ref.training import distill, train
from specdecode_ref.proposers.draft_model import DraftModelProposer, build_draft_model
from specdecode_ref.masks import causal_mask
from specdecode_ref.proposers.early_exit import EarlyExitProposer, build_adapter
from specdecode_ref.proposers import shipped


def noisy_draft(target, scale=0.6, seed=0, layers=(0, 1, 2, 3)):
    draft = build_draft_model(target, layers)
    noisy(draft.model.layers, scale, seed)  # not the embeddings / head: those are the target's own
    return draft


# --- draft model ---------------------------------------------------------------------------------

class CheckedDraft(RecordsAccepted, DraftModelProposer):
    """Checks after every step that the draft cache equals a fresh prefill of committed tokens."""

    def check(self, state, outcome):
        n = kv.cache_len(self.cache)
        committed_before = len(state.token_list) - len(outcome.emitted)
        assert n == min(committed_before + self.k - 1, committed_before + outcome.num_accepted)
        assert_cache_is_fresh_prefill(self.model, self.cache, state.token_list[:n])


@pytest.mark.parametrize("k", [1, 3, 5])
def test_draft_model_greedy_exact_and_rollback_every_length(target4, k):
    prompt = torch.tensor([5, 9, 2, 33, 7])
    ref = autoregressive_generate(target4, prompt, max_new_tokens=120).tokens
    seen = set()
    for seed, scale in enumerate((0.02, 0.05, 0.1, 0.2, 0.3, 0.6, 1.0)):
        p = CheckedDraft(noisy_draft(target4, scale, seed), k=k)
        out = generate(target4, prompt, p, max_new_tokens=120)
        assert torch.equal(out.tokens, ref)
        seen |= set(p.accepted)
    assert seen == set(range(k + 1)), f"acceptance lengths seen: {sorted(seen)}"


def test_draft_model_identical_draft_accepts_everything(target4):
    draft = build_draft_model(target4, (0, 1, 2, 3))  # the target itself
    out = generate(target4, torch.tensor([1, 2, 3]), DraftModelProposer(draft, k=4), max_new_tokens=41)
    assert out.stats.acceptance_rate == 1.0 and out.stats.steps == 8


def test_draft_model_with_reduced_vocabulary_stays_exact(target4):
    prompt = torch.tensor([4, 8, 15, 16, 23])
    ref = autoregressive_generate(target4, prompt, max_new_tokens=60).tokens
    p = DraftModelProposer(build_draft_model(target4, (0, 1, 2, 3)), k=3, draft_vocab=torch.arange(0, 64, 2))
    out = generate(target4, prompt, p, max_new_tokens=60)
    assert torch.equal(out.tokens, ref)
    assert 0 < out.stats.acceptance_rate < 1  # odd ids can never be drafted


@pytest.fixture(scope="module")
def small_vocab():
    return make_tiny_llama(vocab_size=6, sharpness=3.0, seed=2, layers=2)


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=3)])
@twins("bonus_off_by_one")
def test_draft_model_sampling_follows_target(small_vocab, sampling, bug, monkeypatch):
    draft = noisy_draft(small_vocab, 0.5, 0, (1,))
    prompt = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    check_joint_law(monkeypatch, bug, small_vocab, prompt, lambda: DraftModelProposer(draft, k=2), sampling,
                    batch_twin=True)


def test_draft_model_planted_bug_wrong_q_is_caught(small_vocab):
    """Report a q other than the one the draft was sampled from (here: uniform): the distribution
    test must fail, at the size of test_draft_model_sampling_follows_target. (Dropping q altogether would *not* be a bug: the one-hot rule is exact for
    any draft token, it only accepts less often.)"""

    class WrongQ(DraftModelProposer):
        def propose(self, state):
            d = super().propose(state)
            d.probs = torch.full_like(d.probs, 1.0 / d.probs.shape[-1])
            return d

    draft = noisy_draft(small_vocab, 0.5, 0, (1,))
    prompt = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    p = sampled_joint_pvalue(small_vocab, prompt, lambda: WrongQ(draft, k=2), SamplingParams(temperature=1.0))
    assert_law(p, "uniform q")


def padded_draft(target, rows, seed=0):
    """A draft from the target's family whose embedding matrix is padded to ``rows`` rows (as
    Qwen2.5-0.5B's is to 151,936 against 7B's 152,064), with padding rows the argmax would love."""
    draft = copy.deepcopy(noisy_draft(target, 0.5, seed, (0, 1)))
    draft.resize_token_embeddings(rows, mean_resizing=False)
    n = target.config.vocab_size
    with torch.no_grad():
        head = draft.get_output_embeddings().weight
        head[n:] = head[:n].mean(0) * 50  # a bug that drafted padding ids would show at once
    return draft


@pytest.mark.parametrize("rows", [72, 60])
def test_padded_vocabulary_needs_shared_tokens(target4, rows):
    draft = padded_draft(target4, rows)
    with pytest.raises(ValueError, match="shared_tokens"):
        generate(target4, torch.tensor([1, 2, 3]), DraftModelProposer(draft, k=2), max_new_tokens=4)
    with pytest.raises(ValueError, match="shared_tokens=99"):
        generate(target4, torch.tensor([1, 2, 3]), DraftModelProposer(draft, k=2, shared_tokens=99), max_new_tokens=4)


def test_padded_vocabulary_greedy_exact(target4):
    """Draft with 72 rows, target with 64, ids < 56 shared: greedy output stays the target's and no
    draft ever proposes a padding id."""
    prompt = torch.tensor([5, 9, 2, 33, 7])
    ref = autoregressive_generate(target4, prompt, max_new_tokens=60).tokens
    for rows, shared in ((72, 64), (72, 56)):
        p = DraftModelProposer(padded_draft(target4, rows), k=3, shared_tokens=shared)
        drafted = []
        orig = p.propose
        p.propose = lambda state: drafted.append(orig(state)) or drafted[-1]
        out = generate(target4, prompt, p, max_new_tokens=60)
        assert torch.equal(out.tokens, ref)
        assert all(int(d.tokens.max()) < shared for d in drafted)
        assert out.stats.accepted > 0


@twins("bonus_off_by_one")
def test_padded_vocabulary_sampling_follows_target(small_vocab, bug, monkeypatch):
    draft = padded_draft(small_vocab, 9)
    prompt = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    check_joint_law(monkeypatch, bug, small_vocab, prompt, lambda: DraftModelProposer(draft, k=2, shared_tokens=6),
                    SamplingParams(temperature=1.0), batch_twin=True)


def test_vocabulary_mismatch_is_a_clear_error(target4):
    other = make_tiny_llama(vocab_size=32, seed=1)
    with pytest.raises(ValueError, match="vocabulary"):
        generate(target4, torch.tensor([1, 2, 3]), DraftModelProposer(other, k=2), max_new_tokens=4)


# --- early exit ----------------------------------------------------------------------------------

class CheckedExit(RecordsAccepted, EarlyExitProposer):
    """After every step: the shared cache equals a fresh prefill in *every* layer, and the adapter's
    cache equals a fresh adapter pass over the committed prefix."""

    def check(self, state, outcome):
        ids = torch.tensor([state.token_list[:-1]])
        fresh = kv.new_cache(self.target)
        out = self.target(input_ids=ids, past_key_values=fresh, use_cache=True, output_hidden_states=True)
        assert all(layer.keys.shape[-2] == ids.shape[1] for layer in self.cache.layers)
        for mine, ref in zip(self.cache.layers, fresh.layers):
            torch.testing.assert_close(mine.keys, ref.keys, atol=1e-4, rtol=1e-4)
        n = kv.cache_len(self.adapter_cache)
        committed_before = len(state.token_list) - len(outcome.emitted)
        assert n == len(state.token_list) - 1  # caught up, even after a fully accepted draft
        fresh_a = kv.new_cache()
        h = out.hidden_states[self.L][:, :n]
        self.adapter(h, torch.arange(n)[None], causal_mask(n, 0), self.target, fresh_a)
        torch.testing.assert_close(self.adapter_cache.layers[0].keys, fresh_a.layers[0].keys, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("reuse_kv", [True, False])
@pytest.mark.parametrize("k", [1, 3, 4])
def test_early_exit_greedy_exact_and_rollback_every_length(target4, k, reuse_kv):
    prompt = torch.tensor([5, 9, 2, 33, 7])
    ref = autoregressive_generate(target4, prompt, max_new_tokens=120).tokens
    seen = set()
    for seed, scale in enumerate((0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 1.0)):
        adapter = noisy(build_adapter(target4, 3), scale, seed)
        p = CheckedExit(target4, adapter, k=k, reuse_kv=reuse_kv)
        out = generate(target4, prompt, p, max_new_tokens=120)
        assert torch.equal(out.tokens, ref)
        seen |= set(p.accepted)
    assert seen == set(range(k + 1)), f"acceptance lengths seen: {sorted(seen)}"


def test_early_exit_at_last_layer_is_the_target(target4):
    """Exit at the last layer with the adapter = a copy of the last layer: the draft is the target."""
    p = EarlyExitProposer(target4, build_adapter(target4, 3), k=4)
    # the adapter copies layer 3 and runs after layers 0..2: exactly the target's forward
    out = generate(target4, torch.tensor([1, 2, 3]), p, max_new_tokens=41)
    assert out.stats.acceptance_rate == 1.0


@pytest.mark.parametrize("reuse_kv", [True, False])
@twins("bonus_off_by_one")
def test_early_exit_sampling_follows_target(small_vocab, reuse_kv, bug, monkeypatch):
    adapter = noisy(build_adapter(small_vocab, 1), 0.5, 0)
    prompt = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    factory = lambda: EarlyExitProposer(small_vocab, adapter, k=2, reuse_kv=reuse_kv)  # noqa: E731
    check_joint_law(monkeypatch, bug, small_vocab, prompt, factory, SamplingParams(temperature=1.0))


def test_early_exit_planted_bug_stale_shared_cache_is_caught(target4):
    """Forget to drop rejected drafts from the early layers: the next verification finds layers
    0..L-1 longer than the rest of the cache, and the attention mask no longer fits them."""

    class Stale(EarlyExitProposer):
        def score(self, state, ids):
            saved = kv.crop_layers_to
            kv.crop_layers_to = lambda cache, length, layers: None  # the bug: no crop
            try:
                return super().score(state, ids)
            finally:
                kv.crop_layers_to = saved

    prompt = torch.tensor([5, 9, 2, 33, 7])
    adapter = noisy(build_adapter(target4, 3), 1.0, 0)
    # Without reuse, verification must first drop the drafted entries of layers 0..L-1.
    with pytest.raises(RuntimeError, match="must match the size of tensor"):
        generate(target4, prompt, Stale(target4, adapter, k=3, reuse_kv=False), max_new_tokens=60)


def test_early_exit_errors(target4):
    with pytest.raises(ValueError, match="exit_layer"):
        build_adapter(target4, 4)
    p = EarlyExitProposer(target4, build_adapter(target4, 2), k=2)
    other = make_tiny_llama(vocab_size=64, seed=9, layers=4)
    with pytest.raises(ValueError, match="same model"):
        generate(other, torch.tensor([1, 2]), p, max_new_tokens=3)


# --- training ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_corpus(target4):
    # conftest's corpus with other random prompts (20 unused draws each), on which these training
    # tests' thresholds were set
    g = torch.Generator().manual_seed(0)
    pairs = [(torch.randint(0, 64, (6,), generator=g), torch.randint(0, 64, (20,), generator=g)) for _ in range(48)]
    # self-distilled answers: the target's own greedy continuations of random prompts
    pairs = [(p, autoregressive_generate(target4, p, max_new_tokens=20).tokens) for p, _ in pairs]
    return distill.teacher_pass(target4, pairs, top_k=8, keep_hidden=True, batch_tokens=256)


def test_teacher_pass_shapes(tiny_corpus, target4):
    c = tiny_corpus
    assert len(c) == 48 and c.num_response_tokens == 48 * 20
    i = 0
    assert c.topk_ids[i].shape == (20, 8) and c.hidden[i].shape == (26, 32)
    with torch.no_grad():
        logp = torch.log_softmax(target4(input_ids=c.ids[i][None]).logits[0].float(), -1)
    top = logp[c.start[i] - 1: -1].topk(8, -1)
    assert torch.equal(top.indices.int(), c.topk_ids[i])
    # the answers are the target's greedy tokens, so the top-1 id is the next answer token
    assert torch.equal(c.topk_ids[i][:, 0].long(), c.ids[i][c.start[i]:])


def test_build_corpus_resumes_from_saved_answers(target4, tmp_path, monkeypatch):
    """An interrupted ``train data`` must not regenerate answers it already has: the second call
    generates nothing and gives the same corpus."""
    g = torch.Generator().manual_seed(1)
    calls = []

    def fake_generate(model, tokenizer, conversations, temperature=0.0, **kw):
        calls.append(temperature)
        return [(torch.randint(0, 64, (5,), generator=g), torch.randint(0, 64, (7,), generator=g))
                for _ in conversations]

    monkeypatch.setattr(distill, "generate_responses", fake_generate)
    convs = [[{"role": "user", "content": str(i)}] for i in range(3)]
    first = distill.build_corpus(target4, None, convs, top_k=4, checkpoint_dir=tmp_path)
    assert calls == [0.0, 0.7] and len(list(tmp_path.glob("answers-*.pt"))) == 2
    second = distill.build_corpus(target4, None, convs, top_k=4, checkpoint_dir=tmp_path)
    assert calls == [0.0, 0.7]  # nothing regenerated
    assert all(torch.equal(a, b) for a, b in zip(first.ids, second.ids)) and len(first) == len(second) == 6


def mean(xs):
    return sum(xs) / len(xs)


def test_draft_training_lowers_the_loss(target4, tiny_corpus):
    train_c, hold = tiny_corpus.split(0.2, seed=0)
    draft, res = train.train_draft(target4, train_c, init_layers=(0,), steps=40, lr=3e-3, batch_tokens=256,
                                   holdout=hold)
    print(res.heldout)
    assert res.heldout["after"]["loss"] < 0.95 * res.heldout["before"]["loss"]
    assert mean(res.losses[-5:]) < mean(res.losses[:5])
    assert not any(p.requires_grad for p in draft.parameters())
    # a planted bug, lr = 0, must not pass the same check
    _, flat = train.train_draft(target4, train_c, init_layers=(0,), steps=40, lr=0.0, batch_tokens=256,
                                holdout=hold)
    assert not flat.heldout["after"]["loss"] < 0.95 * flat.heldout["before"]["loss"]


def test_early_exit_training_lowers_the_loss(target4, tiny_corpus):
    train_c, hold = tiny_corpus.split(0.2, seed=0)
    adapters, res = train.train_early_exit(target4, train_c, exits=(1, 2), steps=30, lr=3e-3, batch_tokens=256,
                                           holdout=hold)
    assert sorted(adapters) == [1, 2]
    print(res.heldout)
    assert mean(res.losses[-5:]) < 0.9 * mean(res.losses[:5])
    assert set(res.heldout) == {"1", "2"}


def test_save_and_load_draft_roundtrip(target4, tmp_path):
    from specdecode_ref.proposers import draft_model

    d = noisy_draft(target4, 0.5, 1)
    path = draft_model.save_draft(d, tmp_path / "d.safetensors", {"note": "test"})
    meta = shipped.weights_metadata(path)
    assert meta["init_layers"] == "[0, 1, 2, 3]" and meta["note"] == "test"
    with pytest.raises(ValueError, match="SmolLM2"):
        draft_model.load_draft_model(target4, path)  # shipped loaders refuse a foreign target


# --- reduced draft vocabulary and the exit layer to ship -------------------------------------------

def test_frequent_tokens_and_vocab_head():
    from specdecode_ref.proposers.vocab import VocabHead, coverage, frequent_tokens

    counts = torch.tensor([5, 0, 9, 1, 9, 0])
    ids = frequent_tokens(counts, 2, always=[5])
    assert ids.tolist() == [2, 4, 5]  # ties broken by id; EOS-like ids always kept
    assert coverage(ids, torch.tensor([2, 2, 4, 1])) == 0.75
    w = torch.randn(6, 3)
    head = VocabHead(w, ids)
    h = torch.randn(3)
    sub = head.logits(h)
    torch.testing.assert_close(sub, (w @ h)[ids])
    full = head.full_logits(sub)
    assert torch.isinf(full[[0, 1, 3]]).all() and torch.equal(full[ids], sub)
    assert int(head.to_token(torch.tensor(1))) == 4
    with pytest.raises(ValueError):
        VocabHead(w, torch.tensor([7]))


def test_best_exit_trades_agreement_for_cost():
    assert train.best_exit({"4": {"agreement": 0.3}, "20": {"agreement": 0.35}}, 30) == 4
    assert train.best_exit({"4": {"agreement": 0.05}, "12": {"agreement": 0.8}}, 30) == 12


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("reduced", [False, True])
def test_replay_reproduces_the_engine_counters(target4, k, reduced):
    """One teacher-forced draft pass + replay gives the engine's per-step counters for any k."""
    from specdecode_ref.analysis import replay_greedy_chain
    from specdecode_ref.measure.harness.bench import draft_greedy_matches

    prompt = torch.tensor([5, 9, 2, 33, 7])
    plain = autoregressive_generate(target4, prompt, max_new_tokens=60).tokens
    vocab = torch.arange(0, 64, 2) if reduced else None
    p = DraftModelProposer(noisy_draft(target4, 0.2, 1), k=k, draft_vocab=vocab)
    engine = generate(target4, prompt, p, max_new_tokens=60).stats
    replay = replay_greedy_chain(draft_greedy_matches(p, prompt, plain), k)
    assert replay.accepted_lengths == engine.accepted_lengths and engine.accepted > 0
