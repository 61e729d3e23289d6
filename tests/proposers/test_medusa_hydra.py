"""Hydra heads (sequentially dependent Medusa heads): greedy exactness (chain and tree, tiny and real
model), every tree node drafted from the path to it (an oracle head; planted path and bonus-token
bugs are caught), the sampling law, teacher-forced batches read the right tokens and top-k rows,
training lowers the loss and uses the previous tokens, the command line writes a file that loads
back as Hydra heads, and the shipped Medusa file still loads as Medusa heads."""
import json
from dataclasses import replace

import pytest
import torch

from support import check_joint_law, twins
from specdecode_ref import SamplingParams, autoregressive_generate, generate, trees
from specdecode_ref.proposers import DecodeState, shipped_vocab
from specdecode_ref.proposers.medusa import (HydraHeads, HydraProposer, MedusaHeads, MedusaProposer, derive_choices,
                                             load_medusa_heads, load_medusa_proposer, medusa_metadata)
from specdecode_ref.training import cli, train
from specdecode_ref.training import medusa as medusa_training
from specdecode_ref.training.recipes import MEDUSA

TREE = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (1, 0, 0)]


def random_hydra(target, num_heads=3, scale=1.0, seed=0, width=16):
    """Untrained Hydra heads with random (not identity) output weights: right only by chance."""
    torch.manual_seed(seed)
    heads = HydraHeads(target.config.hidden_size, num_heads, 1, width)
    with torch.no_grad():
        for head in heads.heads:
            head.out.weight.normal_(0.0, scale)
    return heads.to(next(target.parameters()).dtype).eval().requires_grad_(False)


@pytest.mark.parametrize("choices", [None, TREE], ids=["chain", "tree"])
def test_hydra_greedy_exact_untrained(target4, choices):
    prompt = torch.tensor([5, 9, 2, 33, 7])
    ref = autoregressive_generate(target4, prompt, max_new_tokens=40).tokens
    for seed, scale in enumerate((0.0, 0.5, 2.0)):
        out = generate(target4, prompt, HydraProposer(target4, random_hydra(target4, 3, scale, seed), choices=choices),
                       max_new_tokens=40)
        assert torch.equal(out.tokens, ref)


def test_hydra_greedy_exact_on_the_embedded_model(embedded):
    model, _ = embedded
    heads = random_hydra(model, 3, 0.05, seed=1, width=32)
    prompt = torch.tensor([1, 504, 3458, 314, 253, 2379])
    ref = autoregressive_generate(model, prompt, max_new_tokens=12, stop_on_eos=False).tokens
    for choices in (None, [(0,), (1,), (0, 0), (1, 0), (0, 0, 0)]):  # chain, tree
        out = generate(model, prompt, HydraProposer(model, heads, choices=choices, draft_vocab=shipped_vocab()),
                       max_new_tokens=12, stop_on_eos=False)
        assert torch.equal(out.tokens, ref)


def test_shipped_medusa_file_still_loads_as_medusa_heads(embedded):
    model, _ = embedded
    assert "hydra" not in medusa_metadata()
    heads = load_medusa_heads(model)
    assert type(heads) is MedusaHeads
    assert type(load_medusa_proposer(model, k=4)) is MedusaProposer


# --- every node drafted from the path to it: an oracle head --------------------------------------

class OracleHydra(HydraProposer):
    """Heads replaced by the target itself: the logits for a path are the target's next-token logits
    after the committed tokens (the bonus token last) and the path's drafted tokens. Each node should
    then be its parent's rank-r continuation *given the path to it*, and greedy acceptance is total."""

    def __init__(self, target, **kw):
        super().__init__(target, HydraHeads(target.config.hidden_size, 3, 1, 4), **kw)
        self.committed = None

    def propose(self, state):
        self.committed = list(state.token_list)
        return super().propose(state)

    def path_logits(self, feature, paths):
        past = torch.tensor(self.committed[:-1])  # the path starts with the bonus token
        rows = [self.target(input_ids=torch.cat([past, p.cpu()])[None]).logits[0, -1] for p in paths]
        return torch.stack(rows)


class SharedPath(OracleHydra):
    """Planted bug: every node of a depth reads the path to the first node of the previous depth."""

    def _plan_levels(self):
        return [(path[:1].expand_as(path), *rest) for path, *rest in super()._plan_levels()]


class StaleBonus(OracleHydra):
    """Planted bug: the heads read the token before the bonus token in its place."""

    def propose(self, state):
        self.committed = list(state.token_list)
        return HydraProposer.propose(self, replace(state, token_list=state.token_list[:-1]))


def wrong_nodes(target, proposer, prompt) -> int:
    """Nodes of the first draft after ``prompt`` that are not their parent's rank-r continuation."""
    out = generate(target, prompt, proposer, max_new_tokens=1)  # begin() and the first token
    state = DecodeState(target, SamplingParams(), None, len(prompt), prompt.tolist() + out.tokens.tolist())
    draft = proposer.propose(state)
    wrong = 0
    for node in range(len(draft)):
        path = trees.path_to(draft.parents, node)
        seq = torch.cat([torch.tensor(state.token_list), draft.tokens[path[:-1]]])
        top = target(input_ids=seq[None]).logits[0, -1].topk(3).indices
        wrong += int(draft.tokens[node] != top[proposer.tree.ranks[node]])
    return wrong


def test_every_tree_node_reads_the_path_to_it(target4):
    prompt = torch.tensor([4, 8, 15, 16, 23])
    assert wrong_nodes(target4, OracleHydra(target4, choices=TREE), prompt) == 0
    assert wrong_nodes(target4, SharedPath(target4, choices=TREE), prompt) > 0
    assert wrong_nodes(target4, StaleBonus(target4, choices=TREE), prompt) > 0


@pytest.mark.parametrize("choices", [None, TREE], ids=["chain", "tree"])
def test_oracle_hydra_accepts_everything_and_planted_bugs_do_not(target4, choices):
    prompt = torch.tensor([4, 8, 15, 16, 23])
    ref = autoregressive_generate(target4, prompt, max_new_tokens=21).tokens
    out = generate(target4, prompt, OracleHydra(target4, choices=choices), max_new_tokens=21)
    assert torch.equal(out.tokens, ref)
    assert out.stats.steps == 5 and out.stats.accepted == 15  # 1 + 5 x (3 drafts + bonus) = 21 tokens
    bad = generate(target4, prompt, StaleBonus(target4, choices=choices), max_new_tokens=21)
    assert torch.equal(bad.tokens, ref)  # still lossless...
    assert bad.stats.acceptance_rate < 0.7  # ...but the heads continue the wrong token


# --- sampling ------------------------------------------------------------------------------------

@twins("resample_from_p")
def test_hydra_sampling_lossless_follows_target(small_vocab, bug, monkeypatch):
    heads = random_hydra(small_vocab, 2, 1.0, seed=1, width=8)
    prompt = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    choices = [(0,), (1,), (0, 0), (1, 0), (0, 1)]
    factory = lambda: HydraProposer(small_vocab, heads, choices=choices)  # noqa: E731
    check_joint_law(monkeypatch, bug, small_vocab, prompt, factory, SamplingParams(temperature=1.0), n=1200)


@pytest.fixture(scope="module")
def small_vocab():
    from support import make_tiny_llama

    return make_tiny_llama(vocab_size=6, sharpness=3.0, seed=2, layers=2)


def test_hydra_errors(target4):
    with pytest.raises(TypeError, match="HydraHeads"):
        HydraProposer(target4, MedusaHeads(32, 2))
    with pytest.raises(ValueError, match="depth"):
        HydraProposer(target4, random_hydra(target4, 2), choices=[(0,), (0, 0), (0, 0, 0)])
    heads = random_hydra(target4, 2)
    with pytest.raises(ValueError, match="tokens"):
        heads.head(1, torch.zeros(32), torch.zeros(1, 32))  # head 1 reads two tokens


# --- training ------------------------------------------------------------------------------------

def test_hydra_batch_reads_the_tokens_before_each_prediction(target4, tiny_corpus):
    c = tiny_corpus.subset([0])
    x, inputs, y, t_ids, t_logp = train.hydra_batch(c, [0], 3)
    ids, st = c.ids[0], c.start[0]
    T = ids.numel()
    assert x.shape[0] == T - 2 - (st - 1) and inputs.shape == y.shape == (x.shape[0], 3)
    torch.testing.assert_close(x[0], c.hidden[0][st - 1].float())  # the last prompt position comes first
    assert inputs[0].tolist() == ids[st: st + 3].tolist()  # the bonus token, then the true path
    assert y[0].tolist() == ids[st + 1: st + 4].tolist()  # head i: i+2 places ahead, as Medusa
    assert y[-1].tolist() == [int(ids[-1]), -100, -100]
    with torch.no_grad():  # the top-k rows are the target's own distribution at each predicted token
        logp = torch.log_softmax(target4(input_ids=ids[None]).logits[0], -1)
    for row, t in ((0, st - 1), (5, st + 4)):
        for j in range(3):
            if y[row, j] < 0:
                continue
            assert t_ids[row, j].tolist() == logp[t + 1 + j].topk(t_ids.shape[-1]).indices.tolist()
            torch.testing.assert_close(t_logp[row, j], logp[t + 1 + j].topk(t_ids.shape[-1]).values,
                                       atol=2e-2, rtol=0)


def _shift_path(batch_fn):
    """Planted bug: heads 1, 2 read the token one place too early on their path."""

    def shifted(corpus, idx, num_heads, device="cpu"):
        x, inputs, y, t_ids, t_logp = batch_fn(corpus, idx, num_heads, device)
        inputs = torch.cat([inputs[:, :1], inputs[:, :-1]], dim=1)
        return x, inputs, y, t_ids, t_logp

    return shifted


def test_hydra_training_learns_from_the_path_and_stays_exact(target4, tiny_corpus, monkeypatch):
    train_c, hold = tiny_corpus.split(0.2, seed=0)
    heads, res = train.train_medusa(target4, train_c, num_heads=3, steps=100, lr=1e-2, batch_tokens=256,
                                    holdout=hold, hydra=True, hydra_width=64)
    assert isinstance(heads, HydraHeads)
    assert sum(res.losses[-5:]) < 0.8 * sum(res.losses[:5])
    before, after = res.heldout["before"], res.heldout["after"]
    assert sum(after["loss"]) < sum(before["loss"])
    assert len(after["rank_accuracy"]) == 3 and all(t5 >= t1 for t1, t5 in zip(after["top1"], after["top5"]))
    assert not any(p.requires_grad for p in heads.parameters())
    assert not any(p.grad is not None for p in target4.parameters())  # the target stays frozen
    # The heads use their path: fed the token one place too early, teacher-forced accuracy drops
    # (measured on the training sequences, where these tiny heads are far above chance).
    right = train.medusa_accuracy(target4, heads, train_c)["top1"]
    monkeypatch.setattr(medusa_training, "hydra_batch", _shift_path(medusa_training.hydra_batch))
    wrong = train.medusa_accuracy(target4, heads, train_c)["top1"]
    monkeypatch.undo()
    assert wrong[0] == right[0]  # head 0 reads only the bonus token, which the bug leaves alone
    assert wrong[1] < 0.8 * right[1] and wrong[2] < 0.8 * right[2]
    # trained heads, chain and a tree derived from their measured accuracies: still exact
    prompt = torch.tensor([3, 1, 4, 1, 5, 9])
    ref = autoregressive_generate(target4, prompt, max_new_tokens=40).tokens
    for choices in (None, derive_choices(after["rank_accuracy"], 8)):
        out = generate(target4, prompt, HydraProposer(target4, heads, choices=choices), max_new_tokens=40)
        assert torch.equal(out.tokens, ref)


def test_medusa_hydra_command_writes_hydra_heads_that_load_back(target4, tiny_corpus, tmp_path, monkeypatch):
    """``training medusa --hydra`` end to end on the tiny target: its recipe, file, metadata, tree."""
    train_c, hold = tiny_corpus.split(0.2, seed=0)
    monkeypatch.setattr(cli, "_start", lambda args: (cli._recipe(args), train_c, hold, target4, None))
    out = tmp_path / "hydra.safetensors"
    cli.main(["medusa", "--hydra", "--hydra-width", "24", "--steps", "20", "--lr", "1e-2", "--batch-tokens", "256",
              "--out", str(out)])
    meta = medusa_metadata(out)
    assert meta["hydra"] is True and meta["hydra_width"] == 24 and meta["num_heads"] == MEDUSA.num_heads
    assert meta["steps"] == 20 and len(meta["rank_accuracy"]) == MEDUSA.num_heads
    assert meta["choices"] == [list(c) for c in derive_choices(meta["rank_accuracy"], 8)]
    assert json.loads((tmp_path / "hydra-choices.json").read_text())["8"]["choices"] == meta["choices"]
    heads = load_medusa_heads(target4, out)
    assert isinstance(heads, HydraHeads) and heads.width == 24
    p = load_medusa_proposer(target4, k=8, reduced_vocab=False, path=out)
    assert type(p) is HydraProposer and len(p.tree.choices) == 8
    prompt = torch.tensor([2, 7, 1, 8])
    ref = autoregressive_generate(target4, prompt, max_new_tokens=20).tokens
    assert torch.equal(generate(target4, prompt, p, max_new_tokens=20).tokens, ref)
    # a plain `medusa` run still writes Medusa heads, and records hydra = false
    cli.main(["medusa", "--steps", "2", "--batch-tokens", "256", "--out", str(tmp_path / "m.safetensors")])
    meta = medusa_metadata(tmp_path / "m.safetensors")
    assert meta["hydra"] is False and "hydra_width" not in meta
    assert type(load_medusa_heads(target4, tmp_path / "m.safetensors")) is MedusaHeads
