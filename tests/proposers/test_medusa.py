"""Medusa heads on tiny random Llamas: greedy exactness (chain and tree, untrained and trained
heads), the feature/position indexing (an oracle head reaches acceptance 1; a planted off-by-one
does not), the sampling law with lossless tree verification, typical acceptance is lossy,
derive_choices, training lowers the loss, and the weights' save/load round trip."""
import pytest
import torch

from support import RecordsAccepted, check_joint_law, make_tiny_llama, sampled_joint_pvalue, twins
from specdecode_ref import SamplingParams, autoregressive_generate, generate, trees
from specdecode_ref.training import train
from specdecode_ref.proposers.medusa import (MedusaHeads, MedusaProposer, derive_choices, expected_accepted,
                                             load_medusa_heads, load_medusa_proposer, medusa_metadata,
                                             save_medusa_heads)

TREE = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1)]


@pytest.fixture(scope="module")
def small_vocab():
    return make_tiny_llama(vocab_size=6, sharpness=3.0, seed=2, layers=2)


def random_heads(target, num_heads=3, scale=1.0, seed=0, num_layers=1):
    """Untrained heads with random (not identity) weights: right only by chance."""
    torch.manual_seed(seed)
    heads = MedusaHeads(target.config.hidden_size, num_heads, num_layers)
    with torch.no_grad():
        for block in heads.heads:
            for rb in block:
                rb.linear.weight.normal_(0.0, scale / target.config.hidden_size ** 0.5)
    return heads.eval().requires_grad_(False)


class Recording(RecordsAccepted, MedusaProposer):
    def check(self, state, outcome):
        if self.tree is not None and outcome.accepted_nodes is not None:
            # the accepted nodes form a root-to-node path of the tree
            nodes = outcome.accepted_nodes
            if nodes:
                assert nodes == trees.path_to(self.tree.parents, nodes[-1])


@pytest.mark.parametrize("choices", [None, TREE], ids=["chain", "tree"])
def test_medusa_greedy_exact_untrained(target4, choices):
    prompt = torch.tensor([5, 9, 2, 33, 7])
    ref = autoregressive_generate(target4, prompt, max_new_tokens=60).tokens
    for seed, scale in enumerate((0.0, 0.5, 2.0)):
        p = Recording(target4, random_heads(target4, 3, scale, seed), choices=choices)
        out = generate(target4, prompt, p, max_new_tokens=60)
        assert torch.equal(out.tokens, ref)
        assert out.stats.steps == len(p.accepted)


# --- indexing: an oracle head that sees only the feature --------------------------------------------

class OracleMedusa(MedusaProposer):
    """Heads replaced by an oracle: it finds which position of the reference greedy sequence the
    feature belongs to (nearest row of the target's last hidden states over that sequence; the
    match must be exact up to float noise) and predicts, for head i, the reference token i+2 places
    after it. Correct indexing then gives acceptance 1; any off-by-one breaks it."""

    def __init__(self, target, seq, num_heads=3, **kw):
        super().__init__(target, MedusaHeads(target.config.hidden_size, num_heads), **kw)
        with torch.no_grad():
            self.table = target(input_ids=seq[None], output_hidden_states=True).hidden_states[-1][0]
        self.seq = seq
        self.positions = []

    def head_logits(self, feature):
        d = (self.table - feature).norm(dim=-1)
        t = int(d.argmin())
        assert float(d[t]) < 1e-3 * float(feature.norm()), "the feature is no committed position's hidden state"
        self.positions.append(t)
        logits = torch.zeros(self.num_heads, self.target.config.vocab_size)
        for i in range(self.num_heads):
            if t + 2 + i < self.seq.numel():
                logits[i, self.seq[t + 2 + i]] = 1.0
        return logits


@pytest.mark.parametrize("choices", [None, [(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]], ids=["chain", "tree"])
def test_oracle_heads_accept_everything(target4, choices):
    prompt = torch.tensor([4, 8, 15, 16, 23])
    ref = autoregressive_generate(target4, prompt, max_new_tokens=41).tokens
    seq = torch.cat([prompt, ref])
    p = OracleMedusa(target4, seq, choices=choices)
    out = generate(target4, prompt, p, max_new_tokens=41)
    assert torch.equal(out.tokens, ref)
    # every step accepts the whole depth-3 path: 1 (prefill) + 10 steps x (3 + bonus) = 41 tokens
    assert out.stats.accepted == out.stats.steps * 3 and out.stats.steps == 10
    assert out.stats.mean_accepted_length == 4.0
    # the feature read before step s sits at position N-2 (N committed tokens)
    n = prompt.numel() + 1
    for t in p.positions:
        assert t == n - 2
        n += 4


class RootFeature(OracleMedusa):
    """Planted bug: the feature of the root (first row) instead of the last accepted position."""

    def on_verified(self, state, outcome):
        self._feature = outcome.hidden_states[-1][0]


class OffByOne(OracleMedusa):
    """Planted bug: head i trained/used as if it predicted i+1 places ahead (the target's own job)."""

    def head_logits(self, feature):
        logits = super().head_logits(feature)
        t = self.positions[-1]
        logits.zero_()
        for i in range(self.num_heads):
            logits[i, self.seq[min(t + 1 + i, self.seq.numel() - 1)]] = 1.0
        return logits


@pytest.mark.parametrize("bug", [RootFeature, OffByOne])
def test_planted_indexing_bugs_are_caught(target4, bug):
    prompt = torch.tensor([4, 8, 15, 16, 23])
    ref = autoregressive_generate(target4, prompt, max_new_tokens=41).tokens
    out = generate(target4, prompt, bug(target4, torch.cat([prompt, ref])), max_new_tokens=41)
    assert torch.equal(out.tokens, ref)  # still lossless...
    assert out.stats.acceptance_rate < 0.8  # ...but the heads now guess the wrong positions


# --- sampling --------------------------------------------------------------------------------------

@pytest.mark.parametrize("choices,sampling", [
    ([(0,), (1,), (0, 0), (1, 0), (0, 1)], SamplingParams(temperature=1.0)),
    (None, SamplingParams(temperature=0.7, top_k=3)),
], ids=["tree-T1", "chain-T0.7-top3"])
@twins("bonus_off_by_one")
def test_medusa_sampling_lossless_follows_target(small_vocab, choices, sampling, bug, monkeypatch):
    heads = random_heads(small_vocab, 2, 1.0, seed=1)
    prompt = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    factory = lambda: MedusaProposer(small_vocab, heads, choices=choices)  # noqa: E731
    check_joint_law(monkeypatch, bug, small_vocab, prompt, factory, sampling, n=2500)


def test_medusa_typical_acceptance_runs_and_is_lossy(small_vocab):
    """Medusa's own acceptance rule (engine tree_acceptance="typical") accepts more but fails the
    same distribution test (test_trees.py shows the same for the verifier alone)."""
    heads = random_heads(small_vocab, 2, 1.0, seed=1)
    prompt = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    choices = [(0,), (1,), (0, 0), (1, 0), (0, 1)]
    out = generate(small_vocab, prompt, MedusaProposer(small_vocab, heads, choices=choices), max_new_tokens=20,
                   sampling=SamplingParams(temperature=1.0), tree_acceptance="typical", seed=0)
    assert out.tokens.numel() == 20

    def typical(model, prompt, proposer, max_new_tokens, sampling, seed):
        return generate(model, prompt, proposer, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed,
                        tree_acceptance="typical")

    factory = lambda: MedusaProposer(small_vocab, heads, choices=choices)  # noqa: E731
    p = sampled_joint_pvalue(small_vocab, prompt, factory, SamplingParams(temperature=1.0), n=1500,
                             generate_fn=typical)
    assert p < 1e-6


# --- derive_choices ----------------------------------------------------------------------------------

def test_derive_choices_greedy_from_accuracies():
    acc = [[0.6, 0.2, 0.1],   # head 0, ranks 0..2
           [0.4, 0.2, 0.1],   # head 1
           [0.3, 0.1, 0.05]]  # head 2
    c = derive_choices(acc, 5)
    # values: (0)=.6, (0,0)=.24, (1)=.2, (0,1)=.12, (2)=.1 and (1,0)=.08, (0,0,0)=.072 ...
    assert c == [(0,), (0, 0), (1,), (0, 1), (2,)]
    assert expected_accepted(acc, c) == pytest.approx(0.6 + 0.24 + 0.2 + 0.12 + 0.1)
    big = derive_choices(acc, 30)
    assert len(big) == 30 and len(set(big)) == 30
    assert max(len(x) for x in big) <= 3  # never deeper than the number of heads
    trees.tree_from_choices(big)  # every node's parent is in the tree
    # greedy is optimal here: no 5-node tree has a larger estimated acceptance
    assert expected_accepted(acc, derive_choices(acc, 5)) >= expected_accepted(acc, [(0,), (1,), (2,), (0, 0), (1, 0)])
    assert derive_choices(acc, 4, max_depth=1) == [(0,), (1,), (2,)]  # the frontier runs out
    with pytest.raises(ValueError):
        derive_choices(acc, 0)
    with pytest.raises(ValueError):
        derive_choices([[1.5]], 3)


def test_medusa_errors(target4):
    heads = random_heads(target4, 2)
    with pytest.raises(ValueError, match="depth"):
        MedusaProposer(target4, heads, choices=[(0,), (0, 0), (0, 0, 0)])
    with pytest.raises(ValueError, match="more than k"):
        MedusaProposer(target4, heads, k=2, choices=TREE[:3])
    with pytest.raises(ValueError, match="k"):
        MedusaProposer(target4, heads, k=0)
    other = make_tiny_llama(vocab_size=64, seed=9, layers=2)
    with pytest.raises(ValueError, match="same model"):
        generate(other, torch.tensor([1, 2]), MedusaProposer(target4, heads), max_new_tokens=3)
    p = MedusaProposer(target4, heads, k=5)  # chain mode drafts at most num_heads tokens
    out = generate(target4, torch.tensor([1, 2, 3]), p, max_new_tokens=10)
    assert out.stats.drafted <= 2 * out.stats.steps


# --- training ------------------------------------------------------------------------------------

def test_medusa_batch_indexing(tiny_corpus):
    c = tiny_corpus.subset([0])
    x, y = train.medusa_batch(c, [0], 3)
    ids, st = c.ids[0], c.start[0]
    T = ids.numel()
    assert x.shape == (T - 2 - (st - 1), c.hidden[0].shape[1])
    torch.testing.assert_close(x[0], c.hidden[0][st - 1].float())  # the last prompt position comes first
    assert y[0].tolist() == ids[st + 1: st + 4].tolist()  # head i: i+2 places ahead
    assert y[-1].tolist() == [int(ids[-1]), -100, -100]  # position T-3: only head 0 has a target


def test_medusa_training_lowers_the_loss_and_stays_exact(target4, tiny_corpus):
    train_c, hold = tiny_corpus.split(0.2, seed=0)
    heads, res = train.train_medusa(target4, train_c, num_heads=3, steps=60, lr=1e-2, batch_tokens=256,
                                    holdout=hold)
    print(res.heldout)
    assert sum(res.losses[-5:]) < 0.9 * sum(res.losses[:5])
    before, after = res.heldout["before"], res.heldout["after"]
    assert sum(after["loss"]) < sum(before["loss"])
    assert len(after["rank_accuracy"]) == 3 and len(after["top5"]) == 3
    assert all(t5 >= t1 for t1, t5 in zip(after["top1"], after["top5"]))
    assert not any(p.requires_grad for p in heads.parameters())
    assert not any(p.grad is not None for p in target4.parameters())  # the target stays frozen
    # trained heads, chain and a tree derived from their measured accuracies: still exact
    prompt = torch.tensor([3, 1, 4, 1, 5, 9])
    ref = autoregressive_generate(target4, prompt, max_new_tokens=50).tokens
    for choices in (None, derive_choices(after["rank_accuracy"], 8)):
        out = generate(target4, prompt, MedusaProposer(target4, heads, choices=choices), max_new_tokens=50)
        assert torch.equal(out.tokens, ref)


def test_save_and_load_medusa_roundtrip(target4, tmp_path):
    heads = random_heads(target4, 3, 1.0, seed=4)
    acc = [[0.5, 0.2], [0.3, 0.1], [0.2, 0.1]]
    path = save_medusa_heads(heads, tmp_path / "m.safetensors",
                             {"rank_accuracy": acc, "top1": [0.5, 0.3, 0.2], "choices": derive_choices(acc, 4)},
                             target=target4)
    meta = medusa_metadata(path)
    assert meta["rank_accuracy"] == acc and meta["num_heads"] == 3 and meta["choices"] == [[0], [1], [0, 0], [1, 0]]
    loaded = load_medusa_heads(target4, path)
    for a, b in zip(heads.state_dict().values(), loaded.state_dict().values()):
        torch.testing.assert_close(a.to(torch.bfloat16).float(), b.float())
    p = load_medusa_proposer(target4, k=4, reduced_vocab=False, path=path)
    assert p.tree is not None and len(p.tree.choices) == 4
    prompt = torch.tensor([2, 7, 1, 8])
    ref = autoregressive_generate(target4, prompt, max_new_tokens=20).tokens
    assert torch.equal(generate(target4, prompt, p, max_new_tokens=20).tokens, ref)
    with pytest.raises(ValueError, match="SmolLM2"):
        load_medusa_heads(target4)  # the shipped heads refuse a foreign target
    other = make_tiny_llama(vocab_size=32, seed=1)
    with pytest.raises(ValueError, match="hidden size|vocabulary"):
        load_medusa_heads(other, path)
