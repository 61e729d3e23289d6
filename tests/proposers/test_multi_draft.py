"""Independent drafts verified as one tree: lossless (joint law, with planted twins), one draft is
the inner drafter unchanged, greedy requests get one chain, and the wrapper refuses drafters it
cannot use."""
from __future__ import annotations

import copy

import pytest
import torch

from support import RandomDraftProposer, check_joint_law, make_tiny_llama, noisy, twins

from specdecode_ref import SamplingParams, generate, generate_batch
from specdecode_ref.proposers import load_proposer
from specdecode_ref.proposers.draft_model import DraftModelProposer, build_draft_model
from specdecode_ref.proposers.multi_draft import IndependentDrafts


@pytest.fixture(scope="module")
def small_vocab():
    return make_tiny_llama(vocab_size=6, sharpness=3.0, seed=2, layers=2)


def _draft(target, scale=0.5, seed=0):
    return noisy(build_draft_model(copy.deepcopy(target), (1,)), scale, seed)


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.7, top_k=3)])
@twins("resample_from_p")
def test_three_sampled_drafts_follow_the_target(small_vocab, sampling, bug, monkeypatch):
    """Three chains of two tokens drawn from a q far from the target's (so that first tries are
    often rejected and later siblings matter), side by side under the root; the first three
    tokens' joint law against enumeration. Twin: the tree verifier resampling from p after a
    rejection instead of from the residual, which only a rejected first try reaches."""
    prompt = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])

    def factory():
        drafter = RandomDraftProposer(2, 6, seed=1)
        drafter.draft_sampling = "sample"  # its tokens are draws from its q
        return IndependentDrafts(drafter, num_drafts=3)

    check_joint_law(monkeypatch, bug, small_vocab, prompt, factory, sampling, batch_twin=True)


def test_one_draft_is_the_drafter_itself_and_greedy_gets_one_chain(tiny_model):
    draft = _draft(tiny_model, 0.3)
    prompt = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    sampled = SamplingParams(temperature=1.0)
    alone = generate(tiny_model, prompt, DraftModelProposer(draft, k=3), max_new_tokens=30, sampling=sampled, seed=4)
    one = generate(tiny_model, prompt, IndependentDrafts(DraftModelProposer(draft, k=3), 1), max_new_tokens=30,
                   sampling=sampled, seed=4)
    assert one.tokens.tolist() == alone.tokens.tolist() and one.stats.accepted == alone.stats.accepted
    greedy = generate(tiny_model, prompt, DraftModelProposer(draft, k=3), max_new_tokens=30)
    many = generate(tiny_model, prompt, IndependentDrafts(DraftModelProposer(draft, k=3), 4), max_new_tokens=30)
    assert many.tokens.tolist() == greedy.tokens.tolist() and many.stats.drafted == greedy.stats.drafted


def test_several_drafts_are_tried_and_rows_of_a_batch_match_generate(tiny_model):
    draft = _draft(tiny_model, 0.3)
    prompts = [torch.tensor([3, 1, 4, 1, 5]), torch.tensor([2, 7, 1, 8, 2, 8, 1])]
    sampled = SamplingParams(temperature=1.0)
    proposer = IndependentDrafts(DraftModelProposer(draft, k=2), 3)
    rows = generate_batch(tiny_model, prompts, proposer=proposer, max_new_tokens=24, sampling=sampled, seed=5)
    for i, p in enumerate(prompts):
        alone = generate(tiny_model, p, IndependentDrafts(DraftModelProposer(draft, k=2), 3), max_new_tokens=24,
                         sampling=sampled, seed=5 + i)
        assert alone.tokens.tolist() == rows[i].tokens.tolist()
        # Up to 3 chains of 2: each step verifies a tree of up to 6 nodes, at most one chain deep.
        assert alone.stats.drafted > 2 * alone.stats.steps and max(alone.stats.accepted_lengths) <= 2


def test_refuses_what_it_cannot_draft_from(tiny_model):
    with pytest.raises(ValueError, match="num_drafts"):
        IndependentDrafts(DraftModelProposer(_draft(tiny_model), k=2), 0)
    with pytest.raises(ValueError, match="sampled from q"):
        IndependentDrafts(load_proposer("ngram", k=3), 2)
