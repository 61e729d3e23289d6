"""Lab 1 grading tests (visible): the checks the notebook walks you through.

Run them with ``python -m specdecode_ref.grading labs/lab01_rejection_sampler --visible-only``
(your student.py) or add ``--reference``. The distribution tests use fixed seeds and a
chi-square test at significance 1e-4: a correct sampler fails one with probability about 1e-4.
"""
import numpy as np
import torch
from scipy import stats

from specdecode_ref.grading import chi2_pvalue, lab_fixture, points

lab = lab_fixture(__file__)
REFERENCE_PATTERNS = [r"specdecode_ref\.verify\b[^\n]*"]  # the grader flags submissions that use the reference
SIGNIFICANCE = 1e-4
N = 40_000  # samples per distribution test, drawn in one batched call


def dist(*xs):
    t = torch.tensor(xs, dtype=torch.float32)
    return t / t.sum()


P_RANDOM = dist(3, 1, 4, 1, 5, 9, 2, 6)
Q_RANDOM = dist(2, 7, 1, 8, 2, 8, 1, 8)


def one_step(lab, p, q, n=N, seed=0, draft_token=None):
    """K = 1 with p at both positions: the draft is sampled from q (or fixed to draft_token with
    draft_probs=None); returns (tokens [n, 2], num_accepted [n], drafts [n, 1])."""
    v = p.numel()
    gen = torch.Generator().manual_seed(seed)
    target = p.expand(n, 2, v).contiguous()
    if draft_token is None:
        drafts = torch.multinomial(q.expand(n, v), 1, replacement=True, generator=gen)
        draft_probs = q.expand(n, 1, v).contiguous()
    else:
        drafts = torch.full((n, 1), draft_token, dtype=torch.long)
        draft_probs = None
    tokens, acc = lab.rejection_sample(target, drafts, draft_probs, generator=gen)
    return tokens, acc, drafts


def counts(tokens, v):
    t = torch.as_tensor(tokens).long()
    assert (t >= 0).all() and (t < v).all(), "emitted a token id outside 0..V-1"
    return np.bincount(t.numpy(), minlength=v)


@points(2)
def test_accept_mask_examples(lab):
    """accept_mask: accept where u < p/q (u * q < p)."""
    p = torch.tensor([0.50, 0.20, 0.00, 0.90, 0.10])
    q = torch.tensor([0.25, 0.40, 0.30, 0.90, 0.20])
    u = torch.tensor([0.99, 0.51, 0.00, 0.50, 0.49])
    out = lab.accept_mask(p, q, u)
    assert out.dtype == torch.bool, f"return a bool tensor, got {out.dtype}"
    assert out.tolist() == [True, False, False, True, True]


@points(2)
def test_accepted_length_examples(lab):
    """accepted_length: the length of the leading run of True."""
    accept = torch.tensor([[True, True, False, True], [False, True, True, True],
                           [True, True, True, True], [False, False, False, False]])
    out = lab.accepted_length(accept)
    assert out.tolist() == [2, 0, 4, 0]
    assert not out.dtype.is_floating_point and out.dtype != torch.bool, f"return integers, got {out.dtype}"


@points(2)
def test_residual_distribution_example(lab):
    """residual_distribution: max(p - q, 0) renormalised."""
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.2, 0.5, 0.1, 0.2])
    out = lab.residual_distribution(p, q)
    torch.testing.assert_close(out.float(), torch.tensor([0.75, 0.0, 0.25, 0.0]))


@points(3)
def test_output_format(lab):
    """rejection_sample: shapes, dtype, accepted prefix = drafts, one extra token, then -1."""
    g = torch.Generator().manual_seed(5)
    b, k, v = 256, 3, 6
    p = torch.softmax(torch.randn(b, k + 1, v, generator=g), -1)
    q = torch.softmax(torch.randn(b, k, v, generator=g), -1)
    drafts = torch.multinomial(q.reshape(-1, v), 1, generator=g).reshape(b, k)
    tokens, n = lab.rejection_sample(p, drafts, q, generator=g)
    assert tuple(tokens.shape) == (b, k + 1) and tokens.dtype == torch.long, (tokens.shape, tokens.dtype)
    assert tuple(n.shape) == (b,) and not n.dtype.is_floating_point, (n.shape, n.dtype)
    assert ((n >= 0) & (n <= k)).all()
    for row in range(b):
        m = int(n[row])
        assert tokens[row, :m].tolist() == drafts[row, :m].tolist(), f"row {row}: accepted tokens must be the drafts"
        assert 0 <= int(tokens[row, m]) < v, f"row {row}: missing the recovered/bonus token at position {m}"
        assert (tokens[row, m + 1:] == -1).all(), f"row {row}: positions after the extra token must be -1"
    assert (n == k).any() and (n < k).any(), "with these p and q some rows accept everything and some do not"


@points(4)
def test_first_token_follows_p(lab):
    """The first emitted token is distributed as p (chi-square)."""
    tokens, _, _ = one_step(lab, P_RANDOM, Q_RANDOM, seed=1)
    c = counts(tokens[:, 0], 8)
    assert chi2_pvalue(c, P_RANDOM.numpy()) > SIGNIFICANCE, f"counts {c.tolist()} do not follow p"


@points(3)
def test_acceptance_rate_is_overlap(lab):
    """A draft x ~ q is accepted with probability sum_x min(p(x), q(x)) (binomial test)."""
    _, acc, _ = one_step(lab, P_RANDOM, Q_RANDOM, seed=2)
    beta = float(torch.minimum(P_RANDOM, Q_RANDOM).sum())
    k = int((acc == 1).sum())
    pval = stats.binomtest(k, N, beta).pvalue
    assert pval > SIGNIFICANCE, f"acceptance rate {k / N:.4f}, expected {beta:.4f}"
