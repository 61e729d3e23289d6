"""From what a serving engine reports to what speculation will do: tokens per step, speedup at each
K and batch size, the best K, and the acceptance at which drafting breaks even.

A production engine does not tell you whether speculation pays; it reports counters. vLLM exports
four on its Prometheus endpoint (``vllm/v1/spec_decode/metrics.py``; ``LLM.get_metrics()`` offline):

    spec_decode_num_drafts              request-steps that drafted something
    spec_decode_num_draft_tokens        tokens drafted
    spec_decode_num_accepted_tokens     drafted tokens the target accepted
    spec_decode_num_accepted_tokens_per_pos[i]   drafts whose first i+1 tokens were all accepted

``accepted_per_pos[i] / num_drafts`` is the survival s_i = P(the first i+1 drafted tokens are all
kept). A step that drafts K tokens emits 1 + s_0 + ... + s_{K-1} tokens on average (the target's
own token, plus each position that survives). Drafting K' < K tokens keeps the first K' of the
same draft for a chain drafter (n-gram, draft model, EAGLE's chain), so the same survivals predict
every smaller K exactly in expectation; a larger K needs an extrapolation, done here with the
i.i.d. estimate of the acceptance rate (``analysis.estimate_alpha``) and flagged in the table.

Not every drafter drafts K tokens on every step. Prompt lookup drafts only when the context holds a
match, and then only as many tokens as follow the match; suffix decoding stops where its tree's
probability runs out. Two more numbers describe that: the **drafting share** f (drafting steps over
all decode steps) and the **draft lengths** L of the drafting steps (asked for K, a step drafts
min(L, K)). SpecStats and the course's stored tables keep both; vLLM's four counters keep neither
(pass ``num_steps``, e.g. generated tokens minus accepted ones, when you have it; without it every
step is taken to draft, and without lengths every draft is taken to be the mean length).

The cost side is a step time T(B, n): one target forward over B requests scoring n tokens each
(``measure.batch_bench.measure_cost_surface`` on this machine, ``policies.roofline_cost`` as a
shape, or ``measure.harness.bench.measure_cost_curve`` at B = 1), plus the drafter's time per drafted token
d(B), plus the engine's own time per step outside the forward and the drafter: o(B) on a
speculative step, o_0(B) on a plain one (sampling, cache bookkeeping, Python; the routing tables
measure both). Per batch size B and draft length K, with m_K = min(L, K),

    tokens(K)  = 1 + f (s_0 + ... + s_{K-1})
    cost(K)    = f E[T(B, m_K + 1)] + (1 - f) T(B, 1) + f E[m_K] d(B) + o(B)
    speedup(B, K) = tokens(K) (T(B, 1) + o_0(B)) / cost(K)

The best K maximises it (0: do not speculate); break-even is where it equals 1. A drafter that
always drafts K (draft model, EAGLE's chain, Hydra's chain) has f = 1 and m_K = K, and the formula
is notebook 02's.

A **parallel drafter** (PARD, notebook 13) drafts all K tokens in one forward: its drafting costs
D(B) per drafting step, whatever K, instead of d(B) per drafted token, and cost(K) gains f D(B) in
place of f E[m_K] d(B) (``draft_step_cost``; :func:`run_costs` measures D for the names in
``PARALLEL_DRAFTERS``). Taking D as one number ignores the few more positions a longer K feeds
through that forward, which is what a forward at the memory floor costs.

    from specdecode_ref.serving import advisor
    profile = advisor.AcceptanceProfile.from_prometheus(open("metrics.txt").read())
    advice = advisor.advise(profile, cost=advisor.roofline_cost(16), batch_sizes=(1, 8, 32))
    advice.best            # B -> best K and its predicted speedup
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..analysis import break_even_alpha
from ..measure.harness.protocol import decode_t1
from ..metrics import SpecStats
from .metrics import ACCEPTED_PER_POS, ACCEPTED_TOKENS, DRAFT_TOKENS, DRAFTS
from .policies import roofline_cost, surface_cost

__all__ = ["AcceptanceProfile", "Advice", "RunCosts", "PARALLEL_DRAFTERS", "is_parallel", "stored_counters", "advise",
           "advise_on", "as_step_cost", "predicted_vs_measured", "roofline_cost",
           "run_costs", "step_cost"]


def _count(value, name: str) -> float:
    x = float(value)
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"{name} must be a finite count >= 0, got {value!r}")
    return x


@dataclass(frozen=True)
class AcceptanceProfile:
    """vLLM's four speculative-decoding counters, and what they say about acceptance.

    num_drafts, num_draft_tokens, num_accepted_tokens: totals (or differences of two scrapes).
    accepted_per_pos: [K] drafts whose first i+1 tokens were all accepted, i = 0..K-1.
    num_steps: every decode step, drafting or not (None: every step drafted, as vLLM's counters
        alone must assume). draft_length_counts: [K] drafting steps that drafted 1, 2, ..., K tokens
        (None: unknown; every draft is then taken to be of the mean length).
    num_speculative_tokens: the K the run asked for (vLLM's setting of that name; None: unknown,
        taken to be the longest draft). When the longest draft is shorter (suffix decoding asked for
        24 and never drafted more than a dozen), nothing is extrapolated up to that K.
    """

    num_drafts: float
    num_draft_tokens: float
    num_accepted_tokens: float
    accepted_per_pos: tuple
    num_steps: float | None = None
    draft_length_counts: tuple | None = None
    num_speculative_tokens: int | None = None

    def __post_init__(self):
        for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
            object.__setattr__(self, name, _count(getattr(self, name), name))
        pos = tuple(_count(x, "accepted_per_pos") for x in self.accepted_per_pos)
        object.__setattr__(self, "accepted_per_pos", pos)
        if self.num_drafts <= 0:
            raise ValueError("num_drafts is 0: the engine has not drafted yet, so the counters say nothing "
                             "about acceptance (send traffic with speculation on, then read them)")
        if not pos:
            raise ValueError("accepted_per_pos is empty: per-position counts are needed to predict other K")
        if any(b > a + 1e-9 for a, b in zip(pos, pos[1:])):
            raise ValueError(f"accepted_per_pos must not increase with the position (a draft reaching position "
                             f"i+1 reached i), got {list(pos)}")
        if pos[0] > self.num_drafts + 1e-9:
            raise ValueError(f"accepted_per_pos[0] = {pos[0]} exceeds num_drafts = {self.num_drafts}")
        if abs(sum(pos) - self.num_accepted_tokens) > 1e-6 * max(1.0, self.num_accepted_tokens):
            raise ValueError(f"accepted_per_pos sums to {sum(pos)}, not num_accepted_tokens = "
                             f"{self.num_accepted_tokens}: the counters come from different scrapes")
        if self.num_accepted_tokens > self.num_draft_tokens + 1e-9:
            raise ValueError("more tokens accepted than drafted")
        if self.num_steps is not None:
            object.__setattr__(self, "num_steps", _count(self.num_steps, "num_steps"))
            if self.num_steps < self.num_drafts - 1e-9:
                raise ValueError(f"num_steps = {self.num_steps} is below num_drafts = {self.num_drafts}: every "
                                 "drafting step is a step")
        if self.draft_length_counts is not None:
            lengths = tuple(_count(x, "draft_length_counts") for x in self.draft_length_counts)
            object.__setattr__(self, "draft_length_counts", lengths)
            if abs(sum(lengths) - self.num_drafts) > 1e-6 * max(1.0, self.num_drafts):
                raise ValueError(f"draft_length_counts sums to {sum(lengths)} drafts, not num_drafts = {self.num_drafts}")
            drafted = sum((i + 1) * n for i, n in enumerate(lengths))
            if abs(drafted - self.num_draft_tokens) > 1e-6 * max(1.0, self.num_draft_tokens):
                raise ValueError(f"draft_length_counts make {drafted} drafted tokens, not num_draft_tokens = "
                                 f"{self.num_draft_tokens}")
            if len(lengths) < len(pos):
                raise ValueError(f"accepted_per_pos reaches position {len(pos)} but no draft is longer than "
                                 f"{len(lengths)} tokens")
        if self.num_speculative_tokens is not None and self.num_speculative_tokens < self.longest_draft:
            raise ValueError(f"num_speculative_tokens = {self.num_speculative_tokens} is below the longest draft "
                             f"({self.longest_draft} tokens)")

    @property
    def longest_draft(self) -> int:
        """The longest draft the counters saw (per-position counts, or the draft lengths)."""
        return max(len(self.accepted_per_pos), len(self.draft_length_counts or ()))

    def extrapolates(self, k: int) -> bool:
        """Whether a prediction at ``k`` extends the survivals past what the run could show: ``k``
        beyond the longest draft, when drafts of that length were cut by the run's K (not when the
        drafter stopped short of a larger K on its own)."""
        k_run = self.num_speculative_tokens
        return k > self.longest_draft and (k_run is None or k > k_run)

    # -- constructors ------------------------------------------------------------------------
    @classmethod
    def from_counters(cls, counters: dict) -> "AcceptanceProfile":
        """From a dict under vLLM's names, with or without the ``vllm:`` prefix and ``_total`` suffix
        (``vllm_runner`` results, ``serving.metrics.vllm_counters``, a parsed scrape). The course's
        own keys ``steps`` and ``draft_length_counts`` (``measure.routing`` tables) are read when
        present."""
        found = {}
        for key, value in counters.items():
            name = str(key).removeprefix("vllm:").removesuffix("_total")
            found[name] = value
        names = {"spec_decode_num_drafts": "num_drafts", "spec_decode_num_draft_tokens": "num_draft_tokens",
                 "spec_decode_num_accepted_tokens": "num_accepted_tokens",
                 "spec_decode_num_accepted_tokens_per_pos": "accepted_per_pos"}
        missing = [n for n in names if n not in found]
        if missing:
            raise KeyError(f"counters lack {missing}; got {sorted(counters)}")
        per_pos = found["spec_decode_num_accepted_tokens_per_pos"]
        per_pos = tuple(per_pos.values() if isinstance(per_pos, dict) else per_pos)
        lengths = found.get("draft_length_counts")
        k_run = found.get("num_speculative_tokens")
        return cls(found["spec_decode_num_drafts"], found["spec_decode_num_draft_tokens"],
                   found["spec_decode_num_accepted_tokens"], per_pos, num_steps=found.get("steps"),
                   draft_length_counts=None if lengths is None else tuple(lengths),
                   num_speculative_tokens=None if k_run is None else int(k_run))

    @classmethod
    def from_prometheus(cls, text: str) -> "AcceptanceProfile":
        """From the text of a Prometheus scrape (``curl host:8000/metrics``). Label sets other than
        ``position`` (engine, model_name) are summed."""
        totals: dict = {}
        per_pos: dict = {}
        line_re = re.compile(r"^(vllm:spec_decode_[a-z_]+?)(?:_total)?(\{[^}]*\})?\s+([0-9.eE+-]+|NaN)\s*$")
        for line in text.splitlines():
            m = line_re.match(line.strip())
            if not m:
                continue
            name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
            if name == ACCEPTED_PER_POS:
                pos = re.search(r'position="(\d+)"', labels)
                if pos is None:
                    raise ValueError(f"a per-position line without a position label: {line!r}")
                per_pos[int(pos.group(1))] = per_pos.get(int(pos.group(1)), 0.0) + value
            elif name in (DRAFTS, DRAFT_TOKENS, ACCEPTED_TOKENS):
                totals[name] = totals.get(name, 0.0) + value
        if sorted(per_pos) != list(range(len(per_pos))):
            raise ValueError(f"per-position counters for positions {sorted(per_pos)}: some are missing")
        return cls.from_counters({**totals, ACCEPTED_PER_POS: [per_pos[i] for i in sorted(per_pos)]})

    @classmethod
    def from_stats(cls, stats: SpecStats) -> "AcceptanceProfile":
        """From the course's SpecStats (one request, or pooled with ``metrics.merge_stats``)."""
        lengths = [int(n) for n in stats.draft_lengths if n > 0]
        return cls(stats.drafting_steps, stats.drafted, stats.accepted, tuple(stats.accepted_per_position),
                   num_steps=stats.steps,
                   draft_length_counts=tuple(lengths.count(n) for n in range(1, max(lengths, default=0) + 1)))

    def difference(self, earlier: "AcceptanceProfile") -> "AcceptanceProfile":
        """The counters accumulated between two scrapes (``self`` the later one): a window of traffic."""
        n = max(len(self.accepted_per_pos), len(earlier.accepted_per_pos))
        pad = lambda xs, n=n: list(xs) + [0.0] * (n - len(xs))  # noqa: E731
        steps = None if self.num_steps is None or earlier.num_steps is None else self.num_steps - earlier.num_steps
        lengths = None
        if self.draft_length_counts is not None and earlier.draft_length_counts is not None:
            m = max(len(self.draft_length_counts), len(earlier.draft_length_counts))
            lengths = tuple(a - b for a, b in zip(pad(self.draft_length_counts, m), pad(earlier.draft_length_counts, m)))
        return AcceptanceProfile(self.num_drafts - earlier.num_drafts, self.num_draft_tokens - earlier.num_draft_tokens,
                                 self.num_accepted_tokens - earlier.num_accepted_tokens,
                                 tuple(a - b for a, b in zip(pad(self.accepted_per_pos), pad(earlier.accepted_per_pos))),
                                 num_steps=steps, draft_length_counts=lengths)

    # -- what the counters say -----------------------------------------------------------------
    @property
    def k(self) -> int:
        """The longest draft the counters cover (positions reported)."""
        return len(self.accepted_per_pos)

    @property
    def mean_draft_length(self) -> float:
        """Tokens per draft; below ``k`` when the drafter sometimes proposes fewer (n-gram, suffix)."""
        return self.num_draft_tokens / self.num_drafts

    @property
    def drafting_share(self) -> float:
        """f: the share of decode steps that drafted (1 when the counters do not say)."""
        return 1.0 if self.num_steps is None or self.num_steps == 0 else self.num_drafts / self.num_steps

    def draft_lengths(self, k: int) -> tuple:
        """(lengths, weights): what a drafting step drafts when asked for ``k`` tokens, min(L, k),
        with its probability. Drafts that reached the measured maximum are taken to go on to ``k``
        (a chain drafter asked for more drafts more); shorter ones stop where they stopped. Without
        ``draft_length_counts`` every draft has the mean length."""
        if self.draft_length_counts is None or sum(self.draft_length_counts) == 0:
            return (np.array([min(float(k), self.mean_draft_length)]), np.array([1.0]))
        counts = np.asarray(self.draft_length_counts, dtype=float)
        lengths = np.arange(1, len(counts) + 1, dtype=float)
        k_run = self.num_speculative_tokens
        if k_run is None or len(counts) == k_run:  # drafts cut by the run's K would go on at a larger k
            lengths[-1] = max(lengths[-1], k)
        return np.minimum(lengths, k), counts / counts.sum()

    @property
    def mean_acceptance_length(self) -> float:
        """vLLM's figure: 1 + accepted / drafts, the tokens a drafting step emits on average."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts

    @property
    def acceptance_rate(self) -> float:
        """vLLM's draft acceptance rate, accepted / drafted (counts untested tokens as failures)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def survival(self) -> np.ndarray:
        """s_i = P(the first i+1 drafted tokens all kept), i = 0..k-1, over drafting steps."""
        return np.asarray(self.accepted_per_pos, dtype=float) / self.num_drafts

    @property
    def conditional(self) -> np.ndarray:
        """a_i = s_i / s_{i-1}: acceptance at position i given every earlier one was kept (NaN where
        no draft got that far)."""
        s = self.survival
        prev = np.concatenate([[1.0], s[:-1]])
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(prev > 0, s / np.where(prev > 0, prev, 1.0), np.nan)

    @property
    def alpha(self) -> float:
        """The i.i.d. acceptance rate that explains the counters: accepted / tested positions, a
        draft's positions after its first rejection untested (``analysis.estimate_alpha``). Needs
        drafts of full length k; shorter drafts make it an estimate from below."""
        full = self.accepted_per_pos[-1]  # drafts with every position kept: no rejection tested
        tested = self.num_accepted_tokens + (self.num_drafts - full)
        return self.num_accepted_tokens / tested if tested > 0 else 1.0

    def tokens_per_step(self, k: int) -> float:
        """Expected tokens a *drafting* step emits when asked for ``k`` tokens: 1 + s_0 + ... + s_{k-1};
        past the measured positions the survival keeps falling by ``alpha`` per position. A step
        that drafts fewer than ``k`` contributes nothing past its length (its s_i counts it as not
        kept), so the survivals already carry short drafts."""
        if not isinstance(k, (int, np.integer)) or k < 0:
            raise ValueError(f"k must be an int >= 0, got {k!r}")
        s = self.survival
        if k <= len(s) or not self.extrapolates(k):
            return float(1.0 + s[:k].sum())
        extra = s[-1] * np.cumprod(np.full(k - len(s), self.alpha))
        return float(1.0 + s.sum() + extra.sum())

    def tokens_per_decode_step(self, k: int) -> float:
        """Expected tokens *any* decode step emits when asked for ``k``: 1 + f (s_0 + ... + s_{k-1}),
        a step that does not draft emitting the target's one token."""
        return 1.0 + self.drafting_share * (self.tokens_per_step(k) - 1.0)


def as_step_cost(cost) -> Callable[[int, float], float]:
    """T(B, n) as a function: a callable (returned as is), a measured surface (a DataFrame with
    columns B, n, time_s), or a single-request cost curve (``bench.measure_cost_curve``'s dict, for
    B = 1 only)."""
    if callable(cost):
        return cost
    if isinstance(cost, dict) and "ns" in cost and "times_s" in cost:
        from ..analysis import monotone_cost_curve

        ns = np.asarray(sorted(cost["ns"]), dtype=float)
        ts = monotone_cost_curve(ns, [t for _, t in sorted(zip(cost["ns"], cost["times_s"]))])

        def one_request(b: int, n: float) -> float:
            if b != 1:
                raise ValueError(f"a single-request cost curve has no batch size {b}: measure a surface "
                                 "(measure.batch_bench.measure_cost_surface)")
            if n > ns[-1]:
                slope = (ts[-1] - ts[0]) / (ns[-1] - ns[0]) if len(ns) > 1 else 0.0
                return float(ts[-1] + slope * (n - ns[-1]))
            return float(np.interp(n, ns, ts))

        return one_request
    if hasattr(cost, "columns") and {"B", "n", "time_s"} <= set(cost.columns):
        return surface_cost(cost)
    raise TypeError("cost must be a function T(B, n), a cost surface (columns B, n, time_s) or a cost curve "
                    f"dict (ns, times_s); got {type(cost).__name__}")


def _per_batch(value, b: int) -> float:
    v = value(b) if callable(value) else value
    v = float(v)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"a draft or overhead cost must be a finite number >= 0, got {v!r} at B = {b}")
    return v


@dataclass
class Advice:
    """What :func:`advise` predicts.

    table: one row per (B, K): tokens_per_step, cost (one step's time over a plain step's),
        speedup, break_even_alpha (i.i.d.; NaN: no acceptance rate pays for this K), extrapolated
        (K beyond the positions the counters cover).
    best: one row per B: the best K (0 = plain decoding wins) and its predicted speedup.
    """

    profile: AcceptanceProfile
    table: object
    best: object

    def best_k(self, batch_size: int) -> int:
        row = self.best[self.best.B == batch_size]
        if row.empty:
            raise KeyError(f"no advice for batch size {batch_size}; have {sorted(self.best.B)}")
        return int(row.k.iloc[0])

    def speedup(self, batch_size: int, k: int) -> float:
        row = self.table[(self.table.B == batch_size) & (self.table.K == k)]
        if row.empty:
            raise KeyError(f"no prediction for B = {batch_size}, K = {k}")
        return float(row.speedup.iloc[0])


def step_cost(profile: AcceptanceProfile, k: int, step: Callable[[int, float], float], b: int = 1,
              draft_cost: float = 0.0, overhead: float = 0.0, draft_step_cost: float = 0.0) -> float:
    """One decode step's expected time when the drafter is asked for ``k`` tokens:
    f E[T(B, min(L, k) + 1)] + (1 - f) T(B, 1) + f E[min(L, k)] d + f D + o (the module docstring's
    cost(K); ``step`` is T(B, n), ``draft_cost`` d per drafted token, ``draft_step_cost`` D per
    drafting step (a parallel drafter's one forward), ``overhead`` o per step)."""
    f = profile.drafting_share
    lengths, weights = profile.draft_lengths(k)
    forward = f * float(sum(w * step(b, m + 1) for m, w in zip(lengths, weights))) + (1.0 - f) * float(step(b, 1))
    return forward + f * float(np.dot(lengths, weights)) * draft_cost + f * draft_step_cost + overhead


def advise(profile: AcceptanceProfile, cost=None, draft_cost: float | Callable[[int], float] = 0.0,
           ks: Sequence[int] = range(1, 9), batch_sizes: Sequence[int] = (1,),
           overhead: float | Callable[[int], float] = 0.0,
           plain_overhead: float | Callable[[int], float] | None = None,
           draft_step_cost: float | Callable[[int], float] = 0.0) -> Advice:
    """Predicted speedup of speculation at every K in ``ks`` and batch size in ``batch_sizes``
    (the module docstring's formula: drafting share, draft lengths and both overheads included).

    profile: the acceptance counters. cost: T(B, n) (see :func:`as_step_cost`; None = a roofline
    with its knee at 16 tokens). draft_cost: time to draft one token for the whole batch of B, in
    the unit of T (a number or a function of B; 0 for n-gram and suffix lookups). overhead: the
    engine's time per speculative step outside the forward and the drafter, o(B); plain_overhead:
    the same for a plain step, o_0(B) (None: equal to ``overhead``, so an overhead both kinds of
    step pay alike counts on both sides). draft_step_cost: a parallel drafter's time per drafting
    step D(B), whatever K (its draft_cost is then 0).
    """
    import pandas as pd

    if not isinstance(profile, AcceptanceProfile):
        raise TypeError(f"profile must be an AcceptanceProfile, got {type(profile).__name__}")
    step = as_step_cost(roofline_cost(16.0) if cost is None else cost)
    ks = [int(k) for k in ks]
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must hold ints >= 1, got {ks!r}")
    sizes = [int(b) for b in batch_sizes]
    if not sizes or min(sizes) < 1:
        raise ValueError(f"batch_sizes must hold ints >= 1, got {batch_sizes!r}")
    rows, best = [], []
    for b in sizes:
        t1 = float(step(b, 1))
        if not t1 > 0:
            raise ValueError(f"T({b}, 1) must be > 0, got {t1}")
        d, o, dd = _per_batch(draft_cost, b), _per_batch(overhead, b), _per_batch(draft_step_cost, b)
        o0 = o if plain_overhead is None else _per_batch(plain_overhead, b)
        plain_step = t1 + o0
        top = (1.0, 0)
        for k in ks:
            spend = step_cost(profile, k, step, b, d, o, dd) / plain_step
            tokens = profile.tokens_per_decode_step(k)
            speedup = tokens / spend
            # break-even of an i.i.d. chain drafter that drafts k tokens on every step
            be = break_even_alpha(k, d / plain_step,
                                  lambda kk, b=b, o=o, dd=dd: (float(step(b, kk + 1)) + o + dd) / plain_step)
            rows.append({"B": b, "K": k, "tokens_per_step": tokens, "cost": spend, "speedup": speedup,
                         "break_even_alpha": be, "extrapolated": profile.extrapolates(k)})
            if speedup > top[0] + 1e-12:  # ties keep the smaller K; K = 0 (plain) unless something beats it
                top = (speedup, k)
        best.append({"B": b, "k": top[1], "speedup": top[0]})
    return Advice(profile, pd.DataFrame(rows), pd.DataFrame(best))


PARALLEL_DRAFTERS = ("pard", "pard-tree")  # draft all K tokens in one forward: a cost per drafting step


def is_parallel(name: str) -> bool:
    """Whether method ``name`` (a proposer name, optionally ``name@K``) drafts in one forward per step."""
    return name.split("@")[0] in PARALLEL_DRAFTERS


@dataclass(frozen=True)
class RunCosts:
    """What a timed run says about a method's costs, in seconds per decode step (prefill left out):
    the target's one-token forward in that run (``t1``, from plain decoding's run), the drafter's time
    per drafted token (``draft``; 0 for a parallel drafter) or per drafting step (``draft_step``; a
    parallel drafter's one forward, else 0), and the engine's own time per step outside the target
    and the drafter, on the method's steps (``overhead``) and on plain decoding's (``plain_overhead``)."""

    profile: AcceptanceProfile
    t1: float
    draft: float
    overhead: float
    plain_overhead: float
    draft_step: float = 0.0


def run_costs(counters: dict, name: str, reference: str = "plain") -> RunCosts:
    """:class:`RunCosts` of method ``name`` from a run's pooled counters (``measure.routing``
    tables: vLLM's four counters plus steps, emitted, draft_length_counts, draft_time_s,
    target_time_s, prefill_time_s and wall_time_s). A parallel drafter's time is charged per
    drafting step (:func:`is_parallel`), every other drafter's per drafted token."""
    for m in (name, reference):
        if m not in counters:
            raise KeyError(f"no counters for {m!r}; have {sorted(k for k in counters if not k.startswith('_'))}")
    c, base = counters[name], counters[reference]

    def overhead(x):  # clipped at 0: a method with no time outside the forward and drafter rounds to -1e-19
        return max(0.0, (x["wall_time_s"] - x["target_time_s"] - x["draft_time_s"]) / x["steps"])

    t1 = decode_t1(base)
    if is_parallel(name):
        return RunCosts(AcceptanceProfile.from_counters(c), t1, 0.0, overhead(c), overhead(base),
                        c["draft_time_s"] / max(c["spec_decode_num_drafts"], 1))
    return RunCosts(AcceptanceProfile.from_counters(c), t1,
                    c["draft_time_s"] / max(c["spec_decode_num_draft_tokens"], 1), overhead(c), overhead(base))


def advise_on(rc: RunCosts, cost, ks: Sequence[int] = range(1, 9)) -> "Advice":
    """:func:`advise` for a stored run's drafter on another cost curve: its acceptance as counted,
    and its drafter's and engine's seconds per step rescaled from the run's one-token forward
    (``rc.t1``) to this curve's T(1). The one place that rescaling lives (``fitted_k`` and the
    notebooks use it). cost: a single-request cost curve (dict or function, see :func:`as_step_cost`)."""
    t1_here = float(as_step_cost(cost)(1, 1))
    scale = t1_here / rc.t1
    return advise(rc.profile, cost=cost, draft_cost=rc.draft * scale, ks=ks, overhead=rc.overhead * scale,
                  plain_overhead=rc.plain_overhead * scale, draft_step_cost=rc.draft_step * scale)


def run_cost_curve(cost_curve: dict, t1: float) -> Callable[[int, float], float]:
    """The cost curve's shape at the level of a run: T(n) * t1 / T(1). A standalone curve is timed at
    one context length; the run's own plain steps say what a one-token forward cost on its prompts."""
    step = as_step_cost(cost_curve)
    scale = t1 / step(1, 1)
    return lambda b, n: scale * step(b, n)


def predicted_vs_measured(counters: dict, cost_curve: dict, reference: str = "plain", measured_on: dict | None = None):
    """The advisor's prediction for runs whose outcome is known: one row per method of
    ``counters`` (pooled over prompts, as ``measure.routing`` tables keep them), each predicted by
    :func:`advise` at the K it ran with, from its own counters and costs (:func:`run_costs`) and the
    cost curve's shape (:func:`run_cost_curve`). Decode phase only (prefill left out).

    predicted: the forward and the drafter only; predicted_with_overheads: the engine's measured
    time per step outside them added to both sides (its own to each); measured: decode tokens per
    second over the reference's. The gap between the two predictions is what a forward-time model
    leaves out.

    measured_on: the counters of another run of the same methods, on other prompts (a held-out
    table). The prediction still comes from ``counters``; the measurement from ``measured_on``, so
    the check is out of sample: nothing the prediction used was measured on the prompts it is
    scored on. By default both come from ``counters`` (in sample).
    """
    import pandas as pd

    scored = counters if measured_on is None else measured_on
    rows = []
    for name, c in counters.items():
        if name == reference or name.startswith("_") or not c.get("spec_decode_num_drafts"):
            continue
        if name not in scored:
            raise ValueError(f"{name!r} is not in the run to measure on (it has {sorted(scored)})")
        rc = run_costs(counters, name, reference)
        step = run_cost_curve(cost_curve, rc.t1)
        k = max(rc.profile.k, len(rc.profile.draft_length_counts or ()))
        bare = advise(rc.profile, cost=step, draft_cost=rc.draft, ks=[k], draft_step_cost=rc.draft_step)
        full = advise(rc.profile, cost=step, draft_cost=rc.draft, ks=[k], overhead=rc.overhead,
                      plain_overhead=rc.plain_overhead, draft_step_cost=rc.draft_step)
        m, base = scored[name], scored[reference]
        measured = (m["emitted"] / (m["wall_time_s"] - m["prefill_time_s"])) / \
            (base["emitted"] / (base["wall_time_s"] - base["prefill_time_s"]))
        rows.append({"method": name, "k": k, "k_mean": rc.profile.mean_draft_length,
                     "drafting_share": rc.profile.drafting_share, "tau": m["emitted"] / m["steps"],
                     "predicted": bare.speedup(1, k), "predicted_with_overheads": full.speedup(1, k),
                     "measured": measured})
    out = pd.DataFrame(rows)
    out["measured_over_predicted"] = out.measured / out.predicted_with_overheads
    return out


# ---- K fitted to the machine at hand --------------------------------------------------------------

def machine_cost_curve(model, max_n: int = 10, refresh: bool = False) -> dict:
    """This machine's single-request cost curve T(n), n = 1..max_n, as a dict with ``ns`` and
    ``times_s``: :func:`specdecode_ref.sizing.machine_cost_curve`, measured once (a few seconds) and
    cached by CPU or GPU, threads, dtype, backend and model, so every later ``k="auto"`` reads it."""
    from ..sizing import machine_cost_curve as cached_curve

    return cached_curve(model, ns=range(1, max_n + 1), refresh=refresh).to_dict()


def stored_counters(name: str) -> dict:
    """The stored pooled counters that hold drafter ``name``: the routing benchmark table
    (``measure.routing``), or for the parallel drafter the table that measured it beside the
    sequential draft model (``measure.parallel``)."""
    from ..measure.routing import load_table

    counters = load_table("benchmark")["meta"]["counters"]
    if name not in counters and is_parallel(name):
        from ..measure.parallel import load_parallel_table

        counters = load_parallel_table("benchmark")["meta"]["counters"]
    return counters


def fitted_k(name: str, model, ks: Sequence[int] = range(1, 9), counters: dict | None = None) -> tuple:
    """The draft length the advisor predicts fastest for drafter ``name`` on this machine: its
    stored counters (``measure.routing``'s benchmark table, unless ``counters``) give the acceptance,
    the drafting share and draft lengths, and the drafter's and the engine's time per step relative
    to a plain step in that run (:func:`run_costs`); this machine's cost curve
    (:func:`machine_cost_curve`) gives the forward. Returns (k, advice); k = 0 when no K beats plain
    decoding. :func:`load_fitted` builds the drafter with it.
    Chains only: a tree's node budget is not a prefix of a larger one (see the module docstring)."""
    if counters is None:
        counters = stored_counters(name)
    if is_parallel(name) and name not in counters:  # the run at the longest K covers every shorter one
        runs = sorted((int(m.split("@")[1]), m) for m in counters if m.split("@")[0] == name and "@" in m)
        if runs:
            counters = {**counters, name: counters[runs[-1][1]]}
    if name not in counters or name == "plain":
        raise ValueError(f"no stored acceptance counters for {name!r}; k='auto' knows "
                         f"{sorted(k for k in counters if not k.startswith('_') and k != 'plain')}")
    if name in ("medusa", "hydra", "eagle-tree", "pard-tree"):
        raise ValueError(f"{name!r} drafts a tree: k='auto' chooses a chain's K (a smaller tree is not a prefix "
                         "of a larger one); pass its node budget as k")
    if "plain" in counters:
        rc = run_costs(counters, name)
    else:  # bare acceptance counters with the run's one-token forward time
        c, t1_run = counters[name], counters["_t1_s"]
        rc = RunCosts(AcceptanceProfile.from_counters(c), t1_run,
                      c["draft_time_s"] / max(c["spec_decode_num_draft_tokens"], 1), 0.0, 0.0)
    if is_parallel(name):  # one forward drafts at most the positions it was trained for
        ks = [k for k in ks if k <= rc.profile.k] or [1]
    advice = advise_on(rc, machine_cost_curve(model, max_n=max(ks) + 1), ks)
    return advice.best_k(1), advice


TREE_HEADS = ("medusa", "hydra")  # tree drafters whose shipped weights carry per-depth rank accuracies


def fitted_tree(name: str, model, budgets: Sequence[int] = range(0, 33), counters: dict | None = None,
                cost_curve: dict | None = None):
    """The node budget of a Medusa or Hydra tree that Sequoia's hardware-aware rule predicts fastest
    on this machine (``sizing.best_tree``): the heads' per-depth rank accuracies (stored with the
    weights) give each tree's expected tokens per step, this machine's cost curve gives T(n + 1)
    for its n nodes, and the stored counters give what a step costs besides the forward (the heads,
    the tree's bookkeeping), scaled from their run's one-token forward to this machine's. Budget 0
    is plain decoding. Returns ``sizing.TreeChoice`` (budget, tree, predicted tokens/s, table).

    The heads draft every level in one forward, so the drafting time is charged per step. Hydra's
    stored counters are for its chain; its tree is charged the chain's time per step."""
    from ..proposers.medusa import HYDRA_WEIGHTS, MEDUSA_WEIGHTS, medusa_metadata
    from ..sizing import CostCurve, best_tree, per_step_draft_cost

    if name not in TREE_HEADS:
        raise ValueError(f"fitted_tree sizes the trees of {TREE_HEADS}, not {name!r}")
    acc = medusa_metadata(MEDUSA_WEIGHTS if name == "medusa" else HYDRA_WEIGHTS).get("rank_accuracy")
    if acc is None:
        raise ValueError(f"the {name} weights carry no rank_accuracy metadata to size a tree from")
    if counters is None:
        counters = stored_counters(name if name == "medusa" else "hydra-chain")
    key = name if name in counters else f"{name}-chain"
    rc, run = run_costs(counters, key), counters[key]
    curve = CostCurve.from_dict(cost_curve if cost_curve is not None
                                else machine_cost_curve(model, max_n=max(budgets) + 1))
    scale = curve.cost(1) / rc.t1  # the stored run's per-step times, at this machine's one-token forward
    plain_outside = rc.plain_overhead * scale  # a plain step's engine time, paid by every method alike
    extra = max(0.0, rc.overhead + run["draft_time_s"] / run["steps"] - rc.plain_overhead) * scale
    return best_tree(acc, lambda n: curve.cost(n) + plain_outside, per_step_draft_cost(extra), budgets=budgets,
                     max_depth=len(acc))


def load_fitted(name: str, model, ks: Sequence[int] = range(1, 9), **kwargs):
    """``load_proposer(name, model)`` with the size predicted fastest on this machine: a chain's K
    (:func:`fitted_k`), or a Medusa or Hydra tree's node budget (:func:`fitted_tree`, budgets 0..32).
    When no size beats plain decoding there, it warns and drafts the smallest (1 token per step)."""
    import warnings

    from ..proposers import load_proposer

    if name in TREE_HEADS:
        k, what = fitted_tree(name, model).budget, "tree size"
    else:
        k, what = fitted_k(name, model, ks)[0], "K"
    if k == 0:
        warnings.warn(f"on this machine the advisor predicts that no {what} makes {name!r} faster than plain "
                      "decoding; drafting 1 token per step, the cheapest", stacklevel=2)
        k = 1
    return load_proposer(name, model, k=k, **kwargs)
