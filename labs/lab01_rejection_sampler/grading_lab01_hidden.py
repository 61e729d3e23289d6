"""Lab 1 grading tests (hidden): edge cases the notebook does not show.

Zeros in p or q, p <= q, disjoint supports, deterministic drafters, every position and the bonus
token, padding, batches with different rows, K = 0, the zero-residual guard, shape errors and the
use of the generator.
"""
import numpy as np
import pytest
import torch

from grading_lab01 import N, P_RANDOM, Q_RANDOM, SIGNIFICANCE, counts, dist, one_step
from specdecode_ref.grading import chi2_pvalue, lab_fixture, points

lab = lab_fixture(__file__)


@points(1)
def test_accept_mask_edge_cases(lab):
    """accept_mask: p >= q always passes, p = 0 never does, q = 0 < p passes; shapes kept."""
    u = torch.tensor([0.0, 0.5, 0.999999, 0.999999, 0.0, 0.7])
    p = torch.tensor([0.3, 0.3, 0.3, 0.5, 0.0, 0.2])
    q = torch.tensor([0.3, 0.2, 0.1, 0.5, 0.4, 0.0])
    assert lab.accept_mask(p, q, u).tolist() == [True, True, True, True, False, True]
    g = torch.Generator().manual_seed(0)
    p2, q2, u2 = (torch.rand(2, 3, generator=g) for _ in range(3))
    out = lab.accept_mask(p2, q2, u2)
    assert tuple(out.shape) == (2, 3) and out.tolist() == (u2 * q2 < p2).tolist()


@points(1)
def test_accepted_length_edge_cases(lab):
    """accepted_length: K = 1 and K = 0."""
    assert lab.accepted_length(torch.tensor([[True], [False]])).tolist() == [1, 0]
    assert lab.accepted_length(torch.zeros(3, 0, dtype=torch.bool)).tolist() == [0, 0, 0]


@points(1)
def test_residual_zero_mass_returns_p(lab):
    """residual_distribution: p == q (also up to rounding) falls back to p, never NaN."""
    p = dist(1, 1, 0, 2)
    out = lab.residual_distribution(p, p.clone())
    assert torch.isfinite(out).all(), "NaN/inf when p == q: guard the zero residual"
    torch.testing.assert_close(out.float(), p)
    q = p + torch.tensor([1e-8, 0.0, 0.0, 0.0])  # q a hair above p: no residual mass at all
    torch.testing.assert_close(lab.residual_distribution(p, q).float(), p)


@points(1)
def test_residual_batched(lab):
    """residual_distribution works on [..., V] with any leading dimensions."""
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(2, 3, 5, generator=g), -1)
    q = torch.softmax(torch.randn(2, 3, 5, generator=g), -1)
    r = (p - q).clamp(min=0)
    out = lab.residual_distribution(p, q)
    assert tuple(out.shape) == (2, 3, 5)
    torch.testing.assert_close(out.float(), r / r.sum(-1, keepdim=True))


CASES = {
    "q_with_zeros": (P_RANDOM, dist(0, 0, 1, 8, 0, 8, 1, 0)),
    "p_with_zeros": (dist(0, 1, 4, 0, 5, 0, 2, 6), Q_RANDOM),
    "p_equals_q": (P_RANDOM, P_RANDOM.clone()),
    "p_le_q_support": (dist(1, 1, 0, 0, 0, 0, 0, 0), dist(1, 1, 1, 1, 0, 0, 0, 0)),
    "disjoint": (dist(1, 1, 0, 0, 0, 0, 0, 0), dist(0, 0, 1, 1, 1, 0, 0, 0)),
    "peaked": (dist(100, 1, 1, 1, 1, 1, 1, 1), dist(1, 1, 1, 1, 1, 1, 1, 100)),
}


@points(1)
@pytest.mark.parametrize("case", list(CASES))
def test_first_token_follows_p_edge_cases(lab, case):
    """The first emitted token follows p for awkward (p, q) pairs (chi-square)."""
    p, q = CASES[case]
    tokens, _, _ = one_step(lab, p, q, seed=10 + list(CASES).index(case))
    c = counts(tokens[:, 0], 8)
    assert chi2_pvalue(c, p.numpy()) > SIGNIFICANCE, f"{case}: counts {c.tolist()} do not follow p {p.tolist()}"


@points(1)
@pytest.mark.parametrize("token", [5, 0])
def test_deterministic_draft_follows_p(lab, token):
    """draft_probs=None (q one-hot on the draft): still distributed as p; token 0 has p = 0."""
    p = dist(0, 1, 4, 1, 5, 9, 2, 6)
    tokens, acc, _ = one_step(lab, p, None, seed=20 + token, draft_token=token)
    c = counts(tokens[:, 0], 8)
    assert chi2_pvalue(c, p.numpy()) > SIGNIFICANCE, f"counts {c.tolist()} do not follow p"
    if token == 0:
        assert (acc == 0).all(), "a draft with p = 0 must never be accepted"


def chain(seed, k=3, v=6, n=N):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(k + 1, v, generator=g), -1)
    q = torch.softmax(torch.randn(k, v, generator=g) * 0.5 + torch.log(p[:k]) * 0.7, -1)  # q close-ish to p
    drafts = torch.stack([torch.multinomial(q[i], n, replacement=True, generator=g) for i in range(k)], 1)
    return p, q, drafts, g


@points(3)
def test_every_position_and_bonus_follow_p(lab):
    """K = 3: the token emitted at each position, when reached, follows p there (bonus included)."""
    k, v = 3, 6
    p, q, drafts, g = chain(31, k, v)
    tokens, acc = lab.rejection_sample(p.expand(N, k + 1, v), drafts, q.expand(N, k, v), generator=g)
    assert (acc == k).sum() > 2000, "too few rows accepted everything: is the acceptance test right?"
    for i in range(k + 1):
        col = tokens[:, i]
        emitted = col[col >= 0]
        c = counts(emitted, v)
        assert chi2_pvalue(c, p[i].numpy()) > SIGNIFICANCE, \
            f"position {i}{' (bonus)' if i == k else ''}: counts {c.tolist()} do not follow p_{i}"


@points(2)
def test_num_accepted_distribution(lab):
    """P(num_accepted >= i) = prod_{j < i} sum_x min(p_j, q_j) (chi-square over 0..K)."""
    k, v = 3, 6
    p, q, drafts, g = chain(41, k, v)
    _, acc = lab.rejection_sample(p.expand(N, k + 1, v), drafts, q.expand(N, k, v), generator=g)
    beta = torch.minimum(p[:k], q).sum(-1).double().numpy()
    survive = np.concatenate([[1.0], np.cumprod(beta)])  # P(n >= i), i = 0..K
    law = survive - np.concatenate([survive[1:], [0.0]])
    c = np.bincount(torch.as_tensor(acc).long().numpy(), minlength=k + 1)
    assert chi2_pvalue(c, law) > SIGNIFICANCE, f"num_accepted counts {c.tolist()}, expected {np.round(law * N)}"


@points(1)
def test_bonus_when_all_accepted(lab):
    """All drafts certain to pass: the bonus comes from p_K, the position after the last draft."""
    p = torch.tensor([[[0, 1.0, 0, 0], [0, 0, 1.0, 0], [0, 0, 0, 1.0]]]).expand(5, 3, 4)
    drafts = torch.tensor([[1, 2]]).expand(5, 2)
    tokens, n = lab.rejection_sample(p.contiguous(), drafts.contiguous(), None, torch.Generator().manual_seed(0))
    assert n.tolist() == [2] * 5 and tokens.tolist() == [[1, 2, 3]] * 5


@points(2)
def test_padding(lab):
    """-1 drafts are never accepted, and the token at a padded position is drawn from p there."""
    v = 5
    p0 = torch.tensor([0, 0, 1.0, 0, 0])  # position 0: the draft (token 2) surely passes
    p1 = dist(1, 2, 3, 4, 0)
    target = torch.stack([p0, p1, dist(1, 1, 1, 1, 1)]).expand(N, 3, v).contiguous()
    drafts = torch.tensor([[2, -1]]).expand(N, 2).contiguous()
    q = torch.stack([p0, dist(0, 0, 0, 1, 1)]).expand(N, 2, v).contiguous()  # q at the pad: must be ignored
    for draft_probs in (None, q):
        tokens, n = lab.rejection_sample(target, drafts, draft_probs, torch.Generator().manual_seed(7))
        assert (n == 1).all(), "the padded slot was accepted (or the sure draft rejected)"
        assert (tokens[:, 0] == 2).all() and (tokens[:, 2] == -1).all()
        c = counts(tokens[:, 1], v)
        assert chi2_pvalue(c, p1.numpy()) > SIGNIFICANCE, f"token at the padded slot {c.tolist()} is not from p"
    tokens, n = lab.rejection_sample(target[:, :2], torch.full((N, 1), -1), None, torch.Generator().manual_seed(8))
    assert (n == 0).all()
    assert chi2_pvalue(counts(tokens[:, 0], v), p0.numpy()) > SIGNIFICANCE


@points(2)
def test_batch_rows_are_independent(lab):
    """Each row uses its own p and q (four different pairs interleaved in one batch)."""
    pairs = [(P_RANDOM, Q_RANDOM), (dist(1, 0, 0, 0, 0, 0, 0, 1), dist(1, 1, 1, 1, 1, 1, 1, 1)),
             (dist(0, 0, 0, 5, 5, 0, 0, 0), dist(0, 0, 0, 1, 9, 0, 0, 0)), (dist(8, 7, 6, 5, 4, 3, 2, 1), P_RANDOM)]
    n_each = 15_000
    g = torch.Generator().manual_seed(50)
    idx = torch.arange(4).repeat(n_each)  # rows 0,1,2,3,0,1,2,3,...
    p = torch.stack([a for a, _ in pairs])[idx]
    q = torch.stack([b for _, b in pairs])[idx]
    drafts = torch.multinomial(q, 1, generator=g)
    tokens, _ = lab.rejection_sample(torch.stack([p, p], 1), drafts, q[:, None], generator=g)
    for j, (pj, _) in enumerate(pairs):
        c = counts(tokens[idx == j, 0], 8)
        assert chi2_pvalue(c, pj.numpy()) > SIGNIFICANCE, f"rows of pair {j}: counts {c.tolist()} do not follow their p"


@points(2)
def test_generator_determinism(lab):
    """Randomness comes only from `generator`: same seed -> same output whatever the global seed;
    two calls with one generator differ (it is not reseeded)."""
    g = torch.Generator().manual_seed(60)
    b, k, v = 2000, 3, 6
    p = torch.softmax(torch.randn(b, k + 1, v, generator=g), -1)
    q = torch.softmax(torch.randn(b, k, v, generator=g), -1)
    drafts = torch.multinomial(q.reshape(-1, v), 1, generator=g).reshape(b, k)

    def run(seed, global_seed):
        torch.manual_seed(global_seed)
        return lab.rejection_sample(p, drafts, q, generator=torch.Generator().manual_seed(seed))

    (t1, n1), (t2, n2) = run(0, 1), run(0, 2)
    assert torch.equal(t1, t2) and torch.equal(n1, n2), "same generator seed, different output: global RNG used?"
    gen = torch.Generator().manual_seed(0)
    a, _ = lab.rejection_sample(p, drafts, q, generator=gen)
    c, _ = lab.rejection_sample(p, drafts, q, generator=gen)
    assert not torch.equal(a, c), "two calls with the same generator gave identical output: reseeded?"


@points(1)
def test_k_zero(lab):
    """K = 0 (no drafts): sample the one token from p_0."""
    p = dist(1, 2, 3, 4)
    tokens, n = lab.rejection_sample(p.expand(N, 1, 4).contiguous(), torch.zeros(N, 0, dtype=torch.long), None,
                                     torch.Generator().manual_seed(70))
    assert tuple(tokens.shape) == (N, 1) and (torch.as_tensor(n) == 0).all()
    assert chi2_pvalue(counts(tokens[:, 0], 4), p.numpy()) > SIGNIFICANCE


@points(1)
def test_shape_errors(lab):
    """Mismatched shapes raise ValueError."""
    p = torch.full((2, 3, 5), 0.2)
    with pytest.raises(ValueError):
        lab.rejection_sample(p, torch.zeros(2, 3, dtype=torch.long))  # needs [2, 2]
    with pytest.raises(ValueError):
        lab.rejection_sample(p, torch.zeros(2, 2, dtype=torch.long), torch.full((2, 2, 4), 0.25))
    with pytest.raises(ValueError):
        lab.rejection_sample(p[0], torch.zeros(2, dtype=torch.long))
