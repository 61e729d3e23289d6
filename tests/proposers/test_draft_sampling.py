"""The drafting regime (proposers.DRAFT_SAMPLING): drafting from q and drafting the argmax with
one-hot q are both lossless at T > 0 (chi-square on the joint law of three tokens), reporting the
drafter's softmax for an argmax token is caught, and drafters without a q refuse "sample"."""
import pytest
import torch

from support import check_joint_law, make_tiny_llama, noisy, sampled_joint_pvalue, twins
from test_eagle import good_head
from test_medusa import random_heads
from specdecode_ref import SamplingParams, autoregressive_generate, generate
from specdecode_ref.proposers import DecodeState, drafting, load_proposer
from specdecode_ref.proposers.draft_model import DraftModelProposer, build_draft_model
from specdecode_ref.proposers.eagle import EagleProposer
from specdecode_ref.proposers.early_exit import EarlyExitProposer, build_adapter
from specdecode_ref.proposers.medusa import MedusaProposer

PROMPT = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
REGIMES = [SamplingParams(temperature=0.7, top_p=0.95), SamplingParams(temperature=1.0)]
REGIME_IDS = ["T0.7-top_p0.95", "T1"]


@pytest.fixture(scope="module")
def small2():
    return make_tiny_llama(vocab_size=6, sharpness=3.0, seed=2, layers=2)


@pytest.fixture(scope="module")
def small1():
    """One layer: good_head makes an EAGLE head that is usually right on it."""
    return make_tiny_llama(vocab_size=6, sharpness=3.0, seed=2, layers=1)


def draft_of(target):
    """A one-layer draft that is right only sometimes (noise on its own layer, never on the
    embeddings and lm_head it shares with the target)."""
    draft = build_draft_model(target, (1,))
    noisy(draft.model.layers, 0.5, 0)
    return draft


# --- greedy drafting is lossless -------------------------------------------------------------------

@pytest.mark.parametrize("sampling", REGIMES, ids=REGIME_IDS)
@twins("resample_from_p")
def test_draft_model_greedy_drafting_follows_target(small2, sampling, bug, monkeypatch):
    draft = draft_of(small2)
    factory = lambda: DraftModelProposer(draft, k=2, draft_sampling="greedy")  # noqa: E731
    check_joint_law(monkeypatch, bug, small2, PROMPT, factory, sampling, batch_twin=True)


@pytest.mark.parametrize("sampling", REGIMES, ids=REGIME_IDS)
def test_eagle_chain_greedy_drafting_follows_target(small1, sampling):
    head = good_head(small1, 0.3, 0)
    factory = lambda: EagleProposer(small1, head, k=2, draft_sampling="greedy")  # noqa: E731
    assert sampled_joint_pvalue(small1, PROMPT, factory, sampling) > 1e-3


def test_medusa_chain_sampled_drafting_follows_target(small2):
    """Medusa's heads can sample too: each head's q is independent of the tokens before it."""
    heads = random_heads(small2, 2, 1.0, seed=1)
    factory = lambda: MedusaProposer(small2, heads, draft_sampling="sample")  # noqa: E731
    assert sampled_joint_pvalue(small2, PROMPT, factory, REGIMES[0], n=2500) > 1e-3


def test_planted_bug_argmax_reported_with_the_drafters_softmax_is_caught(small2, monkeypatch):
    """Propose the argmax but report q = the drafter's softmax (as if it had been sampled): the
    test accepts a* with probability p(a*)/q(a*) instead of p(a*) and the residual misses a*,
    so a* comes out with the wrong probability. The distribution test must fail."""
    real = drafting.choose_token

    def argmax_with_softmax_q(logits, state, vocab=None, widen=None, draft_sampling="sample"):
        _, q = real(logits, state, vocab, widen, "sample")
        return real(logits, state, vocab, widen, "greedy")[0], q

    monkeypatch.setattr(drafting, "choose_token", argmax_with_softmax_q)
    draft = draft_of(small2)
    factory = lambda: DraftModelProposer(draft, k=2, draft_sampling="greedy")  # noqa: E731
    assert sampled_joint_pvalue(small2, PROMPT, factory, REGIMES[1], n=2000) < 1e-6


# --- what each regime proposes ------------------------------------------------------------------------

def first_draft(target, proposer, sampling):
    """The proposer's first draft after the prompt (the engine's own first step)."""
    from specdecode_ref.measure.harness.compare import probe_step

    return probe_step(target, proposer, PROMPT, sampling=sampling).draft


def test_greedy_drafting_reports_no_q_and_proposes_the_argmax(small2):
    draft = draft_of(small2)
    sampled = first_draft(small2, DraftModelProposer(draft, k=3), REGIMES[1])
    greedy = first_draft(small2, DraftModelProposer(draft, k=3, draft_sampling="greedy"), REGIMES[1])
    assert sampled.probs is not None and sampled.probs.shape == (3, 6)
    assert greedy.probs is None
    # the argmax chain does not depend on the temperature: the same as at T = 0
    at_zero = first_draft(small2, DraftModelProposer(draft, k=3), SamplingParams())
    assert torch.equal(greedy.tokens, at_zero.tokens)


def test_greedy_drafting_at_temperature_zero_equals_plain_greedy(small2):
    ref = autoregressive_generate(small2, PROMPT, max_new_tokens=20).tokens
    for p in (DraftModelProposer(draft_of(small2), k=3, draft_sampling="greedy"),
              EarlyExitProposer(small2, noisy(build_adapter(small2, 1), 0.5, 0), k=3, draft_sampling="greedy")):
        assert torch.equal(generate(small2, PROMPT, p, max_new_tokens=20).tokens, ref)


def test_batched_draft_model_honours_greedy_drafting(small2):
    """generate_batch drafts for all rows at once (proposers/batch.py): it keeps the regime."""
    p = DraftModelProposer(draft_of(small2), k=2, draft_sampling="greedy")
    batch = p.batch_proposer()
    gens = [torch.Generator().manual_seed(i) for i in range(2)]
    states = [DecodeState(target=small2, sampling=REGIMES[1], generator=g, prompt_len=len(PROMPT),
                          token_list=PROMPT.tolist()) for g in gens]
    batch.begin(states)
    drafts = batch.propose(states)
    single = DraftModelProposer(p.model, k=2, draft_sampling="greedy")
    single.begin(states[0])
    single = single.propose(states[0])
    for d in drafts:
        assert d.probs is None
        assert torch.equal(d.tokens.cpu(), single.tokens.cpu())


# --- defaults and refusals ----------------------------------------------------------------------

def test_defaults_and_refusals(small1, small2):
    assert DraftModelProposer(draft_of(small2)).draft_sampling == "sample"
    assert EagleProposer(small1, good_head(small1)).draft_sampling == "sample"
    assert EagleProposer(small1, good_head(small1), tree=True).draft_sampling == "greedy"
    heads = random_heads(small2, 2)
    assert MedusaProposer(small2, heads).draft_sampling == "greedy"  # Medusa-1 proposes top-1 tokens
    assert MedusaProposer(small2, heads, choices=[(0,), (1,)]).draft_sampling == "greedy"
    assert load_proposer("ngram").draft_sampling == "greedy"
    with pytest.raises(ValueError, match="deterministic candidates"):
        EagleProposer(small1, good_head(small1), tree=True, draft_sampling="sample")
    with pytest.raises(ValueError, match="deterministic candidates"):
        MedusaProposer(small2, heads, choices=[(0,), (1,)], draft_sampling="sample")
    with pytest.raises(ValueError, match="deterministic candidates"):
        load_proposer("ngram", draft_sampling="sample")
    with pytest.raises(ValueError, match="draft_sampling must be one of"):
        DraftModelProposer(draft_of(small2), draft_sampling="argmax")
