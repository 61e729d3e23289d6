"""Token-by-token against block verification on the real model (notebook 11).

Block verification (verify.block_verify) can only differ from the token rule where the drafter
reports a q that is not one-hot: the draft model, early exit, an EAGLE chain, and a Medusa chain
drafting with ``draft_sampling="sample"``. For each such drafter and temperature, every
prompt is decoded with both rules under the same seeds, the two runs interleaved, and τ and
tokens/s are compared prompt by prompt (``claims.compare_paired``: a geometric-mean ratio with a
bootstrap interval over prompts).

Counterparts: vLLM's block rule in its Model Runner V2 rejection sampler,
``vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py`` (``_compute_cumulative_log_p_kernel``:
the prefix weights in log space; ``_compute_local_residual_mass_kernel``: the residual masses;
vllm-project/vllm#46781; an opt-in ``verify_method="block"`` for the V1 sampler is proposed in
#40819, falling back to the token rule for drafters without probabilities, n-gram and suffix);
SGLang's ``chain_block_speculative_sampling_triton`` (``sglang/kernels/ops/speculative/reject_sampling.py``).

Exact comparisons on recorded calls: ``VerifierCalls`` records every chain verification of a run,
``expected_kept`` judges each recorded draft by both rules, ``first_position_tries`` computes what
m independent one-token drafts would keep at each call's first position, and ``compare_means``
compares such per-call expectations as a ratio of means with a bootstrap interval.
"""
from __future__ import annotations

import numpy as np
import torch

from ..engine import generate
from ..sampling import SamplingParams
from .harness.claims import MIN_PAIRS, Comparison, compare_paired, verdict_of

#: Drafters whose drafts carry a sampled q, with the options that make them sample. (Hydra's chain
#: drafts greedily only: its heads read the tokens drafted before them, and sampling them is not
#: offered, so its q is one-hot and both rules keep the same number of tokens in expectation.)
DRAFTERS_WITH_Q = {"draft": {}, "early-exit": {}, "eagle": {}, "medusa-chain": {"draft_sampling": "sample"}}
RULES = ("token", "block")


def run_verification_comparison(model, prompts: list, drafters=None, temperatures=(0.7, 1.0),
                                max_new_tokens: int = 48, seeds=(0,), progress: bool = True):
    """Decode every prompt (1-D LongTensors) with each drafter at each temperature, once per rule
    and seed, the two rules back to back. drafters: name -> load_proposer options (default
    :data:`DRAFTERS_WITH_Q`). Returns a DataFrame, one row per (drafter, temperature, prompt, seed,
    rule): tau, accepted, drafted, steps, new_tokens, wall_s, tokens_per_s."""
    import pandas as pd
    from tqdm.auto import tqdm

    from ..proposers import load_proposer

    drafters = DRAFTERS_WITH_Q if drafters is None else drafters
    jobs = [(name, t, i, s) for name in drafters for t in temperatures for i in range(len(prompts)) for s in seeds]
    rows, made = [], {}
    for name, t, i, s in tqdm(jobs, desc="token vs block", disable=not progress):
        if name not in made:
            made[name] = load_proposer(name, model, **drafters[name])
        sampling = SamplingParams(temperature=t)
        for rule in RULES:
            out = generate(model, prompts[i], made[name], max_new_tokens=max_new_tokens, sampling=sampling, seed=s,
                           verification=rule)
            st = out.stats
            rows.append({"drafter": name, "temperature": t, "prompt": i, "seed": s, "rule": rule, "tau": st.tau,
                         "accepted": st.accepted, "drafted": st.drafted, "steps": st.steps,
                         "new_tokens": st.new_tokens, "wall_s": st.wall_time_s, "tokens_per_s": st.tokens_per_s})
    return pd.DataFrame(rows)


def summarize_verification(df):
    """Per (drafter, temperature): mean τ of each rule, and block against token on τ and on
    tokens/s, paired over prompts (seeds averaged per prompt), each a claims.Comparison."""
    import pandas as pd

    out = []
    for (name, t), g in df.groupby(["drafter", "temperature"], sort=False):
        per = g.groupby(["prompt", "rule"])[["tau", "tokens_per_s"]].mean().unstack("rule")
        out.append({"drafter": name, "temperature": t, "tau_token": per["tau"]["token"].mean(),
                    "tau_block": per["tau"]["block"].mean(),
                    "tau": compare_paired(per["tau"]["block"], per["tau"]["token"], tolerance=0.0),
                    "speed": compare_paired(per["tokens_per_s"]["block"], per["tokens_per_s"]["token"])})
    return pd.DataFrame(out)


# ---- exact and per-call comparisons -------------------------------------------------------------

def keep_probabilities(p, q, draft, rule: str = "block") -> torch.Tensor:
    """P(the call keeps exactly i drafted tokens | this draft), i = 0..K, for one chain.

    p: [K+1, V] the target's distributions, q: [K, V] the drafter's (None: one-hot on the draft),
    draft: [K] ids. The token rule keeps i with probability prod_{j<=i} a_j * (1 - a_{i+1}),
    a_j = min(1, p_j(x_j)/q_j(x_j)); the block rule with h_i * prod_{j>i} (1 - h_j), the stop
    probabilities of verify.stop_probabilities. Exact: no sampling."""
    from ..verify import prefix_weights, stop_probabilities

    p = torch.as_tensor(p, dtype=torch.float64)
    draft = torch.as_tensor(draft, dtype=torch.long)
    k, v = draft.numel(), p.shape[1]
    if p.shape[0] != k + 1:
        raise ValueError(f"p must have K+1 = {k + 1} rows for a draft of {k} tokens, got {p.shape[0]}")
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    if q is None:
        q = torch.zeros(k, v, dtype=torch.float64)
        q[torch.arange(k), draft] = 1.0
    q = torch.as_tensor(q, dtype=torch.float64)
    pos = torch.arange(k)
    ratio = p[pos, draft] / q[pos, draft]
    if rule == "token":
        a = ratio.clamp(max=1.0)
        survive = torch.cat([torch.ones(1, dtype=torch.float64), torch.cumprod(a, 0)])  # kept at least i
        return survive - torch.cat([survive[1:], torch.zeros(1, dtype=torch.float64)])
    w = prefix_weights(ratio[None], torch.ones(1, k, dtype=torch.bool))[0].double()
    q_next = torch.cat([q, torch.zeros(1, v, dtype=torch.float64)])
    r = (w[:, None] * p - q_next).clamp(min=0).sum(-1)
    h = stop_probabilities(r[None], w[None])[0]
    later = torch.cat([torch.flip(torch.cumprod(torch.flip(1 - h[1:], [0]), 0), [0]), torch.ones(1, dtype=torch.float64)])
    return h * later  # h_i times "no longer prefix passed"


def expected_accepted(p, q, rule: str = "block") -> float:
    """Expected number of drafted tokens one call keeps, averaged exactly over every draft.

    p: [K+1, V], q: [K, V], both the same whatever was drafted before (a context-free toy, as in
    Sun et al.'s example). Small V and K only: V**K drafts."""
    import itertools

    q = torch.as_tensor(q, dtype=torch.float64)
    k, v = q.shape
    total = 0.0
    for draft in itertools.product(range(v), repeat=k):
        prob = float(q[torch.arange(k), torch.tensor(draft)].prod())
        if prob > 0:
            keep = keep_probabilities(p, q, draft, rule)
            total += prob * float((torch.arange(k + 1, dtype=torch.float64) * keep).sum())
    return total


class VerifierCalls:
    """Record every chain verification ``generate`` runs: the target's probabilities, the draft and
    the drafter's q of each call (``with VerifierCalls() as calls: generate(...)``).

    Judging the same recorded calls by both rules (``expected_kept``) compares them on exactly
    the same drafts, so what differs is the rule alone, not the trajectory: two decodings that
    part after one different token see different contexts, and their τ differ by more than the
    rules do."""

    def __init__(self):
        self.calls: list = []

    def __enter__(self):
        from .. import engine

        self._engine, self._saved = engine, engine.rejection_sample

        def spy(target_probs, draft_tokens, draft_probs=None, generator=None):
            self.calls.append((target_probs.detach().clone(), draft_tokens.detach().clone(),
                               None if draft_probs is None else draft_probs.detach().clone()))
            return self._saved(target_probs, draft_tokens, draft_probs, generator)

        engine.rejection_sample = spy
        return self

    def __exit__(self, *exc):
        self._engine.rejection_sample = self._saved
        return False


def expected_kept(calls: list):
    """For each recorded call (one chain, batch of one), the expected number of drafted tokens each
    rule keeps given that call's draft (exact, :func:`keep_probabilities`). A DataFrame with one
    row per call: draft_len, token, block."""
    import pandas as pd

    rows = []
    for i, (p, d, q) in enumerate(calls):
        n = int((d[0] >= 0).sum())
        if n == 0:
            continue
        pp, dd, qq = p[0, : n + 1], d[0, :n], None if q is None else q[0, :n]
        ks = torch.arange(n + 1, dtype=torch.float64)
        rows.append({"call": i, "draft_len": n,
                     "token": float((ks * keep_probabilities(pp, qq, dd, "token")).sum()),
                     "block": float((ks * keep_probabilities(pp, qq, dd, "block")).sum())})
    return pd.DataFrame(rows)


def compare_means(a, b, confidence: float = 0.95, tolerance: float = 0.0, n_boot: int = 4000, seed: int = 0,
                  unit: str = "call") -> Comparison:
    """A against B paired (``a[i]`` with ``b[i]``) as the ratio of their MEANS, with a percentile
    bootstrap interval that resamples the pairs; a claims.Comparison (> 1: A larger).

    claims.compare_paired reports the geometric mean of the per-pair ratios, the right summary for
    speeds. A claim about expectations needs the ratio of means instead: block verification keeps
    at least as many tokens as the token rule *on average over the drafts*, which bounds
    mean(block) / mean(token), not the geometric mean of per-call ratios. Values may be 0 (a run
    that kept no first token); B's mean must be positive. ``verdict`` follows the interval as in
    compare_paired (claims.verdict_of), and is always "level" with fewer than ``MIN_PAIRS`` pairs (lo
    and hi are then the ratio itself)."""
    a = np.asarray(a, dtype=float).reshape(-1)
    b = np.asarray(b, dtype=float).reshape(-1)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"compare_means needs the same non-zero number of values for A and B, got {a.size} and {b.size}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b)) and np.all(a >= 0) and np.all(b >= 0)):
        raise ValueError("compare_means needs finite values >= 0")
    if not b.mean() > 0:
        raise ValueError("compare_means: B's mean is 0, so the ratio means nothing")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    ratio = float(a.mean() / b.mean())
    if a.size < MIN_PAIRS:
        return Comparison(ratio, ratio, ratio, int(a.size), confidence, tolerance, "level", unit)
    idx = np.random.default_rng(seed).integers(0, a.size, size=(n_boot, a.size))
    num, den = a[idx].mean(axis=1), b[idx].mean(axis=1)
    boots = num[den > 0] / den[den > 0]  # a resample of B's zeros alone has no ratio
    tail = (1 - confidence) / 2
    lo, hi = (float(v) for v in np.quantile(boots, [tail, 1 - tail]))
    return Comparison(ratio, lo, hi, int(a.size), confidence, tolerance, verdict_of(lo, hi, tolerance), unit)


def first_position_tries(calls: list, tries: int = 4):
    """For each recorded chain call (``VerifierCalls``), the probability that its FIRST drafted
    position keeps a token when j = 1..``tries`` independent drafts from that position's q are
    tried there one after another, by tree_rejection_sample's sibling rule: a draw x ~ q is
    accepted with min(1, r(x)/q(x)), r = p at the first try; after a rejection
    r <- normalise(max(r - q, 0)) and the next draw is tried against it.

    Exact (no sampling), from the call's p and q at the first position: try j is accepted with
    probability sum_x min(r_j(x), q(x)), so the column for j tries is 1 - prod_{i<=j}(1 - that). It
    is what m one-token drafts (IndependentDrafts(drafter, m) with k = 1) would keep in the same
    context, without decoding again. Every try after the first can only succeed on tokens with
    p > q, with probability at most q's mass there. A call without q (one-hot drafts) uses q
    one-hot on its first token. Returns a DataFrame, one row per call with a draft: call,
    draft_len, keep_1 .. keep_<tries>."""
    import pandas as pd

    if not isinstance(tries, int) or tries < 1:
        raise ValueError(f"tries must be an int >= 1, got {tries!r}")
    rows = []
    for i, (p, d, q) in enumerate(calls):
        n = int((d[0] >= 0).sum())
        if n == 0:
            continue
        r = p[0, 0].double()
        if q is None:
            q1 = torch.zeros_like(r)
            q1[int(d[0, 0])] = 1.0
        else:
            q1 = q[0, 0].double()
        row, missed = {"call": i, "draft_len": n}, 1.0
        for j in range(1, tries + 1):
            accept = float(torch.minimum(r, q1).sum())
            missed *= max(0.0, 1.0 - accept)
            row[f"keep_{j}"] = 1.0 - missed
            residual = (r - q1).clamp(min=0.0)
            mass = float(residual.sum())
            if mass <= 1e-12:  # r == q: the try is accepted with probability 1, later ones never run
                missed = 0.0
                for jj in range(j + 1, tries + 1):
                    row[f"keep_{jj}"] = 1.0
                break
            r = residual / mass
        rows.append(row)
    return pd.DataFrame(rows)


def markov_joint_check(verifier, vocab: int = 3, k: int = 3, tokens: int = 3, n: int = 30000, seed: int = 0):
    """Decode ``n`` sequences of a tiny Markov 'language model' speculatively with ``verifier``
    (rejection_sample's signature), drafts from a second, different Markov chain, and test the
    first ``tokens`` emitted tokens against the target chain's exact joint law (chi-square).

    The target is p(x_t | x_{t-1}) = P[x_{t-1}], the drafter q(x_t | x_{t-1}) = Q[x_{t-1}]; every
    row of the batch is one sequence, all verified in one call per step. Returns a
    measure.harness.stats.ChiSquareResult."""
    import itertools

    import numpy as np

    from .harness.stats import chi_square_test

    g = torch.Generator().manual_seed(seed)
    P = torch.softmax(2.0 * torch.randn(vocab, vocab, generator=g), -1)
    Q = torch.softmax(2.0 * torch.randn(vocab, vocab, generator=g), -1)
    last = torch.zeros(n, dtype=torch.long)  # every sequence starts after token 0
    out = [[] for _ in range(n)]
    while min(len(o) for o in out) < tokens:
        drafts, prev = [], last
        for _ in range(k):
            prev = torch.multinomial(Q[prev], 1, generator=g).squeeze(1)
            drafts.append(prev)
        d = torch.stack(drafts, 1)  # [n, k]
        ctx = torch.cat([last[:, None], d], 1)  # the token before each scored position
        emitted, num = verifier(P[ctx], d, Q[torch.cat([last[:, None], d[:, :-1]], 1)], g)
        for row in range(n):
            out[row].extend(emitted[row, : int(num[row]) + 1].tolist())
        last = torch.tensor([o[-1] for o in out])
    seqs = list(itertools.product(range(vocab), repeat=tokens))
    exact = np.array([float(np.prod([P[a, b] for a, b in zip((0,) + s[:-1], s)])) for s in seqs])
    counts = np.zeros(len(seqs))
    index = {s: i for i, s in enumerate(seqs)}
    for o in out:
        counts[index[tuple(o[:tokens])]] += 1
    return chi_square_test(counts, exact)
