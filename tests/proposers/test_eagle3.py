"""EAGLE-3's fused head: greedy exactness (chain and tree, tiny and real model), the head cache after
every step, the dynamic tree against its sequential oracle, the reduced draft vocabulary (its q, its
sampling law, its id map), training on fused features and the files it writes."""
import dataclasses
import json

import pytest
import torch

from support import check_joint_law, check_unrolled_matches_sequential, noisy, twins
from test_eagle import PROMPT, SCALES, CheckedEagle, OracleChecked
from specdecode_ref import SamplingParams, autoregressive_generate, generate
from specdecode_ref.proposers import eagle
from specdecode_ref.proposers.eagle import EagleHead, EagleProposer, FusedEagleHead, build_eagle_head
from specdecode_ref.proposers.vocab import VocabHead, frequent_tokens, save_vocab
from specdecode_ref.training import cli, distill, train
from specdecode_ref.training.eagle import draft_vocab_targets

LAYERS = (1, 2, 3)  # low, middle, high entries of a 4-layer target's hidden states
EVEN = torch.arange(0, 64, 2)  # a reduced draft vocabulary for the 64-token tiny targets


def good_fused_head(target, scale=0.0, seed=0, layers=(0, 1), draft_vocab=None):
    """For a ONE-layer target whose embeddings are small beside its attention output (``target1``), a
    head whose q, k and v read the token half and whose residual is (almost) nothing computes the
    target itself, read one position late (as test_eagle's good_head). A small random share of the
    fused feature (and of its own output at drafted positions) still enters through the feature half
    and, with norm_before_residual and a small hidden_norm, through the residual, so every feature
    path counts. Noise on the layer makes the head right less often, so every acceptance length
    occurs."""
    head = build_eagle_head(target, "fused", layers, draft_vocab)
    H = target.config.hidden_size
    g = torch.Generator().manual_seed(100 + seed)
    with torch.no_grad():
        head.fuse.weight.copy_(torch.randn(head.fuse.weight.shape, generator=g) / head.fuse.in_features ** 0.5)
        for name in ("q_proj", "k_proj", "v_proj"):
            w = getattr(head.layer.self_attn, name).weight
            w[:, H:] = 0.05 * torch.randn(w[:, H:].shape, generator=g) / H ** 0.5
        head.hidden_norm.weight.copy_(0.05 * torch.randn(H, generator=g))
    head.norm_before_residual = True
    noisy(head.layer, scale, seed)
    return head


@pytest.fixture(scope="module")
def target1():
    """One layer, its embeddings scaled down (RMS-normed inputs see no difference): the residual stream
    is then almost all attention output, which EAGLE-3's layer, whose residual is the feature, can
    reproduce (good_fused_head)."""
    from support import make_tiny_llama

    model = make_tiny_llama(vocab_size=64, sharpness=1.0, seed=3, layers=1, init_range=0.3)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(0.05)
    return model


def test_fused_head_shape_and_errors(target4):
    head = build_eagle_head(target4, "fused", LAYERS, EVEN)
    H = target4.config.hidden_size
    assert isinstance(head, FusedEagleHead) and head.fuse.weight.shape == (H, 3 * H) and head.fuse.bias is None
    assert torch.equal(head.draft_ids, EVEN) and head.draft_ids.dtype == torch.long
    assert EagleProposer(target4, head).vocab.size == 32  # the head's own draft vocabulary by default
    assert "fused=(1, 2, 3)" in repr(EagleProposer(target4, head))
    with pytest.raises(ValueError, match="features of size"):
        head(torch.zeros(1, 2, 2 * H), torch.zeros(1, 2, dtype=torch.long), torch.arange(2)[None], None, target4)
    with pytest.raises(ValueError, match="pass feature_layers"):
        build_eagle_head(target4, "fused")  # 4 layers: EAGLE-3's 2, N/2, N-3 are not distinct
    with pytest.raises(ValueError, match="outside"):
        head.target_features(tuple(torch.zeros(1, H) for _ in range(3)))
    with pytest.raises(ValueError, match="fused"):
        build_eagle_head(target4, draft_vocab=EVEN)  # an EAGLE-1 head has no vocabulary of its own
    with pytest.raises(ValueError, match="features must be"):
        build_eagle_head(target4, "mixed")
    assert eagle.eagle3_layers(30) == (2, 15, 27)


# --- greedy exactness and the head cache ------------------------------------------------------------

@pytest.mark.parametrize("mode", [dict(k=3), dict(k=10, tree=True, depth=4, beam=3, branch=3)], ids=["chain", "tree"])
def test_fused_greedy_exact_and_rollback_every_length(target1, mode):
    ref = autoregressive_generate(target1, PROMPT, max_new_tokens=80).tokens
    seen = set()
    for seed, scale in enumerate(SCALES):
        p = CheckedEagle(target1, good_fused_head(target1, scale, seed), **mode)
        assert torch.equal(generate(target1, PROMPT, p, max_new_tokens=80).tokens, ref)
        seen |= set(p.accepted)
    want = set(range(4)) if mode.get("tree") else set(range(mode["k"] + 1))
    assert want <= seen, f"acceptance lengths seen: {sorted(seen)}"


@pytest.mark.parametrize("mode", [dict(k=4), dict(k=12, tree=True, depth=4, beam=3, branch=3)], ids=["chain", "tree"])
def test_fused_reduced_vocab_greedy_exact(target4, mode):
    ref = autoregressive_generate(target4, PROMPT, max_new_tokens=40).tokens
    for vocab in (EVEN, None):
        head = noisy(build_eagle_head(target4, "fused", LAYERS, vocab), 0.3, 1)
        out = generate(target4, PROMPT, CheckedEagle(target4, head, **mode), max_new_tokens=40)
        assert torch.equal(out.tokens, ref)


def test_fused_tree_matches_sequential_oracle(target1, target4):
    shape = dict(k=10, depth=4, beam=3, branch=3)
    for target, head in ((target1, good_fused_head(target1, 0.2, 1)),
                         (target4, noisy(build_eagle_head(target4, "fused", LAYERS, EVEN), 0.3, 2))):
        p = OracleChecked(target, head, tree=True, **shape)
        ref = autoregressive_generate(target, PROMPT, max_new_tokens=30).tokens
        assert torch.equal(generate(target, PROMPT, p, max_new_tokens=30).tokens, ref)
        assert p.trees > 3


def test_fused_planted_bug_layers_shifted_by_one_are_caught(target4):
    """Catch up from the hidden states one layer off: greedy output stays exact (verification never
    trusts the draft), but the head cache check must fail."""

    class Shifted(CheckedEagle):
        def on_verified(self, state, outcome):
            super().on_verified(state, dataclasses.replace(outcome, hidden_states=outcome.hidden_states[1:]))

    head = noisy(build_eagle_head(target4, "fused", LAYERS), 0.3, 1)
    with pytest.raises(AssertionError):
        generate(target4, PROMPT, Shifted(target4, head, k=3), max_new_tokens=20)


class ChecksVocabMap(EagleProposer):
    """Every greedy chain draft starts with the argmax of the *full* lm_head over the draft vocabulary,
    computed here without the proposer's reduced head or its id map."""

    def propose(self, state):
        draft = super().propose(state)
        full = self.target.lm_head(self.head.readout(self._last))
        allowed = torch.full_like(full, float("-inf"))
        allowed[EVEN] = full[EVEN]
        assert int(draft.tokens[0]) == int(allowed.argmax())
        return draft


def test_draft_vocab_map_and_planted_off_by_one(target4):
    head = noisy(build_eagle_head(target4, "fused", LAYERS, EVEN), 0.3, 1)
    generate(target4, PROMPT, ChecksVocabMap(target4, head, k=3), max_new_tokens=20)
    bad = ChecksVocabMap(target4, head, k=3)
    bad.vocab.ids = torch.roll(bad.vocab.ids, 1)  # planted: index i maps to the id of index i - 1
    with pytest.raises(AssertionError):
        generate(target4, PROMPT, bad, max_new_tokens=20)


# --- on the real model -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_case(embedded):
    from specdecode_ref import chat_ids

    model, tok = embedded
    ids = chat_ids(tok, [{"role": "user", "content": "Name the three primary colours and one use of each."}])
    return ids, autoregressive_generate(model, ids, max_new_tokens=16, stop_on_eos=False).tokens


@pytest.mark.parametrize("mode", [dict(k=3), dict(k=8, tree=True, depth=4, beam=2, branch=3)], ids=["chain", "tree"])
def test_fused_head_on_the_real_model_greedy_exact(embedded, real_case, mode):
    """An untrained fused head on SmolLM2 in fp32 (EAGLE-3's layers 2, 15, 27, the shipped draft
    vocabulary): its drafts are poor, the output is exactly plain greedy."""
    from specdecode_ref.proposers.shipped import shipped_vocab

    model, _ = embedded
    ids, plain = real_case
    head = build_eagle_head(model, "fused", draft_vocab=shipped_vocab())
    assert head.feature_layers == (2, 15, 27)
    out = generate(model, ids, EagleProposer(model, head, **mode), max_new_tokens=16, stop_on_eos=False)
    assert torch.equal(out.tokens, plain)
    if not mode.get("tree"):  # the shipped EAGLE-1 file still builds an EAGLE-1 head
        assert type(eagle.load_eagle_head(model)) is EagleHead


@pytest.mark.parametrize("mode", [dict(), dict(k=8, tree=True)], ids=["chain", "tree"])
def test_shipped_eagle3_head_is_exact_and_accepts(embedded, real_case, mode):
    """The shipped EAGLE-3 head (``load_proposer("eagle3")``, the file notebook 08 serves in vLLM):
    a fused head with its own draft vocabulary, exact in fp32, and trained: it keeps drafts."""
    from specdecode_ref.proposers import load_proposer

    model, _ = embedded
    ids, plain = real_case
    p = load_proposer("eagle3", model, **mode)
    assert isinstance(p.head, FusedEagleHead) and p.head.feature_layers == (2, 15, 27)
    assert p.head.draft_ids is not None and p.vocab.size == p.head.draft_ids.numel()
    out = generate(model, ids, p, max_new_tokens=16, stop_on_eos=False)
    assert torch.equal(out.tokens, plain)
    assert out.stats.accepted > 0


# --- sampling: q over the full vocabulary ----------------------------------------------------------

SUBSET = torch.tensor([0, 2, 3, 5])


@pytest.fixture(scope="module")
def small_vocab():
    from support import make_tiny_llama

    return make_tiny_llama(vocab_size=6, sharpness=3.0, seed=2, layers=1)


class RecordsDrafts(EagleProposer):
    def propose(self, state):
        draft = super().propose(state)
        self.drafts = getattr(self, "drafts", []) + [draft]
        return draft


def test_fused_draft_q_is_a_distribution_over_the_full_vocabulary(small_vocab):
    p = RecordsDrafts(small_vocab, good_fused_head(small_vocab, 0.3, 0, draft_vocab=SUBSET), k=3)
    generate(small_vocab, torch.tensor([0, 1, 2]), p, max_new_tokens=20, sampling=SamplingParams(temperature=1.0),
             seed=1)
    outside = torch.tensor([1, 4])
    for d in p.drafts:
        assert d.probs.shape == (3, 6)
        torch.testing.assert_close(d.probs.sum(-1), torch.ones(3))
        assert bool((d.probs[:, outside] == 0).all()) and bool(torch.isin(d.tokens, SUBSET).all())
        assert bool((d.probs.gather(1, d.tokens[:, None]) > 0).all())


@twins("resample_from_p")
def test_fused_reduced_vocab_sampling_follows_target(small_vocab, bug, monkeypatch):
    """Rejection sampling with q zero outside the draft vocabulary still samples the target exactly,
    tokens outside it included (they come from the residual distribution)."""
    head = good_fused_head(small_vocab, 0.3, 0, draft_vocab=SUBSET)
    prompt = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    factory = lambda: EagleProposer(small_vocab, head, k=2)  # noqa: E731
    check_joint_law(monkeypatch, bug, small_vocab, prompt, factory, SamplingParams(temperature=1.0), n=1000)


# --- training ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fused_corpus(target4, tiny_corpus):
    """The tiny corpus scored again, now keeping the fused features of LAYERS."""
    pairs = [(ids[:st], ids[st:]) for ids, st in zip(tiny_corpus.ids, tiny_corpus.start)]
    return distill.teacher_pass(target4, pairs, top_k=8, keep_hidden=True, batch_tokens=256, fused_layers=LAYERS)


@pytest.fixture(scope="module")
def vocab24(fused_corpus):
    return frequent_tokens(distill.token_counts(fused_corpus, 64), 24)


@pytest.fixture(scope="module")
def fused_trained(target4, fused_corpus, vocab24):
    train_c, hold = fused_corpus.split(0.2, seed=0)
    return train.train_eagle(target4, train_c, steps=40, lr=3e-3, batch_tokens=256, holdout=hold, features="fused",
                             draft_vocab=vocab24)


def test_teacher_pass_stores_fused_features(target4, tiny_corpus, fused_corpus, tmp_path):
    c = fused_corpus
    assert c.meta["fused_layers"] == list(LAYERS) and len(c.fused) == len(c.ids)
    for i in (0, 7):
        with torch.no_grad():
            hs = target4.model(input_ids=c.ids[i][None], output_hidden_states=True).hidden_states
        want = torch.cat([hs[j][0] for j in LAYERS], dim=-1)
        assert c.fused[i].dtype == torch.bfloat16 and c.fused[i].shape == want.shape
        torch.testing.assert_close(c.fused[i].float(), want, atol=2e-2, rtol=1e-2)
        torch.testing.assert_close(c.hidden[i], tiny_corpus.hidden[i])  # the final state is what it was
    back = distill.Corpus.load(c.save(tmp_path / "c.pt"))
    assert torch.equal(back.fused[3], c.fused[3]) and back.meta["fused_layers"] == list(LAYERS)
    tr, ho = back.split(0.2, seed=0)
    assert len(tr.fused) == len(tr) and len(ho.fused) == len(ho)
    # a corpus written before fused features existed still loads
    old = tmp_path / "old.pt"
    torch.save({"version": distill.CORPUS_VERSION, "ids": c.ids, "start": c.start, "topk_ids": c.topk_ids,
                "topk_logp": c.topk_logp, "hidden": c.hidden, "meta": {"top_k": 8}}, old)
    assert distill.Corpus.load(old).fused is None


def test_draft_vocab_targets_and_planted_off_by_one():
    """The target's top-k seen from the draft vocabulary: a drafter whose log-probabilities are the
    target's own (renormalised over the vocabulary) reaches the minimum, its entropy; a map off by one
    index must not."""
    ids = torch.tensor([1, 3, 4, 7, 8])
    vocab = VocabHead(torch.randn(10, 4), ids)
    t_ids = torch.tensor([[3, 1, 2], [2, 3, 4], [8, 7, 9], [4, 8, 1]])
    t_logp = torch.log_softmax(torch.tensor([[2.0, 1.0, 0.5], [2.0, 1.5, 0.0], [1.0, 0.2, 0.1], [3.0, 0.0, -1.0]]), -1)

    def gap(targets):
        index, logp, keep = targets(t_ids, t_logp, vocab)
        assert keep.tolist() == [True, False, True, True]
        p = {}  # the perfect drafter, built from the ids directly
        logits = torch.full((int(keep.sum()), len(ids)), -30.0)
        for r, row in enumerate(t_ids[keep]):
            for tok, lp in zip(row.tolist(), t_logp[keep][r].tolist()):
                if tok in ids.tolist():
                    logits[r, ids.tolist().index(tok)] = lp
            p[r] = torch.softmax(logits[r], -1)
        entropy = -sum(float((p[r] * torch.log_softmax(logits[r], -1)).sum()) for r in p) / len(p)
        return float(distill.soft_cross_entropy(logits, index, logp)) - entropy

    index, logp, _ = draft_vocab_targets(t_ids, t_logp, vocab)
    assert torch.equal(ids[index[0, :2]], t_ids[0, :2]) and logp[0, 2] == float("-inf")
    assert abs(gap(draft_vocab_targets)) < 1e-4
    off_by_one = lambda *a: (lambda i, lp, k: ((i + 1) % len(ids), lp, k))(*draft_vocab_targets(*a))  # noqa: E731
    assert gap(off_by_one) > 0.5


def mean(xs):
    return sum(xs) / len(xs)


def test_fused_training_lowers_the_loss(target4, fused_corpus, fused_trained, vocab24):
    head, res = fused_trained
    before, after = res.heldout["before"], res.heldout["after"]
    print(res.heldout)
    assert isinstance(head, FusedEagleHead) and torch.equal(head.draft_ids, vocab24)
    assert "feature_loss" not in after and after["loss"] == pytest.approx(after["token_loss"])  # tokens only
    assert after["loss"] < 0.95 * before["loss"]
    assert 0.0 < after["in_vocab"] < 1.0 and after["agreement"] <= after["in_vocab"]
    assert mean(res.losses[-5:]) < mean(res.losses[:5])
    assert not any(p.requires_grad for p in head.parameters())
    assert not any(p.requires_grad for p in target4.parameters())
    # a planted bug, lr = 0, must not pass the same check
    train_c, hold = fused_corpus.split(0.2, seed=0)
    _, flat = train.train_eagle(target4, train_c, steps=5, lr=0.0, batch_tokens=256, holdout=hold, features="fused",
                                draft_vocab=vocab24)
    assert not flat.heldout["after"]["loss"] < 0.95 * flat.heldout["before"]["loss"]


def test_fused_unrolled_training_matches_inference_drafting(target4):
    """Training-time test with the fused head: step 1 reads the fused features, later steps its own
    outputs [H], exactly as drafting does (one batched unrolled forward vs a fresh cache per row)."""
    head = noisy(build_eagle_head(target4, "fused", LAYERS), 0.3, 1)
    g = torch.Generator().manual_seed(0)
    q, H = 8, target4.config.hidden_size
    check_unrolled_matches_sequential(head, target4, torch.randn(1, q, 3 * H, generator=g),
                                      torch.randint(0, 64, (1, q), generator=g), steps=3)


def test_fused_unrolled_training_reports_every_step(target4, fused_corpus, fused_trained):
    train_c, hold = fused_corpus.split(0.2, seed=0)
    head, res = train.train_eagle(target4, train_c, steps=3, lr=1e-3, batch_tokens=256, holdout=hold, unroll=3,
                                  init=fused_trained[0])
    after = res.heldout["after"]
    assert isinstance(head, FusedEagleHead) and 0.0 <= after["agreement_2"] <= 1.0 and after["tokens"] > 0
    # fine-tuning starts from the given head
    assert res.heldout["before"]["loss"] == pytest.approx(fused_trained[1].heldout["after"]["loss"], rel=1e-4)


def test_fused_training_needs_fused_features(target4, tiny_corpus, fused_corpus):
    with pytest.raises(ValueError, match="fused-features"):
        train.train_eagle(target4, tiny_corpus, steps=1, features="fused")
    head = build_eagle_head(target4, "fused", (0, 2, 4))
    with pytest.raises(ValueError, match="layers"):
        train.train_eagle(target4, fused_corpus, steps=1, init=head)


def test_fused_save_and_load_roundtrip(target4, fused_trained, vocab24, tmp_path):
    head, _ = fused_trained
    path = eagle.save_eagle(head, tmp_path / "e3.safetensors", {"note": "test"})
    meta = eagle.eagle_metadata(path)
    assert meta["format"] == eagle.EAGLE3_FORMAT and meta["features"] == "fused" and meta["note"] == "test"
    assert json.loads(meta["feature_layers"]) == list(LAYERS) and int(meta["draft_vocab_size"]) == len(vocab24)
    loaded = eagle.load_eagle_weights(target4, path)
    assert isinstance(loaded, FusedEagleHead) and loaded.feature_layers == LAYERS
    assert torch.equal(loaded.draft_ids, vocab24)  # ids stored exactly, not in bf16
    for (k1, v1), (k2, v2) in zip(head.state_dict().items(), loaded.state_dict().items()):
        assert k1 == k2
        if v1.is_floating_point():
            torch.testing.assert_close(v2, v1.to(torch.bfloat16).float())
    assert not any(p.requires_grad for p in loaded.parameters())
    ref = autoregressive_generate(target4, PROMPT, max_new_tokens=30).tokens
    for mode in (dict(k=3), dict(k=8, tree=True)):
        p = EagleProposer(target4, loaded, **mode)
        assert p.vocab.size == len(vocab24)
        assert torch.equal(generate(target4, PROMPT, p, max_new_tokens=30).tokens, ref)


def test_fused_cli_adds_features_then_trains(target4, tiny_corpus, fused_corpus, vocab24, tmp_path, monkeypatch):
    """``fused-features`` then ``eagle --features fused`` end to end, on the tiny target."""
    corpus_path = tiny_corpus.save(tmp_path / "corpus.pt")
    monkeypatch.setattr(cli, "load_target", lambda dtype="fp32": (target4, None))
    with pytest.raises(ValueError, match="fused-features"):
        train.main(["--corpus", str(corpus_path), "eagle", "--features", "fused", "--draft-vocab", "full",
                    "--steps", "1"])
    train.main(["--corpus", str(corpus_path), "fused-features", "--layers", "1,2,3"])
    c = distill.Corpus.load(corpus_path)
    assert c.meta["fused_layers"] == list(LAYERS) and torch.equal(c.topk_ids[2], tiny_corpus.topk_ids[2])
    torch.testing.assert_close(c.fused[2], fused_corpus.fused[2])
    vocab_path = save_vocab(vocab24, tmp_path / "v.safetensors")
    out = tmp_path / "e3.safetensors"
    train.main(["--corpus", str(corpus_path), "eagle", "--features", "fused", "--draft-vocab", str(vocab_path),
                "--steps", "3", "--unroll-steps", "2", "--batch-tokens", "256", "--out", str(out)])
    meta = eagle.eagle_metadata(out)
    assert meta["features"] == "fused" and meta["draft_vocab"] == "v.safetensors" and meta["feature_weight"] == "0.0"
    assert "agreement_2" in json.loads(meta["heldout"])["after_stage_1"]
    assert (tmp_path / "e3-loss.png").exists()
    assert torch.equal(eagle.load_eagle_weights(target4, out).draft_ids, vocab24)
