"""Lab 7 grading tests (visible): the checks the notebook walks you through.

Run them with ``python -m specdecode_ref.grading labs/lab07_block_verify --visible-only``
(your student.py) or add ``--reference``. The distribution tests use fixed seeds and a
chi-square test over every sequence of K + 1 tokens on a tiny vocabulary; a test with several
checks shares significance 1e-4 among them. So a correct verifier, whose random numbers differ
from the reference's, fails each distribution test with probability at most 1e-4 (the report
adds these up).

Being lossless is the point of block verification: besides these tests, the hidden ones check
that the emitted tokens follow the target in every case the docstring lists (targets and drafts
that depend on the prefix, zeros in p or q, deterministic drafts, padded and ragged batches,
K = 0). That check alone is over a third of the points.
"""
import numpy as np
import torch
from scipy import stats

from specdecode_ref.grading import chi2_pvalue, lab_fixture, points

lab = lab_fixture(__file__)
REFERENCE_PATTERNS = [r"specdecode_ref\.verify\b[^\n]*|from specdecode_ref import[^\n]*\bverify\b"]
SIGNIFICANCE = 1e-4
N = 40_000  # rows per distribution test, verified in one batched call


def dist(*xs):
    t = torch.tensor(xs, dtype=torch.float64)
    return t / t.sum()


def sample_rows(probs, g):
    """One draw from each row of probs [n, V] (by inverse CDF: on a tiny vocabulary several times
    faster than torch.multinomial); a token of probability 0 is never drawn."""
    cdf = probs.cumsum(-1)
    u = torch.rand(probs.shape[0], 1, generator=g, dtype=cdf.dtype) * cdf[:, -1:]
    return (cdf <= u).sum(-1).clamp(max=probs.shape[-1] - 1)


# --- a chain of K draft positions on a tiny vocabulary ----------------------------------------------

class Chain:
    """A target and a drafter over K draft positions and a vocabulary of V tokens, either of
    which may depend on the tokens before: ``P[i]`` is [V**i, V] (row: the first i tokens, read
    as a number in base V; i = 0..K), ``Q[i]`` likewise for the draft position i (i = 0..K-1).
    The exact law of a sequence of K + 1 tokens is the product of the target's rows along it."""

    def __init__(self, P, Q, name=""):
        self.P = [torch.as_tensor(t, dtype=torch.float64) for t in P]
        self.Q = [torch.as_tensor(t, dtype=torch.float64) for t in Q]
        self.K, self.V, self.name = len(self.P) - 1, self.P[0].shape[-1], name

    @staticmethod
    def context_free(p, q, name=""):
        """p [K+1, V], q [K, V]: the same distribution at position i whatever came before."""
        v = p.shape[-1]
        return Chain([p[i].expand(v ** i, v) for i in range(p.shape[0])],
                     [q[i].expand(v ** i, v) for i in range(q.shape[0])], name)

    @staticmethod
    def random(seed, v=3, k=3, sharp=1.5, context=False, name=""):
        """Random softmax rows; with ``context`` every prefix has rows of its own."""
        g = torch.Generator().manual_seed(seed)
        rows = (lambda i: v ** i) if context else (lambda i: 1)
        P = [torch.softmax(torch.randn(rows(i), v, generator=g, dtype=torch.float64) * sharp, -1).expand(v ** i, v)
             for i in range(k + 1)]
        Q = [torch.softmax(torch.randn(rows(i), v, generator=g, dtype=torch.float64) * sharp, -1).expand(v ** i, v)
             for i in range(k)]
        return Chain(P, Q, name)

    def index(self, prefix):
        """[n, i] token ids -> [n] row numbers (base V)."""
        idx = torch.zeros(prefix.shape[0], dtype=torch.long)
        for j in range(prefix.shape[1]):
            idx = idx * self.V + prefix[:, j].clamp(min=0)
        return idx

    def draw_drafts(self, n, g):
        """[n, K] drafts, each drawn from Q given the drafts before it."""
        drafts = torch.zeros(n, self.K, dtype=torch.long)
        for i in range(self.K):
            drafts[:, i] = sample_rows(self.Q[i][self.index(drafts[:, :i])], g)
        return drafts

    def target_rows(self, drafts):
        """[n, K+1, V] float32: the target's distribution after the first i drafts, i = 0..K."""
        return torch.stack([self.P[i][self.index(drafts[:, :i])] for i in range(self.K + 1)], 1).float()

    def draft_rows(self, drafts):
        """[n, K, V] float32: the q each draft was drawn from."""
        return torch.stack([self.Q[i][self.index(drafts[:, :i])] for i in range(self.K)], 1).float()

    def law(self):
        """The exact probability of each of the V**(K+1) sequences (ravelled, base V)."""
        law = torch.ones(1, dtype=torch.float64)
        for i in range(self.K + 1):
            law = (law[:, None] * self.P[i]).reshape(-1)
        return law.numpy()

    def complete(self, tokens, acc, g):
        """The emitted tokens (positions 0..num_accepted), then the target's own draws after them:
        a sequence [n, K+1] that follows ``law()`` exactly when the verifier is lossless."""
        tokens, acc = torch.as_tensor(tokens).long(), torch.as_tensor(acc).long()
        seq = torch.zeros(tokens.shape[0], self.K + 1, dtype=torch.long)
        for j in range(self.K + 1):
            own = sample_rows(self.P[j][self.index(seq[:, :j])], g)
            seq[:, j] = torch.where(j <= acc, tokens[:, j], own)
        return seq


def verify_chain(lab, chain, n=N, seed=0, deterministic=False):
    """n rows of drafts drawn from the chain's drafter, verified in one call.
    Returns (tokens, num_accepted, drafts, completed sequences)."""
    g = torch.Generator().manual_seed(seed)
    drafts = chain.draw_drafts(n, g)
    tokens, acc = lab.block_verify(chain.target_rows(drafts), drafts,
                                   None if deterministic else chain.draft_rows(drafts), generator=g)
    return tokens, acc, drafts, chain.complete(tokens, acc, g)


# --- checks: (what, p-value, details, statistical?); a test passes when every p-value exceeds its
# significance. The significance of a test is shared among its statistical checks (Bonferroni), so
# that a correct verifier fails a whole test by chance with probability at most SIGNIFICANCE.

def follows(what, chain, seq):
    """The completed sequences [n, K+1] follow the chain's target law (chi-square over all sequences)."""
    law = chain.law()
    seq = torch.as_tensor(seq).long()
    if seq.numel() == 0:
        return (what, 0.0, "no rows", True)
    if (seq < 0).any() or (seq >= chain.V).any():
        return (what, 0.0, f"emitted token ids outside 0..{chain.V - 1} (or -1 where a token belongs)", True)
    cells = chain.index(seq)
    c = np.bincount(cells.numpy(), minlength=law.size)
    worst = int(np.argmax(np.abs(c - law * c.sum()) / np.sqrt(law * c.sum() + 1)))
    digits = np.unravel_index(worst, (chain.V,) * (chain.K + 1))
    details = (f"sequence {list(map(int, digits))}: {int(c[worst])} times, expected {law[worst] * c.sum():.0f}")
    return (what, chi2_pvalue(c, law), details, True)


def holds(what, condition, details=""):
    """A condition that a correct verifier meets always (p-value 1) or never (0)."""
    return (what, 1.0 if bool(condition) else 0.0, details, False)


def per_check(checks, significance=SIGNIFICANCE) -> float:
    return significance / max(1, sum(1 for c in checks if c[3]))


def failures(checks, significance=SIGNIFICANCE) -> list:
    level = per_check(checks, significance)
    return [(w, pv, d) for w, pv, d, stat in checks if not pv > (level if stat else 0.5)]


def assert_checks(checks, significance=SIGNIFICANCE):
    bad = failures(checks, significance)
    assert not bad, "; ".join(f"{w}: p-value {pv:.1e}, {d}" for w, pv, d in bad[:3])


# --- the cases: each returns its checks; the hidden lossless test runs every case again -------------

_SAMPLES: dict = {}


def cached(lab, name, case):
    """Each case's samples are drawn once per submission: the lossless test at the end reuses them."""
    key = (id(lab), name)
    if key not in _SAMPLES or _SAMPLES[key][0] is not lab:
        _SAMPLES[key] = (lab, case(lab))
    return _SAMPLES[key][1]


PAPER = Chain.context_free(torch.tensor([[1 / 3, 2 / 3]] * 3, dtype=torch.float64),
                           torch.tensor([[2 / 3, 1 / 3]] * 2, dtype=torch.float64), "the paper's example")
PAPER_BLOCK, PAPER_TOKEN = 11 / 9, 10 / 9  # drafts kept per call, in expectation


def case_paper(lab):
    """Sun et al.'s example: target (1/3, 2/3) and draft (2/3, 1/3) at both positions, K = 2.
    Block verification keeps 11/9 drafts per call in expectation (the token rule 10/9), and the
    emitted tokens follow the target."""
    _, acc, _, seq = verify_chain(lab, PAPER, seed=1)
    a = torch.as_tensor(acc).double()
    z = (float(a.mean()) - PAPER_BLOCK) / (float(a.std()) / np.sqrt(N) + 1e-12)
    return [("drafts kept per call", float(2 * stats.norm.sf(abs(z))),
             f"{float(a.mean()):.4f}, expected {PAPER_BLOCK:.4f} (the token rule: {PAPER_TOKEN:.4f})", True),
            follows("the emitted tokens (paper's example)", PAPER, seq)]


CHAIN = Chain.random(17, v=3, k=3, sharp=1.5, name="K = 3, V = 3")


def case_chain(lab):
    """K = 3 on 3 tokens, a different p and q at each position: the emitted tokens, continued by
    the target, follow the target's law (81 sequences)."""
    tokens, acc, _, seq = verify_chain(lab, CHAIN, seed=2)
    acc = torch.as_tensor(acc).long()
    return [holds("rows that keep all K drafts", (acc == CHAIN.K).sum() > 2000,
                  f"only {int((acc == CHAIN.K).sum())} of {N}: are the weights and stopping probabilities right?"),
            follows("every sequence of K + 1 tokens", CHAIN, seq)]


# --- the tests ---------------------------------------------------------------------------------------

@points(2)
def test_prefix_weights_example(lab):
    """prefix_weights: w_0 = 1, w_i = min(1, w_{i-1} * ratio_i), 0 from a padded slot on."""
    ratio = torch.tensor([[0.5, 1.5, 3.0], [2.0, 0.25, 8.0], [0.5, 1.5, 3.0], [0.0, 5.0, 5.0]])
    valid = torch.tensor([[True, True, True], [True, True, True], [True, False, False], [True, True, True]])
    w = lab.prefix_weights(ratio, valid)
    assert tuple(w.shape) == (4, 4), f"shape {tuple(w.shape)}, want [B, K+1] = (4, 4)"
    torch.testing.assert_close(w.float(), torch.tensor([[1.0, 0.5, 0.75, 1.0], [1.0, 1.0, 0.25, 1.0],
                                                        [1.0, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]))


@points(2)
def test_stop_probabilities_example(lab):
    """stop_probabilities: h = r / (r + 1 - w); the last prefix (r = w) gives h = w."""
    r = torch.tensor([[0.3, 0.2, 0.75], [0.5, 0.1, 0.4]])
    w = torch.tensor([[1.0, 0.5, 0.75], [1.0, 0.9, 0.4]])
    h = lab.stop_probabilities(r, w)
    torch.testing.assert_close(h.float(), torch.tensor([[1.0, 0.2 / 0.7, 0.75], [1.0, 0.1 / 0.2, 0.4]]))


@points(2)
def test_prefix_residual_example(lab):
    """prefix_residual: max(w * p - q, 0) renormalised, one weight per row."""
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.5, 0.3, 0.2, 0.0]])
    q = torch.tensor([[0.1, 0.5, 0.1, 0.3], [0.1, 0.5, 0.1, 0.3]])
    w = torch.tensor([1.0, 0.8])
    out = lab.prefix_residual(p, q, w)
    torch.testing.assert_close(out.float(), torch.tensor([[0.8, 0.0, 0.2, 0.0], [0.3 / 0.36, 0.0, 0.06 / 0.36, 0.0]]))


@points(2)
def test_output_format(lab):
    """block_verify: shapes, dtype, kept prefix = drafts, one extra token, then -1."""
    g = torch.Generator().manual_seed(5)
    b, k, v = 256, 3, 6
    p = torch.softmax(torch.randn(b, k + 1, v, generator=g), -1)
    q = torch.softmax(torch.randn(b, k, v, generator=g), -1)
    drafts = torch.multinomial(q.reshape(-1, v), 1, generator=g).reshape(b, k)
    tokens, n = lab.block_verify(p, drafts, q, generator=g)
    assert tuple(tokens.shape) == (b, k + 1) and tokens.dtype == torch.long, (tokens.shape, tokens.dtype)
    assert tuple(n.shape) == (b,) and not n.dtype.is_floating_point, (n.shape, n.dtype)
    assert ((n >= 0) & (n <= k)).all()
    for row in range(b):
        m = int(n[row])
        assert tokens[row, :m].tolist() == drafts[row, :m].tolist(), f"row {row}: kept tokens must be the drafts"
        assert 0 <= int(tokens[row, m]) < v, f"row {row}: missing the extra token at position {m}"
        assert (tokens[row, m + 1:] == -1).all(), f"row {row}: positions after the extra token must be -1"
    assert (n == k).any() and (n < k).any(), "with these p and q some rows keep everything and some do not"


@points(3, fails_by_chance=SIGNIFICANCE)
def test_papers_two_token_example(lab):
    """The paper's example: 11/9 drafts kept per call in expectation (the token rule keeps 10/9),
    and the emitted tokens follow the target."""
    assert_checks(cached(lab, "paper", case_paper))


@points(3, fails_by_chance=SIGNIFICANCE)
def test_joint_law_follows_target(lab):
    """K = 3 on a vocabulary of 3, a different p and q at each position: every sequence of
    K + 1 tokens (emitted, then continued by the target) has the target's probability."""
    assert_checks(cached(lab, "chain", case_chain))
