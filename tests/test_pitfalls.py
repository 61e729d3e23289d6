"""Each deliberate mistake in specdecode_ref.pitfalls fails the chi-square test the correct sampler passes.

This is what makes the distribution tests trustworthy: a test that no broken sampler can fail
proves nothing. The draws are seeded, so these are deterministic.
"""
import numpy as np
import pytest
import torch

from specdecode_ref import pitfalls
from specdecode_ref.sampling import SamplingParams, logits_to_probs
from specdecode_ref.measure.harness.stats import acceptance_probability, chi_square_pvalue, first_token_counts
from specdecode_ref.verify import rejection_sample


def dist(xs):
    t = torch.tensor(xs, dtype=torch.float64)
    return (t / t.sum()).float()


CASES = {
    "random": (dist([3, 1, 4, 1, 5, 9, 2, 6]), dist([2, 7, 1, 8, 2, 8, 1, 8])),
    "q_with_zeros": (dist([3, 1, 4, 1, 5, 9, 2, 6]), dist([0, 0, 1, 8, 0, 8, 1, 0])),
    "peaked": (dist([100, 1, 1, 1, 1, 1, 1, 1]), dist([1, 1, 1, 1, 1, 1, 1, 100])),
    "softened_copy": (torch.softmax(torch.linspace(3, -3, 12), 0), torch.softmax(torch.linspace(1.5, -1.5, 12), 0)),
}
N = 20000


@pytest.mark.parametrize("name", sorted(CASES))
def test_correct_sampler_passes(name):
    p, q = CASES[name]
    assert chi_square_pvalue(first_token_counts(p, q, N, seed=11), p) > 1e-3


@pytest.mark.parametrize("name", sorted(CASES))
def test_resample_from_target_fails(name):
    p, q = CASES[name]
    counts = first_token_counts(p, q, N, sampler=pitfalls.resample_from_target, seed=11)
    assert chi_square_pvalue(counts, p) < 1e-6


def test_resample_from_target_matches_its_predicted_law():
    """The buggy output law is min(p, q) + (1 - beta) p: the test detects exactly that shift."""
    p, q = CASES["random"]
    beta = acceptance_probability(p, q)
    wrong = torch.minimum(p, q) + (1 - beta) * p
    counts = first_token_counts(p, q, N, sampler=pitfalls.resample_from_target, seed=3)
    assert chi_square_pvalue(counts, wrong) > 1e-3


def test_resample_from_target_has_the_same_acceptance_rate():
    """Same acceptance rate as the correct sampler (the acceptance test is right; the bug is after it)."""
    p, q = CASES["random"]
    good = first_token_counts(p, q, N, seed=5, return_details=True)
    bad = first_token_counts(p, q, N, sampler=pitfalls.resample_from_target, seed=5, return_details=True)
    assert good.accepted == bad.accepted


@pytest.mark.parametrize("name", sorted(CASES))
def test_reseed_every_draw_fails(name):
    p, q = CASES[name]
    counts = first_token_counts(p, q, 5000, sampler=pitfalls.reseed_every_draw, seed=11)
    assert chi_square_pvalue(counts, p) < 1e-6


def test_reseed_every_draw_makes_the_output_a_function_of_the_draft():
    p, q = CASES["random"]
    n = 400
    gen = torch.Generator().manual_seed(0)
    drafts = torch.multinomial(q.expand(n, -1), 1, generator=gen)
    tokens, _ = pitfalls.reseed_every_draw(p.expand(n, 2, 8), drafts, q.expand(n, 1, 8), gen)
    for d in drafts.unique():
        assert tokens[drafts[:, 0] == d, 0].unique().numel() == 1
    # The correct sampler, with one generator for the whole batch, is not deterministic per draft.
    tokens_ok, _ = rejection_sample(p.expand(n, 2, 8), drafts, q.expand(n, 1, 8), gen)
    assert any(tokens_ok[drafts[:, 0] == d, 0].unique().numel() > 1 for d in drafts.unique())


def test_pitfall_samplers_keep_the_output_format():
    torch.manual_seed(0)
    b, k, v = 50, 3, 6
    p = torch.softmax(torch.randn(b, k + 1, v), -1)
    q = torch.softmax(torch.randn(b, k, v), -1)
    drafts = torch.multinomial(q.reshape(-1, v), 1).reshape(b, k)
    for sampler in (pitfalls.resample_from_target, pitfalls.reseed_every_draw):
        tokens, acc = sampler(p, drafts, q, torch.Generator().manual_seed(1))
        assert tokens.shape == (b, k + 1) and acc.shape == (b,)
        for i, (row, a) in enumerate(zip(tokens.tolist(), acc.tolist())):
            assert row[:a] == drafts[i, :a].tolist()
            assert row[a] >= 0 and all(t == -1 for t in row[a + 1:])
        tokens, acc = sampler(p, drafts, None, torch.Generator().manual_seed(1))  # deterministic drafts
        assert tokens.shape == (b, k + 1)


LOGITS = torch.linspace(4.0, -4.0, 16)  # a target with a long tail
PARAMS = SamplingParams(temperature=1.0, top_p=0.7)


def test_top_p_on_draft_side_only_fails():
    requested = logits_to_probs(LOGITS, PARAMS)
    p_used, q = pitfalls.top_p_on_one_side(LOGITS, LOGITS / 1.5, PARAMS, side="draft")
    counts = first_token_counts(p_used, q, N, seed=2)
    assert chi_square_pvalue(counts, requested) < 1e-6
    assert counts[requested.numpy() == 0].sum() > 0  # tokens outside the nucleus came out


def test_top_p_on_target_side_only_is_lossless_but_wasteful():
    requested = logits_to_probs(LOGITS, PARAMS)
    p_used, q_raw = pitfalls.top_p_on_one_side(LOGITS, LOGITS / 1.5, PARAMS, side="target")
    assert torch.equal(p_used, requested)
    one_sided = first_token_counts(p_used, q_raw, N, seed=2, return_details=True)
    assert chi_square_pvalue(one_sided.counts, requested) > 1e-3
    both = first_token_counts(requested, logits_to_probs(LOGITS / 1.5, PARAMS), N, seed=2, return_details=True)
    assert chi_square_pvalue(both.counts, requested) > 1e-3
    assert one_sided.acceptance_rate < both.acceptance_rate - 0.05


def test_top_p_on_one_side_errors():
    with pytest.raises(ValueError, match="temperature"):
        pitfalls.top_p_on_one_side(LOGITS, LOGITS, SamplingParams())
    with pytest.raises(ValueError, match="side"):
        pitfalls.top_p_on_one_side(LOGITS, LOGITS, PARAMS, side="both")
