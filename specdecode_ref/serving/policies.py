"""When to speculate in a serving engine: always, never, or K chosen per step from the load.

Speculation buys tokens per target forward (tau) but makes each forward score k+1 tokens per
request. With one request the forward is memory-bound and the extra tokens are almost free; with
a full batch the forward is compute-bound and scoring k rejected drafts per request costs real
time. So the best K falls as the batch grows, faster when acceptance is low. A policy answers one
question per step, :meth:`SpeculationPolicy.choose_k` (batch size -> K), and learns acceptance
from every verified draft through :meth:`SpeculationPolicy.observe`.

:class:`AdaptivePolicy` starts from the cost model's throughput,
``E[tokens | alpha, K] * T(B, 1) / (T(B, K+1) + K c)`` (``analysis.expected_tokens_per_step``;
the same rule as ``measure.batch_bench.choose_k_per_batch``, which reads T from a measured
surface); K = 0 (plain decoding) wins ties, so it speculates only where the model says it pays.
A forward-time model leaves out what a serving step also pays per request and per drafted token
(drafting, verification, rollback, bookkeeping), so where the model says "speculate", the policy
then measures: the scheduler reports every step's wall time and emitted tokens
(:meth:`SpeculationPolicy.observe_step`), and the policy keeps the *goodput* (tokens per second)
of the model's K, of the largest K and of K = 0 per batch-size bucket, and takes the best measured.

Counterparts: vLLM's v1 engine speculates with a fixed ``num_speculative_tokens`` whatever the
load (its earlier engine had ``speculative_disable_by_batch_size``, a batch-size threshold above
which drafting stops: a one-step version of this policy); dynamic speculation length by load is studied in "Optimizing Speculative Decoding for
Serving Large Language Models Using Goodput" (Liu et al., 2024, SmartSpec).
"""
from __future__ import annotations

from typing import Callable

from ..analysis import expected_tokens_per_step


class SpeculationPolicy:
    """Chooses the draft length K of one scheduler step (0 = plain decoding)."""

    name = "policy"

    def __init__(self, k: int):
        if not isinstance(k, int) or k < 0:
            raise ValueError(f"k must be an int >= 0, got {k!r}")
        self.k = k

    def choose_k(self, batch_size: int) -> int:
        raise NotImplementedError

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        """One request's verified draft of this step (the default ignores it)."""

    def observe_step(self, batch_size: int, k: int, num_tokens: int, seconds: float) -> None:
        """One decode step: ``batch_size`` requests decoded with this K and emitted ``num_tokens``
        tokens in all, in ``seconds`` of wall time (drafting included; the default ignores it)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(k={self.k})"


class AlwaysOn(SpeculationPolicy):
    """Draft k tokens every step (what vLLM does with ``num_speculative_tokens=k``)."""

    name = "on"

    def choose_k(self, batch_size: int) -> int:
        return self.k


class AlwaysOff(SpeculationPolicy):
    """Never draft: plain continuous batching."""

    name = "off"

    def __init__(self, k: int = 0):
        super().__init__(k)

    def choose_k(self, batch_size: int) -> int:
        return 0


def roofline_cost(knee_tokens: float = 16.0) -> Callable[[int, int], float]:
    """T(B, n) in units of T(1, 1) for a forward over B requests of n tokens each: flat while the
    forward is memory-bound (reading the weights dominates), then linear in the B*n tokens once
    they pass ``knee_tokens`` (compute-bound). A GPU's knee is hundreds of tokens, a CPU's a
    handful; ``surface_cost`` uses a measured surface instead."""
    if knee_tokens <= 0:
        raise ValueError(f"knee_tokens must be > 0, got {knee_tokens!r}")
    return lambda b, n: max(1.0, b * n / knee_tokens)


def surface_cost(surface) -> Callable[[int, int], float]:
    """T(B, n) read from a measured surface (``measure.batch_bench.measure_cost_surface``: columns
    B, n, time_s): each batch size's curve is first made non-decreasing in n
    (``measure.batch_bench.non_decreasing_in_n``: scoring more tokens never does less work, so a
    dip is noise), then interpolated in n, at the nearest measured batch size."""
    import numpy as np

    from ..measure.batch_bench import non_decreasing_in_n

    curves = {int(b): (g.n.to_numpy(dtype=float), g.time_s.to_numpy())
              for b, g in non_decreasing_in_n(surface[["B", "n", "time_s"]]).groupby("B")}
    sizes = sorted(curves)

    def cost(b: int, n: float) -> float:
        ns, ts = curves[min(sizes, key=lambda s: abs(s - b))]
        return float(np.interp(n, ns, ts))

    return cost


def batch_bucket(batch_size: int) -> int:
    """The power of two at or above ``batch_size`` (1, 2, 4, 4, 8, ...): step times are pooled per
    bucket, so a batch that shrinks by one request does not start its measurements afresh."""
    return 1 << (int(batch_size) - 1).bit_length()


class AdaptivePolicy(SpeculationPolicy):
    """K per step from the batch size, the measured acceptance rate and measured step times (see the
    module docstring).

    k: the largest K. cost: T(B, n), any unit (default :func:`roofline_cost`). draft_cost: the time
    of drafting one token for one request in T(1, 1) units (0 for n-gram lookup). prior_alpha,
    prior_weight: the acceptance rate assumed before any draft is verified, worth that many drafted
    tokens. decay: each observation first multiplies the counts by it, so the estimate follows the
    recent acceptance (a window of about 1 / (1 - decay) drafted tokens). probe_every: when the
    policy has chosen K = 0 this many steps in a row, it drafts one step at K = 1 to keep measuring
    acceptance (otherwise a low estimate could never recover).
    min_gain: speculate only when the model (and then the measurement) says K beats plain decoding
    by at least this fraction. measure_steps: use the step times the scheduler reports (False: the
    cost model alone). min_samples: steps each choice is measured before the measurements decide.
    step_decay: the goodput estimates' decay per observed step (a window of about
    1 / (1 - step_decay) steps per choice). reprobe_every: how often (steps in a batch bucket) a
    measured choice not taken is taken once again, and how long a bucket borrows the nearest
    measured bucket's verdict before measuring its own (0: never). token_prior_steps: how many
    steps' worth of weight the model's expected tokens per step keep against the measured ones.
    """

    name = "adaptive"

    def __init__(self, k: int, cost: Callable[[int, int], float] | None = None, draft_cost: float = 0.0,
                 prior_alpha: float = 0.5, prior_weight: float = 8.0, decay: float = 0.99, probe_every: int = 16,
                 min_gain: float = 0.03, measure_steps: bool = True, min_samples: int = 2, step_decay: float = 0.9,
                 reprobe_every: int = 48, token_prior_steps: float = 4.0):
        super().__init__(k)
        if not 0.0 <= prior_alpha <= 1.0:
            raise ValueError(f"prior_alpha must lie in [0, 1], got {prior_alpha!r}")
        for name, value in (("decay", decay), ("step_decay", step_decay)):
            if not 0.0 < value <= 1.0:
                raise ValueError(f"{name} must lie in (0, 1], got {value!r}")
        if not isinstance(min_samples, int) or min_samples < 1:
            raise ValueError(f"min_samples must be an int >= 1, got {min_samples!r}")
        self.cost = roofline_cost() if cost is None else cost
        self.draft_cost = float(draft_cost)
        self.prior_alpha, self.prior_weight, self.decay = float(prior_alpha), float(prior_weight), float(decay)
        self.probe_every = int(probe_every)
        self.min_gain = float(min_gain)
        self.measure_steps, self.min_samples, self.step_decay = bool(measure_steps), min_samples, float(step_decay)
        self.reprobe_every = int(reprobe_every)
        self.token_prior_steps = float(token_prior_steps)
        self.token_stats: dict = {}  # K -> [decayed tokens per request, decayed steps]
        self.tested = 0.0  # draft positions tested: accepted ones, plus the first rejected one
        self.accepted = 0.0
        self.steps_off = 0
        self.step_stats: dict = {}  # (bucket, K) -> [decayed seconds, decayed steps, steps]
        self._last_taken: dict = {}  # (bucket, K) -> that bucket's step count when K was last chosen
        self._bucket_steps: dict = {}  # bucket -> steps chosen in it
        self.history: list = []  # (batch size, alpha estimate, K) per step

    @property
    def alpha(self) -> float:
        """The per-position acceptance estimate: decayed accepted / tested positions, with the prior.

        Verification stops at the first rejection, so the drafts after it are never tested: they
        say nothing about alpha. Dividing by every drafted token (vLLM's "draft acceptance rate")
        would count them as failures and bias alpha low (i.i.d. acceptance at alpha = 0.8 and K = 4
        gives accepted / drafted = 0.59). This is the i.i.d. maximum-likelihood estimate of
        ``analysis.estimate_alpha``, with decay and a prior."""
        return (self.accepted + self.prior_alpha * self.prior_weight) / (self.tested + self.prior_weight)

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        if num_drafted <= 0:
            return
        if not 0 <= num_accepted <= num_drafted:
            raise ValueError(f"accepted {num_accepted} of {num_drafted} drafted tokens")
        tested = num_accepted + (1 if num_accepted < num_drafted else 0)
        self.tested = self.tested * self.decay + tested
        self.accepted = self.accepted * self.decay + num_accepted

    def predicted_speedup(self, batch_size: int, k: int) -> float:
        """Throughput with K = k over plain decoding at this batch size, by the cost model."""
        t1 = self.cost(batch_size, 1)
        return float(expected_tokens_per_step(self.alpha, k)) * t1 / (self.cost(batch_size, k + 1) + k * self.draft_cost)

    def best_k(self, batch_size: int) -> int:
        best_k, best = 0, 1.0 + self.min_gain
        for kk in range(1, self.k + 1):
            s = self.predicted_speedup(batch_size, kk)
            if s > best + 1e-12:  # ties keep the smaller K (0 = plain decoding)
                best_k, best = kk, s
        return best_k

    def observe_step(self, batch_size: int, k: int, num_tokens: int, seconds: float) -> None:
        if batch_size < 1 or seconds <= 0 or not self.measure_steps:
            return
        # Step time per (bucket, K); tokens per request per K, pooled over buckets (tokens per step
        # vary far more than step times: a few steps alone would decide by luck).
        s = self.step_stats.setdefault((batch_bucket(batch_size), int(k)), [0.0, 0.0, 0])
        s[0] = s[0] * self.step_decay + float(seconds)
        s[1] = s[1] * self.step_decay + 1.0
        s[2] += 1
        t = self.token_stats.setdefault(int(k), [0.0, 0.0])
        t[0] = t[0] * self.step_decay + num_tokens / batch_size
        t[1] = t[1] * self.step_decay + 1.0

    def tokens_per_step(self, k: int) -> float:
        """Tokens each request emits per step with this K: measured, shrunk towards the model's
        E[tokens | alpha, K] with the weight of ``token_prior_steps`` steps."""
        if k == 0:
            return 1.0
        t = self.token_stats.get(int(k), [0.0, 0.0])
        prior = float(expected_tokens_per_step(self.alpha, k))
        return (t[0] + self.token_prior_steps * prior) / (t[1] + self.token_prior_steps)

    def measured_goodput(self, batch_size: int, k: int) -> float | None:
        """Tokens per request per second with this K in this batch size's bucket: tokens per step
        over the measured step time (None before ``min_samples`` steps)."""
        return self._goodput_in(batch_bucket(batch_size), k)

    def _goodput_in(self, bucket: int, k: int) -> float | None:
        s = self.step_stats.get((bucket, int(k)))
        return None if s is None or s[2] < self.min_samples else self.tokens_per_step(k) * s[1] / s[0]

    def _nearest_measured(self, bucket: int, arms: list) -> int | None:
        """The bucket nearest to this one (by factors of two) where K = 0 and some of the other
        choices have been measured, or None."""
        import math

        done = {b for b, _ in self.step_stats
                if self._goodput_in(b, 0) is not None and any(self._goodput_in(b, a) is not None for a in arms if a)}
        if not done:
            return None
        return min(done, key=lambda b: (abs(math.log2(b) - math.log2(bucket)), b))

    def _choose_measured(self, batch_size: int, k_model: int) -> int:
        """Among the model's K, the largest K and K = 0, by measured goodput. A bucket is measured
        (each choice ``min_samples`` steps) when no other has been yet, or after it has borrowed
        the nearest measured bucket's verdict for ``reprobe_every`` steps; a measured bucket takes
        each choice again once every ``reprobe_every`` steps, so its estimates stay current."""
        bucket = batch_bucket(batch_size)
        arms = list(dict.fromkeys([k_model, self.k, 0]))
        n = self._bucket_steps.get(bucket, 0)
        source = self._nearest_measured(bucket, arms)
        if source is None or (source != bucket and n >= self.reprobe_every > 0) or (
                source == bucket and any(self._goodput_in(bucket, a) is None for a in arms)):
            for a in arms:
                if self._goodput_in(bucket, a) is None:
                    return a
            source = bucket
        if source == bucket and self.reprobe_every > 0:
            for a in arms:
                if n - self._last_taken.get((bucket, a), n) >= self.reprobe_every:
                    return a
        g = {a: self._goodput_in(source, a) for a in arms}
        measured = [a for a in arms if a > 0 and g[a] is not None]
        best = max(measured, key=lambda a: g[a])
        return best if g[best] >= g[0] * (1.0 + self.min_gain) else 0

    def choose_k(self, batch_size: int) -> int:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        k = self.best_k(batch_size)
        if k > 0 and self.measure_steps and self.step_stats:
            k = self._choose_measured(batch_size, k)
        if k == 0:
            self.steps_off += 1
            if self.probe_every > 0 and self.steps_off >= self.probe_every and self.k > 0:
                self.steps_off, k = 0, 1
        else:
            self.steps_off = 0
        bucket = batch_bucket(batch_size)
        self._bucket_steps[bucket] = self._bucket_steps.get(bucket, 0) + 1
        self._last_taken[(bucket, k)] = self._bucket_steps[bucket]
        self.history.append((batch_size, self.alpha, k))
        return k

    def __repr__(self) -> str:
        return f"AdaptivePolicy(k={self.k}, alpha={self.alpha:.3f})"


def make_policy(name: str, k: int, **kwargs) -> SpeculationPolicy:
    """"on", "off" or "adaptive" (kwargs go to :class:`AdaptivePolicy`)."""
    if name == "on":
        return AlwaysOn(k)
    if name == "off":
        return AlwaysOff()
    if name == "adaptive":
        return AdaptivePolicy(k, **kwargs)
    raise ValueError(f"policy must be 'on', 'off' or 'adaptive', got {name!r}")


POLICIES = ("off", "on", "adaptive")
