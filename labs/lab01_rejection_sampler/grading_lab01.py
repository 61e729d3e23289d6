"""Lab 1 grading tests (visible): the checks the notebook walks you through.

Run them with ``python -m specdecode_ref.grading labs/lab01_rejection_sampler --visible-only``
(your student.py) or add ``--reference``. The distribution tests use fixed seeds and a
chi-square test; a test with several checks shares significance 1e-4 among them. So a correct
sampler, whose random numbers differ from the reference's, fails each distribution test with
probability at most 1e-4 (the report adds these up).

Being lossless is the point of the lab: besides these tests, the hidden ones check that the
emitted tokens follow p in every case the docstring lists (later positions, the bonus token,
padded and ragged batches, deterministic drafts, K = 0). That check alone is worth 40 % of the
points, so a sampler that is not lossless keeps at most about 60 %.
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


def chain(seed, k=3, v=6, n=N):
    """K drafts with a different p at every position (and q close-ish to p): p [k+1, v], q [k, v],
    drafts [n, k] sampled from q, and the generator that drew them."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(k + 1, v, generator=g), -1)
    q = torch.softmax(torch.randn(k, v, generator=g) * 0.5 + torch.log(p[:k]) * 0.7, -1)
    drafts = torch.stack([torch.multinomial(q[i], n, replacement=True, generator=g) for i in range(k)], 1)
    return p, q, drafts, g


def counts(tokens, v):
    t = torch.as_tensor(tokens).long()
    assert (t >= 0).all() and (t < v).all(), "emitted a token id outside 0..V-1"
    return np.bincount(t.numpy(), minlength=v)


# --- checks: (what, p-value, details, statistical?); a test passes when every p-value exceeds its
# significance. The significance of a test is shared among its statistical checks (Bonferroni), so
# that a correct sampler fails a whole test by chance with probability at most SIGNIFICANCE.

def follows(what, tokens, probs):
    """The emitted tokens (a 1-D tensor) follow ``probs`` (chi-square)."""
    probs = torch.as_tensor(probs, dtype=torch.float64).numpy()
    t = torch.as_tensor(tokens).long()
    if t.numel() == 0:
        return (what, 0.0, "no tokens were emitted there", True)
    if (t < 0).any() or (t >= probs.size).any():
        return (what, 0.0, f"emitted token ids outside 0..{probs.size - 1} (or -1 where a token belongs)", True)
    c = np.bincount(t.numpy(), minlength=probs.size)
    expected = np.round(probs * c.sum()).astype(int).tolist()
    return (what, chi2_pvalue(c, probs), f"counts {c.tolist()}, expected {expected}", True)


def holds(what, condition, details=""):
    """A condition that a correct sampler meets always (p-value 1) or never (0)."""
    return (what, 1.0 if bool(condition) else 0.0, details, False)


def per_check(checks, significance=SIGNIFICANCE) -> float:
    """The significance of each statistical check when ``checks`` share ``significance``."""
    return significance / max(1, sum(1 for c in checks if c[3]))


def failures(checks, significance=SIGNIFICANCE) -> list:
    level = per_check(checks, significance)
    return [(w, pv, d) for w, pv, d, stat in checks if not pv > (level if stat else 0.5)]


def assert_checks(checks, significance=SIGNIFICANCE):
    bad = failures(checks, significance)
    assert not bad, "; ".join(f"{w}: p-value {pv:.1e}, {d}" for w, pv, d in bad[:3])


# --- cases: each returns its checks; the hidden lossless test runs every case again -------------

def case_first_token(lab):
    """K = 1, p and q random: the first emitted token follows p."""
    tokens, _, _ = one_step(lab, P_RANDOM, Q_RANDOM, seed=1)
    return [follows("first token (K = 1)", tokens[:, 0], P_RANDOM)]


def case_acceptance_rate(lab):
    """K = 1: a draft x ~ q is accepted with probability sum_x min(p(x), q(x))."""
    _, acc, _ = one_step(lab, P_RANDOM, Q_RANDOM, seed=2)
    beta = float(torch.minimum(P_RANDOM, Q_RANDOM).sum())
    k = int((torch.as_tensor(acc) == 1).sum())
    return [("acceptance rate", float(stats.binomtest(k, N, beta).pvalue), f"{k / N:.4f}, expected {beta:.4f}", True)]


def case_chain(lab, seed=31, k=3, v=6):
    """K = 3 with a different p at each position: the token emitted at each position, when the row
    reaches it, follows p there; the last one is the bonus token (all K drafts accepted)."""
    p, q, drafts, g = chain(seed, k, v)
    tokens, acc = lab.rejection_sample(p.expand(N, k + 1, v), drafts, q.expand(N, k, v), generator=g)
    acc = torch.as_tensor(acc).long()
    checks = [holds("rows that accept all K drafts", (acc == k).sum() > 2000,
                    f"only {int((acc == k).sum())} of {N}: is the acceptance test right?")]
    for i in range(k + 1):
        reached = acc >= i
        checks.append(follows(f"position {i}{' (bonus)' if i == k else ''}", tokens[reached, i], p[i]))
    return checks


# --- the tests -------------------------------------------------------------------------------------

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


@points(2)
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


@points(2, fails_by_chance=SIGNIFICANCE)
def test_first_token_follows_p(lab):
    """The first emitted token is distributed as p (K = 1, chi-square)."""
    assert_checks(case_first_token(lab))


@points(2, fails_by_chance=SIGNIFICANCE)
def test_acceptance_rate_is_overlap(lab):
    """A draft x ~ q is accepted with probability sum_x min(p(x), q(x)) (binomial test)."""
    assert_checks(case_acceptance_rate(lab))


@points(3, fails_by_chance=SIGNIFICANCE)
def test_every_position_and_bonus_follow_p(lab):
    """K = 3 with a different p at each position: every position, when reached, follows its own p,
    the bonus token included."""
    assert_checks(case_chain(lab))
