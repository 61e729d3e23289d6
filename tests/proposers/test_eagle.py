"""EAGLE on tiny random Llamas: greedy exactness (chain and tree), the head cache after every step,
the dynamic tree against a sequential oracle, the sampling law, training and save/load."""
import copy
import json

import pytest
import torch

from support import (RecordsAccepted, check_joint_law, check_unrolled_matches_sequential, make_tiny_llama, noisy,
                     twins)
from specdecode_ref import SamplingParams, autoregressive_generate, generate, kv, masks, trees
from specdecode_ref.training import cli, distill, train
from specdecode_ref.proposers import eagle
from specdecode_ref.proposers.eagle import EagleProposer, build_eagle_head


def good_head(target, scale=0.0, seed=0):
    """For a ONE-layer target, fc = [0 | I] makes the head the target itself read one position late
    (it misses only the first token of the context): a drafter that is usually right. Noise on its
    layer makes it right less often, so every acceptance length occurs."""
    head = build_eagle_head(target)
    H = target.config.hidden_size
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, H:] = torch.eye(H)
    noisy(head.layer, scale, seed)
    return head


@pytest.fixture(scope="module")
def target1():
    return make_tiny_llama(vocab_size=64, sharpness=1.0, seed=3, layers=1, init_range=0.3)


@pytest.fixture(scope="module")
def trained(target4, tiny_corpus):
    train_c, hold = tiny_corpus.split(0.2, seed=0)
    return train.train_eagle(target4, train_c, steps=40, lr=3e-3, batch_tokens=256, holdout=hold)


def fresh_head_pass(p, token_list):
    """The head cache and last output a fresh pass gives: real features f_t from a fresh target
    forward (the final normed hidden state; for a fused head the hidden states of its layers,
    concatenated), tokens x_{t+1}, t = 0..N-2."""
    n = len(token_list)
    with torch.no_grad():
        out = p.target.model(input_ids=torch.tensor([token_list[:-1]]), output_hidden_states=True)
        f = out.last_hidden_state
        if p.head.features == "fused":
            f = torch.cat([out.hidden_states[i] for i in p.head.feature_layers], dim=-1)
        cache = kv.new_cache()
        out = p.head(f, torch.tensor([token_list[1:]]), torch.arange(n - 1)[None],
                     masks.causal_additive_mask(n - 1, 0, f.dtype), p.target, cache)
    return cache, out[0, -1]


class CheckedEagle(RecordsAccepted, EagleProposer):
    """After every step: the head cache holds exactly positions 0..N-2 and equals a fresh pass."""

    def check(self, state, outcome):
        assert kv.cache_len(self.head_cache) == len(state.token_list) - 1
        cache, last = fresh_head_pass(self, state.token_list)
        torch.testing.assert_close(self.head_cache.layers[0].keys, cache.layers[0].keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(self.head_cache.layers[0].values, cache.layers[0].values, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(self._last, last, atol=1e-4, rtol=1e-4)


PROMPT = torch.tensor([5, 9, 2, 33, 7])
SCALES = (0.0, 0.05, 0.1, 0.2, 0.35, 0.6)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_eagle_chain_greedy_exact_and_rollback_every_length(target1, k):
    ref = autoregressive_generate(target1, PROMPT, max_new_tokens=100).tokens
    seen = set()
    for seed, scale in enumerate(SCALES):
        p = CheckedEagle(target1, good_head(target1, scale, seed), k=k)
        out = generate(target1, PROMPT, p, max_new_tokens=100)
        assert torch.equal(out.tokens, ref)
        seen |= set(p.accepted)
    assert seen == set(range(k + 1)), f"acceptance lengths seen: {sorted(seen)}"


TREES = [dict(k=4, depth=2, beam=2, branch=2), dict(k=10, depth=4, beam=3, branch=3),
         dict(k=16, depth=5, beam=4, branch=4), dict(k=5, depth=5, beam=1, branch=1)]


@pytest.mark.parametrize("shape", TREES, ids=lambda s: "k{k}-d{depth}-b{beam}x{branch}".format(**s))
def test_eagle_tree_greedy_exact_and_rollback(target1, shape):
    ref = autoregressive_generate(target1, PROMPT, max_new_tokens=100).tokens
    seen = set()
    for seed, scale in enumerate(SCALES):
        p = CheckedEagle(target1, good_head(target1, scale, seed), tree=True, **shape)
        out = generate(target1, PROMPT, p, max_new_tokens=100)
        assert torch.equal(out.tokens, ref)
        seen |= set(p.accepted)
    # deep nodes of a wide tree rarely make the budget on these flat tiny models: ask for 0..3
    assert set(range(min(shape["depth"], 3) + 1)) <= seen, f"acceptance lengths seen: {sorted(seen)}"


@pytest.mark.parametrize("mode", [dict(k=1), dict(k=4), dict(k=8, tree=True, depth=3, beam=2, branch=3),
                                  dict(k=16, tree=True)], ids=["chain1", "chain4", "tree8", "tree16"])
def test_eagle_untrained_and_trained_heads_greedy_exact(target4, trained, mode):
    head, _ = trained
    prompt = torch.tensor([4, 8, 15, 16, 23, 42])
    ref = autoregressive_generate(target4, prompt, max_new_tokens=60).tokens
    for h in (build_eagle_head(target4), head):
        out = generate(target4, prompt, CheckedEagle(target4, h, **mode), max_new_tokens=60)
        assert torch.equal(out.tokens, ref)
    # a reduced draft vocabulary (even ids only) stays exact
    out = generate(target4, prompt, EagleProposer(target4, head, draft_vocab=torch.arange(0, 64, 2), **mode),
                   max_new_tokens=60)
    assert torch.equal(out.tokens, ref)


# --- the dynamic tree against an oracle ---------------------------------------------------------------

def oracle_tree(p, n):
    """EAGLE-2's tree built the slow way: every node's distribution from a *sequential* head pass
    along its path in a copy of the committed head cache (no tree mask, no batching)."""
    base = copy.deepcopy(p.head_cache)

    def children(path):
        cache, out = copy.deepcopy(base), p._last
        for j, tok in enumerate(path):
            out = p.head(out[None, None], torch.tensor([[tok]]), torch.tensor([[n - 1 + j]]), None, p.target,
                         cache)[0, -1]
        logp = torch.log_softmax(p.vocab.logits(p.head.readout(out)).float(), -1).clamp_max(0.0)
        v, i = logp.topk(min(p.branch, logp.numel()))
        return list(zip(v.tolist(), p.vocab.to_token(i).tolist()))

    nodes = [dict(path=[t], parent=-1, score=lp) for lp, t in children([])]  # depth 1
    level = list(range(len(nodes)))
    for _ in range(1, p.depth):
        expand = sorted(level, key=lambda i: -nodes[i]["score"])[: p.beam]
        level = []
        for i in expand:
            for lp, t in children(nodes[i]["path"]):
                level.append(len(nodes))
                nodes.append(dict(path=nodes[i]["path"] + [t], parent=i, score=nodes[i]["score"] + lp))
    best = sorted(range(len(nodes)), key=lambda i: (-nodes[i]["score"], len(nodes[i]["path"])))[: p.k]
    kept = sorted(best)
    assert all(nodes[i]["parent"] < 0 or nodes[i]["parent"] in kept for i in kept), "a kept node lost its parent"
    index = {old: j for j, old in enumerate(kept)}
    tokens = [nodes[i]["path"][-1] for i in kept]
    parents = [-1 if nodes[i]["parent"] < 0 else index[nodes[i]["parent"]] for i in kept]
    return tokens, parents, [nodes[i]["score"] for i in kept]


class OracleChecked(EagleProposer):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.trees = 0

    def propose(self, state):
        want = oracle_tree(self, len(state.token_list))
        draft = super().propose(state)
        parents = trees.validate_parents(draft.parents, len(draft))
        assert draft.probs is None and len(draft) <= self.k
        assert int(trees.tree_depths(parents).max()) <= self.depth
        for kids in trees.children_by_slot(parents):  # siblings are distinct tokens
            toks = [int(draft.tokens[i]) for i in kids]
            assert len(set(toks)) == len(toks)
        assert draft.tokens.tolist() == want[0] and parents.tolist() == want[1]
        torch.testing.assert_close(self.last_tree_scores, torch.tensor(want[2]), atol=1e-4, rtol=1e-4)
        self.trees += 1
        return draft


@pytest.mark.parametrize("shape", TREES[:3], ids=["small", "medium", "large"])
def test_eagle_tree_matches_sequential_oracle(target1, target4, trained, shape):
    for target, head in ((target1, good_head(target1, 0.2, 1)), (target4, trained[0])):
        p = OracleChecked(target, head, tree=True, **shape)
        ref = autoregressive_generate(target, PROMPT, max_new_tokens=30).tokens
        assert torch.equal(generate(target, PROMPT, p, max_new_tokens=30).tokens, ref)
        assert p.trees > 3


def test_eagle_tree_planted_bug_siblings_see_each_other_is_caught(target4, trained):
    """Score a tree level with a plain causal mask instead of the tree mask: a node then attends to
    earlier siblings and other branches, and the oracle must notice."""

    class CausalLevels(OracleChecked):
        def _level_mask(self, hpar, past):
            mask, pos = super()._level_mask(hpar, past)
            return masks.causal_additive_mask(len(hpar) + 1, past, mask.dtype), pos

    p = CausalLevels(target4, trained[0], tree=True, k=16, depth=4, beam=4, branch=4)
    with pytest.raises(AssertionError):
        generate(target4, PROMPT, p, max_new_tokens=30)


# --- sampling --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_vocab():
    return make_tiny_llama(vocab_size=6, sharpness=3.0, seed=2, layers=1)


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=3)])
@twins("bonus_off_by_one")
def test_eagle_chain_sampling_follows_target(small_vocab, sampling, bug, monkeypatch):
    head = good_head(small_vocab, 0.3, 0)
    prompt = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    check_joint_law(monkeypatch, bug, small_vocab, prompt, lambda: EagleProposer(small_vocab, head, k=2), sampling)


@twins("bonus_off_by_one")
def test_eagle_tree_sampling_follows_target(small_vocab, bug, monkeypatch):
    head = good_head(small_vocab, 0.3, 0)
    prompt = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    factory = lambda: EagleProposer(small_vocab, head, k=5, tree=True, depth=2, beam=2, branch=2)  # noqa: E731
    check_joint_law(monkeypatch, bug, small_vocab, prompt, factory, SamplingParams(temperature=1.0))


def test_eagle_chain_sampling_returns_q(small_vocab):
    """Sampled drafting reports the q each token was drawn from: rows sum to 1 and put mass on
    the drafted token."""
    head = good_head(small_vocab, 0.3, 0)
    p, drafts = EagleProposer(small_vocab, head, k=3), []
    real = p.propose
    p.propose = lambda state: drafts.append(real(state)) or drafts[-1]
    out = generate(small_vocab, torch.tensor([0, 1, 2]), p, max_new_tokens=30, sampling=SamplingParams(temperature=1.0),
                   seed=1)
    assert out.stats.acceptance_rate > 0 and len(out.tokens) == 30 and drafts
    for d in drafts:
        assert d.probs is not None and d.probs.shape == (len(d.tokens), 6)
        torch.testing.assert_close(d.probs.sum(-1), torch.ones(len(d.tokens)))
        assert bool((d.probs.gather(1, d.tokens[:, None]) > 0).all())


# --- training, files, errors ----------------------------------------------------------------------

def mean(xs):
    return sum(xs) / len(xs)


def test_eagle_training_lowers_the_loss(target4, tiny_corpus, trained):
    head, res = trained
    before, after = res.heldout["before"], res.heldout["after"]
    print(res.heldout)
    assert after["loss"] < 0.95 * before["loss"]
    assert after["feature_loss"] < before["feature_loss"] and after["token_loss"] < before["token_loss"]
    assert 0.0 <= after["agreement"] <= 1.0 and after["tokens"] > 0
    assert mean(res.losses[-5:]) < mean(res.losses[:5])
    assert not any(p.requires_grad for p in head.parameters())
    assert not any(p.requires_grad for p in target4.parameters())  # the target stays frozen
    # a planted bug, lr = 0, must not pass the same check
    train_c, hold = tiny_corpus.split(0.2, seed=0)
    _, flat = train.train_eagle(target4, train_c, steps=10, lr=0.0, batch_tokens=256, holdout=hold)
    assert not flat.heldout["after"]["loss"] < 0.95 * flat.heldout["before"]["loss"]


def test_eagle_batch_alignment(tiny_corpus):
    """Input f_t with token x_{t+1}; target f_{t+1}; answer targets read at the head output whose
    feature predicts them (index c - 1 for the target's distribution read at position c)."""
    c = tiny_corpus
    f_in, tok, f_next, valid, rows, cols, t_ids, _ = train.eagle_batch(c, [0])
    T = c.ids[0].numel()
    assert f_in.shape[1] == T - 1 and bool(valid.all())
    assert torch.equal(tok[0], c.ids[0][1:])
    torch.testing.assert_close(f_next[0, :-1], f_in[0, 1:])
    assert torch.equal(cols, torch.arange(c.start[0] - 2, T - 2))
    # the target's argmax at answer j is the next answer token (greedy answers): ids[cols + 2]
    assert torch.equal(t_ids[:, 0].long(), c.ids[0][cols + 2])


@pytest.mark.parametrize("steps", [2, 3])
def test_unrolled_training_matches_inference_drafting(target4, steps):
    """Training-time test must show the head exactly what drafting token s shows it: real entries up
    to position j, then its own outputs. Each row of the batched unrolled forward (one mask) is
    checked against the proposer's way: a fresh cache of real inputs, then own outputs one by one."""
    head = noisy(build_eagle_head(target4), 0.3, 1)
    g = torch.Generator().manual_seed(0)
    q, H = 9, target4.config.hidden_size
    check_unrolled_matches_sequential(head, target4, torch.randn(1, q, H, generator=g),
                                      torch.randint(0, 64, (1, q), generator=g), steps)
    m = masks.unrolled_mask(5, 3)[0, 0]
    assert m.shape == (3, 5 + 4 + 3) and int(m[1, :5].sum()) == 2 and m[1, 5 + 1] and m[1, 9 + 1]
    with pytest.raises(ValueError, match="unroll"):
        train.eagle_loss_fn(target4, head, None, unroll=0)


def test_unrolled_training_reports_every_step(target4, tiny_corpus):
    train_c, hold = tiny_corpus.split(0.2, seed=0)
    head, res = train.train_eagle(target4, train_c, steps=6, lr=3e-3, batch_tokens=256, holdout=hold, unroll=2)
    after = res.heldout["after"]
    assert 0.0 <= after["agreement_2"] <= 1.0 and after["tokens"] > 0
    # fine-tuning starts from the given head, not from the target's last layer
    again, res2 = train.train_eagle(target4, train_c, steps=1, lr=0.0, batch_tokens=256, holdout=hold, init=head)
    assert res2.heldout["before"]["loss"] == pytest.approx(after["loss"], rel=1e-4)


def test_eagle_training_needs_hidden_states(target4, tiny_corpus):
    no_hidden = distill.Corpus(tiny_corpus.ids, tiny_corpus.start, tiny_corpus.topk_ids, tiny_corpus.topk_logp)
    with pytest.raises(ValueError, match="hidden"):
        train.train_eagle(target4, no_hidden, steps=1)


def test_save_and_load_eagle_roundtrip(target4, trained, tmp_path):
    head, res = trained
    path = eagle.save_eagle(head, tmp_path / "e.safetensors", {"heldout_agreement": 0.5, "note": "test"})
    meta = eagle.eagle_metadata(path)
    assert meta["note"] == "test" and meta["heldout_agreement"] == "0.5"
    loaded = eagle.load_eagle_weights(target4, path)
    for (k1, v1), (k2, v2) in zip(head.state_dict().items(), loaded.state_dict().items()):
        assert k1 == k2
        torch.testing.assert_close(v2, v1.to(torch.bfloat16).float())
    assert not any(p.requires_grad for p in loaded.parameters())
    prompt = torch.tensor([4, 8, 15, 16, 23, 42])
    ref = autoregressive_generate(target4, prompt, max_new_tokens=30).tokens
    assert torch.equal(generate(target4, prompt, EagleProposer(target4, loaded, k=3), max_new_tokens=30).tokens, ref)
    with pytest.raises(ValueError, match="SmolLM2"):
        eagle.load_eagle_head(target4, path)  # the shipped loader refuses a foreign target
    with pytest.raises(ValueError, match="SmolLM2"):
        eagle.load_eagle_proposer(target4)


def test_eagle_errors(target4, target1):
    head = build_eagle_head(target4)
    with pytest.raises(ValueError, match="same model"):
        generate(target1, torch.tensor([1, 2]), EagleProposer(target4, head, k=2), max_new_tokens=3)
    for bad in (dict(k=0), dict(k=2, depth=0), dict(k=2, beam=0), dict(k=2, branch=True)):
        with pytest.raises(ValueError):
            EagleProposer(target4, head, **bad)
    from specdecode_ref.proposers.base import DecodeState

    p = EagleProposer(target4, head, k=2)
    with pytest.raises(RuntimeError, match="begin"):
        p.propose(DecodeState(target=target4, sampling=SamplingParams(), generator=None, prompt_len=2,
                              token_list=[1, 2]))
    assert "tree=(depth=5" in repr(EagleProposer(target4, head, k=8, tree=True))


def test_eagle_planted_bug_features_from_the_wrong_layer_are_caught(target4, trained):
    """Catch up from another layer's hidden states than the final normed one: greedy output stays
    exact (verification never trusts the draft), but the head cache check must fail."""
    import dataclasses

    class WrongLayer(CheckedEagle):
        def on_verified(self, state, outcome):
            super().on_verified(state, dataclasses.replace(outcome, hidden_states=outcome.hidden_states[:-1]))

    with pytest.raises(AssertionError):
        generate(target4, PROMPT, WrongLayer(target4, trained[0], k=3), max_new_tokens=20)


def test_eagle_cli_writes_weights_and_curve(target4, tiny_corpus, tmp_path, monkeypatch):
    """``python -m specdecode_ref.training eagle`` end to end, on the tiny target instead of the real one."""
    corpus_path = tiny_corpus.save(tmp_path / "corpus.pt")
    monkeypatch.setattr(cli, "load_target", lambda dtype="fp32": (target4, None))
    out = tmp_path / "eagle.safetensors"
    train.main(["--corpus", str(corpus_path), "eagle", "--steps", "3", "--unroll-steps", "2", "--batch-tokens", "256",
                "--out", str(out)])
    meta = eagle.eagle_metadata(out)
    assert meta["steps"] == "3" and 0.0 <= float(meta["heldout_agreement"]) <= 1.0
    # both stages: teacher forcing, then training-time test from the stage-1 head
    held = json.loads(meta["heldout"])
    assert meta["unroll"] == "3" and held["stage_2_starts_at_step"] == 3 and "agreement_2" in held["after_stage_1"]
    assert json.loads((tmp_path / "eagle-loss.json").read_text())["steps"] == 5
    assert (tmp_path / "eagle-loss.png").exists()
    eagle.load_eagle_weights(target4, out)
    train.main(["--corpus", str(corpus_path), "eagle", "--steps", "2", "--unroll", "1", "--batch-tokens", "256",
                "--out", str(out)])
    assert "after_stage_1" not in json.loads(eagle.eagle_metadata(out)["heldout"])
