"""Sentences rendered from measured values, so a notebook's words cannot drift from its numbers.

A notebook that types "n-gram is 1.43x faster" into a markdown cell is true for one run only: the
next re-execution prints other timings under the same sentence. Here the sentence is built by the
cell that measured the values and shown as Markdown output:

    say(f"Over {n} prompts n-gram decoding is {cmp.phrase()} than plain decoding: {cmp}.")

Qualitative words about noisy timings ("faster", "level within noise", "slower") are chosen from
the data. :func:`compare_paired` compares two methods measured on the same prompts: the ratio of
their geometric means with a bootstrap interval over prompts, and the word follows the interval,
not the point estimate. :func:`close_to` compares a measurement with a prediction within a stated
tolerance. :func:`machine_line` says which CPU and dtype produced a figure, because figures that
depend on the hardware must say so.

Deterministic facts (fp32 token equality, identical counters) are not rendered but asserted in the
notebook, so that the test run fails when they stop holding.
"""
from __future__ import annotations

import math
import platform
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

__all__ = ["say", "num", "pct", "times", "ms", "Comparison", "MIN_PAIRS", "compare_paired", "interval_bounds", "close_to",
           "best_of", "machine_line", "cpu_has_native_bf16", "cpu_name", "join_words", "plural"]


def say(text: str):
    """Show ``text`` as Markdown output (plain print outside IPython) and return it.

    Build ``text`` with an f-string from the values the cell computed; never type a measured
    number into it."""
    text = str(text)
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display

        if get_ipython() is not None:
            display(Markdown(text))
            return None
    except ImportError:  # pragma: no cover - IPython ships with the course's environment
        pass
    print(text)
    return text


def _check_finite(x, what: str) -> float:
    x = float(x)
    if math.isnan(x):
        raise ValueError(f"{what}: got NaN, which no sentence can state; check the measurement")
    return x


def num(x, digits: int = 2) -> str:
    """A number for prose: thousands separated, ``digits`` decimals (integers keep none)."""
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return f"{int(x):,}"
    x = _check_finite(x, "num")
    if math.isinf(x):
        return "∞" if x > 0 else "−∞"
    return f"{x:,.{digits}f}"


def pct(fraction, digits: int = 0) -> str:
    """A fraction as a percentage: ``pct(0.431) == '43 %'``."""
    return f"{_check_finite(fraction, 'pct') * 100:.{digits}f} %"


def times(ratio, digits: int = 2) -> str:
    """A ratio as a factor: ``times(1.4321) == '1.43×'``."""
    return f"{_check_finite(ratio, 'times'):.{digits}f}×"


def ms(seconds, digits: int = 1) -> str:
    """Seconds as milliseconds: ``ms(0.0374) == '37.4 ms'``."""
    return f"{_check_finite(seconds, 'ms') * 1e3:.{digits}f} ms"


def plural(n: int, word: str, plural_word: str | None = None) -> str:
    """``plural(1, 'prompt') == '1 prompt'``, ``plural(3, 'prompt') == '3 prompts'``."""
    return f"{num(int(n))} {word if int(n) == 1 else (plural_word or word + 's')}"


def join_words(items: Iterable[str], conjunction: str = "and") -> str:
    """``['a', 'b', 'c'] -> 'a, b and c'``."""
    items = [str(i) for i in items]
    if not items:
        return ""
    if len(items) == 1:
        return items[0]
    return f"{', '.join(items[:-1])} {conjunction} {items[-1]}"


MIN_PAIRS = 3  # the fewest prompts on which a paired comparison may call a difference


@dataclass(frozen=True)
class Comparison:
    """A paired comparison of A against B over the same prompts.

    ``ratio`` is the geometric mean of the per-prompt ratios A/B (oriented so that > 1 means A is
    better when ``higher_is_better``), ``lo``/``hi`` a bootstrap interval of it, ``n`` the number of
    pairs. ``verdict`` (:func:`verdict_of`) follows the interval: ``"better"`` when it lies wholly
    above 1, ``"worse"`` wholly below, ``"level"`` when it contains 1, and also ``"level"`` when it
    excludes 1 but lies wholly within the practical-equivalence band ``1 ± tolerance`` (then
    ``within_band`` is True and :meth:`phrase` names the band, so that a sentence never calls an
    interval that excludes 1 "level" without saying why).
    """

    ratio: float
    lo: float
    hi: float
    n: int
    confidence: float
    tolerance: float
    verdict: str
    unit: str = "prompt"  # what was paired (a prompt, a verification call, a request)

    @property
    def within_band(self) -> bool:
        """Level only by the band: the interval excludes 1 but lies within 1 ± tolerance."""
        return self.verdict == "level" and self.n >= MIN_PAIRS and (self.lo > 1 or self.hi < 1)

    def phrase(self, better: str = "faster", worse: str = "slower",
               level: str = "level with it within noise") -> str:
        """The word the data supports: ``better``, ``worse`` or ``level``. A level verdict that rests
        on the band says so: "within noise" becomes "within ±2 %" (or the band is appended). With
        fewer than ``MIN_PAIRS`` pairs there is no interval and so no verdict, and the phrase says
        that instead of "within noise" (there is no noise estimate to be within)."""
        if self.n < MIN_PAIRS:  # no interval: not "level", which would claim a noise estimate
            none = f"({plural(self.n, self.unit)}: no interval)"
            for old, new in (("level within noise with", "not told apart from"), ("level within noise", "not told apart"),
                             ("level with", "not told apart from"), ("level", "not told apart")):
                if level.startswith(old):
                    return f"{new}{level[len(old):].replace(' within noise', '')} {none}"
            return f"{level.replace(' within noise', '')} {none}"
        if self.within_band:
            band = f"within ±{pct(self.tolerance)}"
            return level.replace("within noise", band) if "within noise" in level else f"{level} ({band})"
        return {"better": better, "worse": worse, "level": level}[self.verdict]

    @property
    def interval(self) -> str:
        if self.n < MIN_PAIRS:
            return f"{plural(self.n, 'pair')}: too few for an interval"
        return f"{self.confidence:.0%} interval {interval_bounds(self.lo, self.hi)}×"

    def __str__(self) -> str:
        if self.n < MIN_PAIRS:
            return f"{self.ratio:.2f}× ({plural(self.n, self.unit)}, too few for an interval)"
        return f"{self.ratio:.2f}× ({self.interval}, {plural(self.n, self.unit)})"


def interval_bounds(lo: float, hi: float) -> str:
    """"lo–hi" of a ratio's interval. A bound that rounds to 1 gets more decimals (up to four), so a
    printed "1.00" never hides on which side of 1 the bound lies: 0.9996 prints as "0.9996", not
    "1.000", beside a verdict that says the interval lies below 1."""
    digits = 2
    while digits < 4 and any(round(x, digits) == 1.0 and x != 1.0 for x in (lo, hi)):
        digits += 1
    return f"{lo:.{digits}f}–{hi:.{digits}f}"


def compare_paired(a: Sequence[float], b: Sequence[float], higher_is_better: bool = True,
                   confidence: float = 0.95, tolerance: float = 0.02, n_boot: int = 4000,
                   seed: int = 0, unit: str = "prompt") -> Comparison:
    """Compare method A with method B measured on the same prompts (``a[i]`` and ``b[i]`` pair up;
    ``unit`` names what pairs up when it is not a prompt, e.g. "verification call").

    ``a``, ``b``: positive per-prompt values, e.g. tokens/s (``higher_is_better=True``) or seconds
    (``False``). The ratio is the geometric mean of a[i]/b[i] (inverted for times, so > 1 always
    means A is better); its interval is a percentile bootstrap over prompts. Fewer than
    ``MIN_PAIRS`` pairs always read "level": one pair has no interval, and a bootstrap over two
    pairs only spans their two ratios (two prompts that happen to agree give a zero-width
    "interval" that says nothing about run-to-run noise).
    """
    a = np.asarray(a, dtype=float).reshape(-1)
    b = np.asarray(b, dtype=float).reshape(-1)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"compare_paired needs the same non-zero number of values for A and B, got {a.size} and {b.size}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b)) and np.all(a > 0) and np.all(b > 0)):
        raise ValueError("compare_paired needs finite positive values (tokens/s or seconds)")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    logr = np.log(a) - np.log(b)
    if not higher_is_better:
        logr = -logr
    ratio = float(np.exp(logr.mean()))
    if a.size < MIN_PAIRS:  # lo / hi: the range of the pairs' ratios, not an interval
        return Comparison(ratio, float(np.exp(logr.min())), float(np.exp(logr.max())), int(a.size), confidence,
                          tolerance, "level", unit)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a.size, size=(n_boot, a.size))
    boots = np.exp(logr[idx].mean(axis=1))
    tail = (1 - confidence) / 2
    lo, hi = (float(v) for v in np.quantile(boots, [tail, 1 - tail]))
    return Comparison(ratio, lo, hi, int(a.size), confidence, tolerance, verdict_of(lo, hi, tolerance), unit)


def verdict_of(lo: float, hi: float, tolerance: float = 0.0) -> str:
    """The verdict an interval [lo, hi] of a ratio supports: "better" when it lies wholly above 1,
    "worse" wholly below, else "level"; an interval that excludes 1 but lies wholly within the band
    1 ± ``tolerance`` is "level" too (a difference too small to matter, which the sentence states)."""
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must lie in [0, 1), got {tolerance}")
    if lo > 1:
        return "level" if hi <= 1 + tolerance else "better"
    if hi < 1:
        return "level" if lo >= 1 - tolerance else "worse"
    return "level"


def interval_agreement(a: tuple, b: tuple, min_units: int = 10, names=("this run's", "the table's")) -> str:
    """Whether two speedups, each ``(ratio, lo, hi, units)`` (lo and hi NaN when there is no
    interval), agree, in words for a sentence "A and B ...". Intervals that overlap agree. Where
    they do not, a side with fewer than ``min_units`` prompts gets no firm "disagree": a percentile
    bootstrap over a handful of prompts covers well under its nominal 95 %, so the words give only
    the direction."""
    (ra, la, ha, na), (rb, lb, hb, nb) = a, b
    has_a, has_b = math.isfinite(la) and math.isfinite(ha), math.isfinite(lb) and math.isfinite(hb)
    side = "above" if ra > rb else "below"
    if has_a and has_b:
        if la <= hb and lb <= ha:
            return "agree within their intervals"
        if min(na, nb) < min_units:
            return (f"have intervals that do not overlap, {names[0]} figure {side} {names[1]}; with "
                    f"{min(int(na), int(nb))} prompts on one side those intervals cover well under 95 %, so read "
                    "only the direction")
        return f"disagree: their intervals do not overlap, and {names[0]} figure lies {side} {names[1]}"
    if has_a or has_b:
        (point, (lo, hi)) = (rb, (la, ha)) if has_a else (ra, (lb, hb))
        inside = lo <= point <= hi
        return ("agree: the figure without an interval lies inside the other's interval" if inside else
                "disagree: the figure without an interval lies outside the other's interval")
    return "cannot be held against each other: neither has an interval"


def close_to(measured: float, predicted: float, tolerance: float = 0.10, close: str = "close to",
             above: str = "above", below: str = "below") -> str:
    """How a measurement stands against a prediction: ``close`` when within ``tolerance``
    (relative), else ``above`` or ``below``."""
    measured = _check_finite(measured, "close_to: measured")
    predicted = _check_finite(predicted, "close_to: predicted")
    if predicted == 0:
        raise ValueError("close_to: the prediction is 0, so a relative tolerance means nothing")
    r = measured / predicted
    if abs(r - 1) <= tolerance:
        return close
    return above if r > 1 else below


def best_of(per_method: Mapping[str, Sequence[float]], higher_is_better: bool = True,
            confidence: float = 0.95, tolerance: float = 0.02, seed: int = 0):
    """The best method by geometric mean, and which others the data cannot separate from it.

    ``per_method``: name -> per-prompt values, all over the same prompts. Returns ``(best, tied)``:
    ``tied`` lists the methods whose paired comparison with the best is "level" (in order of their
    geometric mean). Use it to say "the fastest is X" only when ``tied`` is empty.
    """
    if not per_method:
        raise ValueError("best_of needs at least one method")
    names = list(per_method)
    logs = {n: float(np.mean(np.log(np.asarray(per_method[n], dtype=float)))) for n in names}
    order = sorted(names, key=lambda n: logs[n], reverse=higher_is_better)
    best = order[0]
    tied = [n for n in order[1:]
            if compare_paired(per_method[best], per_method[n], higher_is_better, confidence, tolerance,
                              seed=seed).verdict == "level"]
    return best, tied


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), or the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_has_native_bf16() -> bool:
    """True when the CPU computes bf16 natively (x86 ``avx512_bf16`` or ``amx_bf16``; Arm ``bf16``)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set()
            for line in f:
                if line.lower().startswith(("flags", "features")):
                    flags.update(line.split(":", 1)[1].split())
        return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})
    except OSError:
        return False


def machine_line(model=None) -> str:
    """One sentence naming what produced the timings below: CPU (or GPU), threads, dtype, whether
    bf16 is native and the model's backend (backend.py), since every cost ratio in the course
    depends on them."""
    import torch

    device = dtype = None
    if model is not None:
        p = next(model.parameters())
        device, dtype = p.device, p.dtype
    if device is not None and device.type == "cuda":
        where = f"{torch.cuda.get_device_name(device)} (CUDA)"
    else:
        native = "with native bf16" if cpu_has_native_bf16() else "without native bf16 (bf16 is emulated)"
        where = f"{cpu_name()}, {plural(torch.get_num_threads(), 'CPU thread')}, {native}"
    dt = f", model in {str(dtype).replace('torch.', '')}" if dtype is not None else ""
    if model is not None:
        from ...backend import backend_of

        dt += f", {backend_of(model)} backend"
    return f"Timings on this machine: {where}{dt}."

