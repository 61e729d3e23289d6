"""Lab 1 grading tests (hidden): edge cases the notebook does not show.

Zeros in p or q, p <= q, disjoint supports, deterministic drafters, the number of accepted
drafts, padding, batches whose rows are padded differently, rows with different p and q, K = 0,
the zero-residual guard, shape errors and the use of the generator. The last test asks for all
of it at once: the sampler is lossless in every case (40 % of the points).
"""
import numpy as np
import pytest
import torch

from grading_lab01 import (N, P_RANDOM, Q_RANDOM, SIGNIFICANCE, assert_checks, case_acceptance_rate, case_chain,
                           case_first_token, chain, dist, failures, follows, holds, one_step)
from specdecode_ref.grading import chi2_pvalue, lab_fixture, points

lab = lab_fixture(__file__)

_SAMPLES: dict = {}


def cached(lab, name, case):
    """Each case's samples are drawn once per submission: the lossless test at the end reuses them."""
    key = (id(lab), name)
    if key not in _SAMPLES or _SAMPLES[key][0] is not lab:
        _SAMPLES[key] = (lab, case(lab))
    return _SAMPLES[key][1]


# --- the cases ------------------------------------------------------------------------------------

EDGE = {
    "q_with_zeros": (P_RANDOM, dist(0, 0, 1, 8, 0, 8, 1, 0)),
    "p_with_zeros": (dist(0, 1, 4, 0, 5, 0, 2, 6), Q_RANDOM),
    "p_equals_q": (P_RANDOM, P_RANDOM.clone()),
    "p_le_q_support": (dist(1, 1, 0, 0, 0, 0, 0, 0), dist(1, 1, 1, 1, 0, 0, 0, 0)),
    "disjoint": (dist(1, 1, 0, 0, 0, 0, 0, 0), dist(0, 0, 1, 1, 1, 0, 0, 0)),
    "peaked": (dist(100, 1, 1, 1, 1, 1, 1, 1), dist(1, 1, 1, 1, 1, 1, 1, 100)),
}


def case_edge(name):
    def run(lab):
        p, q = EDGE[name]
        tokens, _, _ = one_step(lab, p, q, seed=10 + list(EDGE).index(name))
        return [follows(f"first token, {name}", tokens[:, 0], p)]
    return run


def case_deterministic(token):
    def run(lab):
        p = dist(0, 1, 4, 1, 5, 9, 2, 6)
        tokens, acc, _ = one_step(lab, p, None, seed=20 + token, draft_token=token)
        checks = [follows(f"first token, deterministic draft {token}", tokens[:, 0], p)]
        if token == 0:
            checks.append(holds("a draft with p = 0 is never accepted", (torch.as_tensor(acc) == 0).all()))
        return checks
    return run


def case_num_accepted(lab, seed=41, k=3, v=6):
    p, q, drafts, g = chain(seed, k, v)
    _, acc = lab.rejection_sample(p.expand(N, k + 1, v), drafts, q.expand(N, k, v), generator=g)
    beta = torch.minimum(p[:k], q).sum(-1).double().numpy()
    survive = np.concatenate([[1.0], np.cumprod(beta)])  # P(n >= i), i = 0..K
    law = survive - np.concatenate([survive[1:], [0.0]])
    c = np.bincount(torch.as_tensor(acc).long().numpy(), minlength=k + 1)
    if c.size > k + 1:
        return [holds("num_accepted <= K", False, f"counts {c.tolist()}")]
    expected = np.round(law * N).astype(int).tolist()
    return [("num_accepted", chi2_pvalue(c, law), f"counts {c.tolist()}, expected {expected}", True)]


def case_padding(lab):
    """Rows [sure draft, -1]: the pad is never accepted and the token there comes from p."""
    v = 5
    p0 = torch.tensor([0, 0, 1.0, 0, 0])  # position 0: the draft (token 2) surely passes
    p1 = dist(1, 2, 3, 4, 0)
    target = torch.stack([p0, p1, dist(1, 1, 1, 1, 1)]).expand(N, 3, v).contiguous()
    drafts = torch.tensor([[2, -1]]).expand(N, 2).contiguous()
    q = torch.stack([p0, dist(0, 0, 0, 1, 1)]).expand(N, 2, v).contiguous()  # q at the pad: must be ignored
    checks = []
    for label, draft_probs in (("draft_probs=None", None), ("draft_probs given", q)):
        tokens, n = lab.rejection_sample(target, drafts, draft_probs, torch.Generator().manual_seed(7))
        n = torch.as_tensor(n)
        checks.append(holds(f"{label}: the pad is never accepted, the sure draft always", (n == 1).all()))
        checks.append(holds(f"{label}: accepted token, then -1 after the extra one",
                            (tokens[:, 0] == 2).all() and (tokens[:, 2] == -1).all()))
        checks.append(follows(f"{label}: the token at the padded slot", tokens[:, 1], p1))
    tokens, n = lab.rejection_sample(target[:, :2], torch.full((N, 1), -1), None, torch.Generator().manual_seed(8))
    checks.append(holds("a row with only a pad accepts nothing", (torch.as_tensor(n) == 0).all()))
    checks.append(follows("a row with only a pad: its token", tokens[:, 0], p0))
    return checks


RAGGED_VALID = (3, 1, 2, 0)  # drafts per kind of row; K = 3, the rest of each row is -1


def case_ragged(lab, k=3, v=6, n_each=10_000):
    """Rows padded differently in one batch (3, 1, 2 and 0 real drafts), each kind with its own p
    and q: every row accepts at most its own drafts, and every position it reaches follows its p."""
    g = torch.Generator().manual_seed(80)
    kinds = len(RAGGED_VALID)
    p = torch.softmax(torch.randn(kinds, k + 1, v, generator=g), -1)
    q = torch.softmax(torch.randn(kinds, k, v, generator=g) * 0.5 + torch.log(p[:, :k]) * 0.7, -1)
    q_pad = torch.softmax(torch.randn(kinds, k, v, generator=g) * 3, -1)  # garbage q at padded slots
    valid = torch.tensor(RAGGED_VALID)
    idx = torch.arange(kinds).repeat(n_each)  # kinds interleaved: 0, 1, 2, 3, 0, 1, ...
    real = torch.arange(k)[None, :] < valid[idx][:, None]  # [n, k]
    drafts = torch.stack([torch.multinomial(q[idx, i], 1, generator=g)[:, 0] for i in range(k)], 1)
    drafts = torch.where(real, drafts, torch.full_like(drafts, -1))
    draft_probs = torch.where(real[..., None], q[idx], q_pad[idx])
    checks = []
    for label, dp in (("draft_probs given", draft_probs), ("draft_probs=None", None)):
        tokens, acc = lab.rejection_sample(p[idx], drafts, dp, generator=g)
        acc = torch.as_tensor(acc).long()
        for j, m in enumerate(RAGGED_VALID):
            rows = idx == j
            a = acc[rows]
            checks.append(holds(f"{label}, rows with {m} drafts: accept at most {m}", (a <= m).all(),
                                f"num_accepted up to {int(a.max())}"))
            checks.append(holds(f"{label}, rows with {m} drafts: -1 after position {m}",
                                (tokens[rows, m + 1:] == -1).all()))
            for i in range(m + 1):
                reached = a >= i
                checks.append(follows(f"{label}, rows with {m} drafts, position {i}", tokens[rows][reached, i], p[j, i]))
    return checks


def case_rows_independent(lab):
    pairs = [(P_RANDOM, Q_RANDOM), (dist(1, 0, 0, 0, 0, 0, 0, 1), dist(1, 1, 1, 1, 1, 1, 1, 1)),
             (dist(0, 0, 0, 5, 5, 0, 0, 0), dist(0, 0, 0, 1, 9, 0, 0, 0)), (dist(8, 7, 6, 5, 4, 3, 2, 1), P_RANDOM)]
    n_each = 15_000
    g = torch.Generator().manual_seed(50)
    idx = torch.arange(4).repeat(n_each)  # rows 0,1,2,3,0,1,2,3,...
    p = torch.stack([a for a, _ in pairs])[idx]
    q = torch.stack([b for _, b in pairs])[idx]
    drafts = torch.multinomial(q, 1, generator=g)
    tokens, _ = lab.rejection_sample(torch.stack([p, p], 1), drafts, q[:, None], generator=g)
    return [follows(f"rows of pair {j}", tokens[idx == j, 0], pj) for j, (pj, _) in enumerate(pairs)]


def case_k_zero(lab):
    p = dist(1, 2, 3, 4)
    tokens, n = lab.rejection_sample(p.expand(N, 1, 4).contiguous(), torch.zeros(N, 0, dtype=torch.long), None,
                                     torch.Generator().manual_seed(70))
    return [holds("K = 0: one token per row, none accepted",
                  tuple(tokens.shape) == (N, 1) and (torch.as_tensor(n) == 0).all(), f"shape {tuple(tokens.shape)}"),
            follows("K = 0: the token", tokens[:, 0], p)]


CASES = {"first_token": case_first_token, "acceptance_rate": case_acceptance_rate, "chain": case_chain,
         **{f"edge_{name}": case_edge(name) for name in EDGE},
         "deterministic_5": case_deterministic(5), "deterministic_0": case_deterministic(0),
         "num_accepted": case_num_accepted, "padding": case_padding, "ragged": case_ragged,
         "rows_independent": case_rows_independent, "k_zero": case_k_zero}


# --- the pieces --------------------------------------------------------------------------------------

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


# --- the distribution, case by case -------------------------------------------------------------------

@points(1, fails_by_chance=SIGNIFICANCE)
@pytest.mark.parametrize("case", list(EDGE))
def test_first_token_follows_p_edge_cases(lab, case):
    """The first emitted token follows p for awkward (p, q) pairs (chi-square)."""
    assert_checks(cached(lab, f"edge_{case}", CASES[f"edge_{case}"]))


@points(1, fails_by_chance=SIGNIFICANCE)
@pytest.mark.parametrize("token", [5, 0])
def test_deterministic_draft_follows_p(lab, token):
    """draft_probs=None (q one-hot on the draft): still distributed as p; token 0 has p = 0."""
    assert_checks(cached(lab, f"deterministic_{token}", CASES[f"deterministic_{token}"]))


@points(2, fails_by_chance=SIGNIFICANCE)
def test_num_accepted_distribution(lab):
    """P(num_accepted >= i) = prod_{j < i} sum_x min(p_j, q_j) (chi-square over 0..K)."""
    assert_checks(cached(lab, "num_accepted", case_num_accepted))


@points(1)
def test_bonus_when_all_accepted(lab):
    """All drafts certain to pass: the bonus comes from p_K, the position after the last draft."""
    p = torch.tensor([[[0, 1.0, 0, 0], [0, 0, 1.0, 0], [0, 0, 0, 1.0]]]).expand(5, 3, 4)
    drafts = torch.tensor([[1, 2]]).expand(5, 2)
    tokens, n = lab.rejection_sample(p.contiguous(), drafts.contiguous(), None, torch.Generator().manual_seed(0))
    assert n.tolist() == [2] * 5 and tokens.tolist() == [[1, 2, 3]] * 5


@points(2, fails_by_chance=SIGNIFICANCE)
def test_padding(lab):
    """-1 drafts are never accepted, and the token at a padded position is drawn from p there."""
    assert_checks(cached(lab, "padding", case_padding))


@points(3, fails_by_chance=SIGNIFICANCE)
def test_rows_padded_differently(lab):
    """One batch, rows with 3, 1, 2 and 0 real drafts (the rest -1), each with its own p and q:
    each row accepts only its own drafts and every position it reaches follows its p."""
    assert_checks(cached(lab, "ragged", case_ragged))


@points(2, fails_by_chance=SIGNIFICANCE)
def test_batch_rows_are_independent(lab):
    """Each row uses its own p and q (four different pairs interleaved in one batch)."""
    assert_checks(cached(lab, "rows_independent", case_rows_independent))


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


@points(1, fails_by_chance=SIGNIFICANCE)
def test_k_zero(lab):
    """K = 0 (no drafts): sample the one token from p_0."""
    assert_checks(cached(lab, "k_zero", case_k_zero))


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


# --- all of it at once -------------------------------------------------------------------------------

@points(28, fails_by_chance=SIGNIFICANCE)
def test_lossless_in_every_case(lab):
    """Lossless in every case above at once (40 % of the points): K = 1 and K = 3 with the bonus,
    awkward p and q, deterministic drafts, padding, rows padded differently, independent rows,
    K = 0. Significance 1e-4 shared by all the checks, so a correct sampler fails it by chance
    with probability at most 1e-4."""
    found = {}
    for name, case in CASES.items():
        try:
            found[name] = cached(lab, name, case)
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - a case that crashes is not lossless either
            found[name] = [(name, 0.0, f"{type(exc).__name__}: {exc}", False)]
    every = [c for checks in found.values() for c in checks]
    bad = failures(every, SIGNIFICANCE)
    names = {w for w, _, _ in bad}
    failed_cases = [name for name, checks in found.items() if any(c[0] in names for c in checks)]
    assert not bad, f"not lossless in: {', '.join(failed_cases)}. " + "; ".join(
        f"{w}: p-value {pv:.1e}, {d}" for w, pv, d in bad[:4])
