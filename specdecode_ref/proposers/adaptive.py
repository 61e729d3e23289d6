"""Adaptive K: proposer wrappers that change how many tokens the wrapped proposer drafts, step by step.

Why it stays lossless: a wrapper only sets the inner proposer's ``k`` (``ProposerWrapper.k``
passes it down, through any other wrapper in between);
the draft itself, its verification and the rollback are untouched. Verification accepts exactly
the drafted tokens the target would have produced (greedy) or keeps the target's distribution
(sampling) whatever the draft length, so any rule for choosing k, even one that reads the
outcomes of earlier steps, leaves the output law unchanged. Only speed changes.

Controllers (notebook 03):

* :class:`FixedK`: never changes k; records every step, the baseline.
* :class:`HeuristicK`: the rule Hugging Face transformers applies to assisted generation when
  ``num_assistant_tokens_schedule`` is "heuristic" (or "heuristic_transient"): see
  ``AssistedCandidateGenerator.update_candidate_strategy`` in
  ``src/transformers/generation/candidate_generator.py``. After each verification, if every
  drafted token was accepted the next draft may be two tokens longer; otherwise it becomes one
  token shorter, never below one. With "heuristic" the learned length is written back to the
  assistant's generation config when ``generate`` returns, so it carries over to the next call;
  "heuristic_transient" starts every call from the configured value. Re-implemented here from
  that description.
* :class:`GoodputK`: this course's controller. It keeps a running, exponentially forgetting
  estimate of the conditional acceptance rate at each draft position (a_i = P(position i
  accepted | 1..i-1 accepted)), and before each step picks the k that maximises the expected
  tokens per unit time, (1 + a_1 + a_1 a_2 + ...) / (c_step + k c + T(k+1)/T(1)), with
  T(n) the measured cost curve (bench.measure_cost_curve). See its docstring for the estimator.

``measure.replay`` (``draft_match_profile``, ``replay``) evaluates controllers offline: for
greedy decoding with a model-free proposer (n-gram), the outcome of any draft length at any
position follows from the plain greedy output, so a controller can be replayed against any cost
curve in milliseconds.

Production counterparts: transformers (above); vLLM drafts a fixed ``num_speculative_tokens`` per
step in ``vllm/v1/spec_decode/`` and exposes the per-position acceptance it would need for such
a controller in ``vllm/v1/spec_decode/metrics.py``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..analysis import as_verify_cost as _as_verify_cost
from .base import DecodeState, Draft, Proposer, ProposerWrapper, StepOutcome, check_k


@dataclass(frozen=True)
class StepRecord:
    """One verification step as a controller saw it."""

    k: int  # the k the controller asked for
    drafted: int  # tokens actually drafted (fewer when the proposer had none or the budget ended)
    accepted: int  # drafted tokens the target accepted


class AdaptiveK(ProposerWrapper):
    """Base controller: chooses ``k`` after every step; everything else is the wrapped proposer's
    (:class:`ProposerWrapper` forwards it). ``k`` is the wrapped proposer's own k, so the k chosen
    here is the one it drafts with, even through another wrapper. Subclasses implement
    :meth:`update` (and :meth:`reset` for their state).

    k_init: the first step's k (default: the wrapped proposer's k); k_min / k_max bound every
    choice (k_max None = no upper bound). carry_over: keep the learned k and statistics from one
    request to the next (like transformers' "heuristic") instead of starting afresh
    ("heuristic_transient"). ``history`` lists a :class:`StepRecord` per step of the last
    request; ``k_trace`` the k of every step.
    """

    def __init__(self, proposer: Proposer, k_init: int | None = None, k_min: int = 1, k_max: int | None = None,
                 carry_over: bool = False):
        super().__init__(proposer)  # checks the type
        if not isinstance(k_min, int) or k_min < 1:
            raise ValueError(f"k_min must be an int >= 1, got {k_min!r}")
        if k_max is not None and (not isinstance(k_max, int) or k_max < k_min):
            raise ValueError(f"k_max must be None or an int >= k_min={k_min}, got {k_max!r}")
        k0 = check_k(proposer.k if k_init is None else k_init)
        self.k_min, self.k_max = k_min, k_max
        self.k_init = self._clip(k0)
        self.k = self.k_init
        self.carry_over = carry_over
        self.name = f"{type(self).__name__}({proposer.name})"
        self.history: list = []
        self._started = False

    # -- the policy (subclasses) ------------------------------------------------------------
    def reset(self) -> None:
        """Forget per-request statistics (called by ``begin`` unless carry_over)."""

    def update(self, drafted: int, accepted: int) -> int:
        """Return the next k after a step that drafted ``drafted`` (> 0) tokens and accepted
        ``accepted``. The base class keeps k."""
        return self.k

    # -- plumbing ---------------------------------------------------------------------------
    def _clip(self, k) -> int:
        k = max(self.k_min, int(k))
        return k if self.k_max is None else min(self.k_max, k)

    def observe(self, drafted: int, accepted: int) -> None:
        """Record one step and move k (used by ``on_verified`` and by ``measure.replay.replay``)."""
        if not 0 <= accepted <= drafted:
            raise ValueError(f"need 0 <= accepted <= drafted, got accepted={accepted}, drafted={drafted}")
        self.history.append(StepRecord(self.k, int(drafted), int(accepted)))
        if drafted > 0:  # an empty draft (n-gram found no match) says nothing about acceptance
            self.k = self._clip(self.update(int(drafted), int(accepted)))

    def start_request(self) -> None:
        self.history = []
        if not (self.carry_over and self._started):
            self.k = self.k_init
            self.reset()
        self._started = True

    def begin(self, state: DecodeState) -> None:
        self.start_request()
        super().begin(state)

    def propose(self, state: DecodeState) -> Draft:
        draft = super().propose(state)
        if isinstance(draft, Draft) and draft.is_tree:
            # k here is a chain length learned from "all accepted or not"; a tree has a node budget
            # and is never accepted whole, so the controller would only ever shrink it.
            raise ValueError(f"{type(self).__name__} adapts the length of chain drafts; {self.proposer!r} "
                             "drafts trees (choose the tree's node budget instead, e.g. k= of load_proposer)")
        return draft

    def on_verified(self, state: DecodeState, outcome: StepOutcome) -> None:
        super().on_verified(state, outcome)
        self.observe(len(outcome.draft), outcome.num_accepted)

    @property
    def k_trace(self) -> list:
        return [r.k for r in self.history]

    @property
    def mean_k(self) -> float:
        """Mean k asked for over steps that drafted something."""
        ks = [r.k for r in self.history if r.drafted > 0]
        return float(np.mean(ks)) if ks else float("nan")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.proposer!r}, k={self.k})"


class FixedK(AdaptiveK):
    """k never changes: plain speculative decoding with per-step records (draft lengths included,
    which SpecStats does not keep)."""

    def __init__(self, proposer: Proposer, k: int | None = None):
        super().__init__(proposer, k_init=k)


class HeuristicK(AdaptiveK):
    """transformers' "heuristic" draft-length schedule: all drafted tokens accepted -> k + step_up,
    otherwise k - step_down, floored at k_min (1). Defaults +2 / -1, as in transformers.

    Differences from transformers, all deliberate: a step whose draft was empty (the n-gram
    proposer found no match) leaves k alone, since "all of zero drafts accepted" is no evidence;
    k_max can cap the growth (transformers has no cap; None here too); carry_over=False by
    default, i.e. "heuristic_transient". transformers starts from num_assistant_tokens (20 by
    default in 5.x); here k_init, default the wrapped proposer's k.
    """

    def __init__(self, proposer: Proposer, k_init: int | None = None, step_up: int = 2, step_down: int = 1,
                 k_min: int = 1, k_max: int | None = None, carry_over: bool = False):
        super().__init__(proposer, k_init=k_init, k_min=k_min, k_max=k_max, carry_over=carry_over)
        if step_up < 0 or step_down < 0:
            raise ValueError("step_up and step_down must be >= 0")
        self.step_up, self.step_down = int(step_up), int(step_down)

    def update(self, drafted: int, accepted: int) -> int:
        return self.k + self.step_up if accepted == drafted else self.k - self.step_down


class GoodputK(AdaptiveK):
    """Pick, before every step, the k with the highest expected tokens per unit time.

    Model. Step cost (units of one plain step T(1)): C(k) = c_step + k*c + V(k), with
    V(k) = T(k+1)/T(1) from the measured cost curve (``verify_cost``: a bench.measure_cost_curve
    dict, made non-decreasing first so the controller does not chase timing noise; or a function
    k -> V(k); or a constant). Expected tokens: E(k) = 1 + sum_j prod_{i<=j} a_i
    with conditional per-position rates a_i. Next k = argmax_{k_min..k_max} E(k) / C(k)
    (ties to the smaller k).

    Estimator (per request). Every step that drafted n tokens and accepted m tested positions
    1..min(m+1, n): a success at 1..m, a failure at m+1 (if m < n); later positions were never
    tested and carry no information (the data are censored). For each position we keep decayed
    counts (tested, accepted): whenever a position is tested again its old counts are first
    multiplied by 2^(-1/halflife), so each rate follows its own last few observations (about
    1/(1 - 2^(-1/halflife)) of them) and tracks a request that moves between copyable and novel
    text, while a position not tested lately keeps its last estimate. Rates are shrunk towards a
    prior and, position by position, towards the previous position's estimate:
        a_1 = (acc_1 + s * prior_alpha) / (tested_1 + s),
        a_i = (acc_i + s * a_(i-1)) / (tested_i + s),
    with s = prior_strength: a position never tested inherits the rate of the one before it,
    which lets the controller consider drafting further than it ever has.

    The decision uses only the outcomes of earlier steps, so losslessness is untouched.
    """

    def __init__(self, proposer: Proposer, verify_cost=1.0, c: float = 0.0, c_step: float = 0.0,
                 k_init: int | None = None, k_min: int = 1, k_max: int = 16, prior_alpha: float = 0.5,
                 prior_strength: float = 1.0, halflife: float = 4.0, carry_over: bool = False):
        if not isinstance(k_max, int) or k_max < 1:
            raise ValueError(f"GoodputK needs an int k_max >= 1, got {k_max!r}")
        if c < 0 or c_step < 0:
            raise ValueError("draft costs c and c_step must be >= 0")
        if not 0.0 <= prior_alpha <= 1.0:
            raise ValueError("prior_alpha must lie in [0, 1]")
        if prior_strength <= 0 or halflife <= 0:
            raise ValueError("prior_strength and halflife must be > 0")
        self.verify_cost = _as_verify_cost(verify_cost)
        self.c, self.c_step = float(c), float(c_step)
        self.prior_alpha, self.prior_strength = float(prior_alpha), float(prior_strength)
        self.halflife = float(halflife)
        self._decay = 0.5 ** (1.0 / self.halflife)
        ks = np.arange(1, k_max + 1)
        self._cost = np.array([self.c_step + k * self.c + float(self.verify_cost(int(k))) for k in ks])
        if np.any(self._cost <= 0):
            raise ValueError("step costs must be > 0")
        self._tested = np.zeros(k_max)
        self._accepted = np.zeros(k_max)
        k_min_ = max(1, k_min)
        tmp_k = k_init if k_init is not None else max(k_min_, min(k_max, proposer.k))
        super().__init__(proposer, k_init=tmp_k, k_min=k_min, k_max=k_max, carry_over=carry_over)
        if k_init is None:  # start from the prior's best k
            self.k_init = self._clip(self._best_k())
            self.k = self.k_init

    def reset(self) -> None:
        self._tested[:] = 0.0
        self._accepted[:] = 0.0

    def rates(self) -> np.ndarray:
        """Current conditional acceptance estimates a_1..a_kmax."""
        out = np.empty_like(self._tested)
        prev = self.prior_alpha
        s = self.prior_strength
        for i in range(out.size):
            prev = (self._accepted[i] + s * prev) / (self._tested[i] + s)
            out[i] = prev
        return out

    def expected_goodput(self) -> np.ndarray:
        """E(k) / C(k) for k = 1..k_max under the current estimates (tokens per T(1))."""
        e = 1.0 + np.cumsum(np.cumprod(self.rates()))
        return e / self._cost

    def _best_k(self) -> int:
        g = self.expected_goodput()
        lo = self.k_min - 1
        return int(lo + np.argmax(g[lo:]) + 1)

    def update(self, drafted: int, accepted: int) -> int:
        tested = min(accepted + 1, drafted, self._tested.size)
        # Forget per position, on each new observation of that position: an untested position
        # keeps what was last learnt about it instead of drifting back to the prior.
        self._tested[:tested] *= self._decay
        self._accepted[:tested] *= self._decay
        self._tested[:tested] += 1.0
        self._accepted[:min(accepted, self._accepted.size)] += 1.0
        return self._best_k()


__all__ = ["StepRecord", "AdaptiveK", "FixedK", "HeuristicK", "GoodputK"]
