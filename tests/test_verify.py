"""Verification: exact cases for greedy, and distribution tests for rejection sampling."""
import numpy as np
import pytest
import torch

from support import CHAIN_BUGS, assert_law, chi2_pvalue, twins
from specdecode_ref.verify import greedy_verify, rejection_sample


def logits_with_argmax(argmaxes, vocab=10):
    out = torch.zeros(len(argmaxes), len(argmaxes[0]), vocab)
    for b, row in enumerate(argmaxes):
        for i, t in enumerate(row):
            out[b, i, t] = 5.0
    return out


def test_greedy_verify_cases():
    target = logits_with_argmax([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
    drafts = torch.tensor([[1, 2, 3], [1, 9, 3], [7, 2, 3]])
    tokens, n = greedy_verify(target, drafts)
    assert n.tolist() == [3, 1, 0]
    assert tokens.tolist() == [[1, 2, 3, 4], [1, 2, -1, -1], [1, -1, -1, -1]]


def test_greedy_verify_padding_never_accepted():
    target = logits_with_argmax([[1, 2, 3]])
    tokens, n = greedy_verify(target, torch.tensor([[1, -1]]))
    assert n.tolist() == [1] and tokens.tolist() == [[1, 2, -1]]


def test_shape_errors():
    with pytest.raises(ValueError, match="does not match"):
        greedy_verify(torch.zeros(1, 3, 5), torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="vocabulary"):
        rejection_sample(torch.full((1, 2, 5), 0.2), torch.tensor([[7]]))
    with pytest.raises(ValueError, match="draft_probs"):
        rejection_sample(torch.full((1, 2, 5), 0.2), torch.tensor([[1]]), torch.full((1, 1, 4), 0.25))


def first_token_counts(p, q, n, sampler=rejection_sample, seed=0, deterministic_token=None):
    """Sample the first emitted token n times in one batch; q is the draft distribution."""
    v = p.numel()
    gen = torch.Generator().manual_seed(seed)
    target = torch.stack([p, p]).expand(n, 2, v).contiguous()
    if deterministic_token is None:
        drafts = torch.multinomial(q.expand(n, v), 1, replacement=True, generator=gen)
        draft_probs = q.expand(n, 1, v).contiguous()
    else:
        drafts = torch.full((n, 1), deterministic_token, dtype=torch.long)
        draft_probs = None
    tokens, _ = sampler(target, drafts, draft_probs, generator=gen)
    return np.bincount(tokens[:, 0].numpy(), minlength=v)


def _dist(xs):
    t = torch.tensor(xs, dtype=torch.float32)
    return t / t.sum()


CASES = {
    "random": (_dist([3, 1, 4, 1, 5, 9, 2, 6]), _dist([2, 7, 1, 8, 2, 8, 1, 8])),
    "q_with_zeros": (_dist([3, 1, 4, 1, 5, 9, 2, 6]), _dist([0, 0, 1, 8, 0, 8, 1, 0])),
    "p_with_zeros": (_dist([0, 1, 4, 0, 5, 0, 2, 6]), _dist([2, 7, 1, 8, 2, 8, 1, 8])),
    "p_equals_q": (_dist([3, 1, 4, 1, 5, 9, 2, 6]), _dist([3, 1, 4, 1, 5, 9, 2, 6])),
    "p_le_q_support": (_dist([1, 1, 0, 0, 0, 0, 0, 0]), _dist([1, 1, 1, 1, 0, 0, 0, 0])),
    "disjoint": (_dist([1, 1, 0, 0, 0, 0, 0, 0]), _dist([0, 0, 1, 1, 1, 0, 0, 0])),
    "peaked": (_dist([100, 1, 1, 1, 1, 1, 1, 1]), _dist([1, 1, 1, 1, 1, 1, 1, 100])),
}


# The planted twin of each case: a bug that changes the law there (p_equals_q has none: with
# q = p nothing is ever rejected, so no verification bug can show; p <= q on its support and
# disjoint supports leave the residual equal to p, so only a wrong acceptance test shows there).
TWIN = {"random": "resample_from_p", "q_with_zeros": "resample_from_p", "p_with_zeros": "always_accept",
        "p_le_q_support": "always_accept", "disjoint": "always_accept", "peaked": "resample_from_p"}


@pytest.mark.parametrize("name,bug", [pytest.param(n, None, id=n) for n in sorted(CASES)]
                         + [pytest.param(n, TWIN[n], id=f"{n}-planted-{TWIN[n]}") for n in sorted(TWIN)])
def test_rejection_sample_preserves_p(name, bug):
    # One fixed seed per case (its place in the sorted names): str hashes change from process to
    # process, which would make a rare failure impossible to reproduce.
    p, q = CASES[name]
    sampler = CHAIN_BUGS[bug] if bug else rejection_sample
    counts = first_token_counts(p, q, 20000, sampler=sampler, seed=sorted(CASES).index(name))
    assert_law(chi2_pvalue(counts, p.numpy()), bug)


@pytest.mark.parametrize("token", [0, 5, 7])
@twins("resample_from_p")
def test_deterministic_draft_preserves_p(token, bug):
    p = _dist([3, 1, 4, 1, 5, 9, 2, 6])
    sampler = CHAIN_BUGS[bug] if bug else rejection_sample
    counts = first_token_counts(p, None, 20000, sampler=sampler, deterministic_token=token, seed=token)
    assert_law(chi2_pvalue(counts, p.numpy()), bug)


@pytest.mark.parametrize("bug,positions", [(None, range(4)), ("q_of_first_position", [1, 2]),
                                           ("bonus_off_by_one", [3])])
def test_every_position_and_bonus_preserve_p(bug, positions):
    """With K = 3, the token emitted at each position (given that it is reached) follows p there;
    each twin's bug fails at the positions it breaks (later drafts checked against q_0; the bonus
    drawn from p_{K-1})."""
    torch.manual_seed(1)
    v, k, n = 6, 3, 30000
    p = torch.softmax(torch.randn(k + 1, v) * 1.5, -1)
    q = torch.softmax(torch.randn(k, v) * 1.5, -1)
    gen = torch.Generator().manual_seed(3)
    drafts = torch.stack([torch.multinomial(q[i], n, replacement=True, generator=gen) for i in range(k)], 1)
    sampler = CHAIN_BUGS[bug] if bug else rejection_sample
    tokens, acc = sampler(p.expand(n, k + 1, v), drafts, q.expand(n, k, v), gen)
    # Position 0 is always emitted; later positions are emitted when the previous was accepted,
    # which depends on the earlier tokens only, so the conditional law there is still p_i.
    for i in positions:
        emitted = tokens[:, i][tokens[:, i] >= 0]
        assert_law(chi2_pvalue(np.bincount(emitted.numpy(), minlength=v), p[i].numpy()), bug)
    assert (acc == k).any() and (acc == 0).any()


def test_zero_residual_gives_no_nan():
    p = _dist([1, 1, 0, 0])
    target = p.expand(1000, 2, 4).contiguous()
    # A drafter whose q equals p but a rounding error makes p < q on the drafted token.
    q = (p + torch.tensor([1e-7, 0, 0, 0])).expand(1000, 1, 4).contiguous()
    tokens, _ = rejection_sample(target, torch.zeros(1000, 1, dtype=torch.long), q,
                                 torch.Generator().manual_seed(0))
    assert (tokens[:, 0] >= 0).all() and (tokens[:, 0] <= 1).all()


def test_all_accepted_emits_bonus_from_last_position():
    p = torch.tensor([[[0, 1.0, 0], [0, 0, 1.0]]])
    tokens, n = rejection_sample(p, torch.tensor([[1]]), None, torch.Generator().manual_seed(0))
    assert n.tolist() == [1] and tokens.tolist() == [[1, 2]]


@twins("padding_in_residual")
def test_padded_draft_samples_from_p(bug):
    p = _dist([1, 2, 3, 4])
    target = p.expand(20000, 2, 4).contiguous()
    sampler = CHAIN_BUGS[bug] if bug else rejection_sample
    tokens, n = sampler(target, torch.full((20000, 1), -1), None, torch.Generator().manual_seed(0))
    assert (n == 0).all()
    assert_law(chi2_pvalue(np.bincount(tokens[:, 0].numpy(), minlength=4), p.numpy()), bug)
