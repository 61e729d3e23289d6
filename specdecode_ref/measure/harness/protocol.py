"""The one timing protocol behind every stored table and every timed comparison of methods.

A speedup is a ratio of two wall times taken on a shared machine, so how the times are taken
decides whether the ratio means anything. Every runner that times methods against each other
(``bench.run_benchmark``, ``compare.run_interleaved``) follows these rules:

1. **Interleaved.** Every method runs on a prompt before the next prompt starts, so a slow minute
   of the machine hits every method alike and each speedup is paired by prompt.
2. **Rounds.** At least ``ROUNDS`` (2) timed rounds per prompt; every other round runs the methods
   in reverse order, so no method always runs first (on a cold cache) or after the same neighbour.
3. **Spikes.** When a method's rounds on a prompt differ by more than ``SPIKE_FACTOR`` (the slowest
   over the fastest), one more round of that method is taken, up to ``MAX_ROUNDS``. The run kept is
   the one with the median time (the lower middle for an even count), so a single spike is never
   the figure, and two rounds that agree keep the faster.
   **Outliers.** Two rounds can both be slow (a minute of other work spans them). So when a method's
   kept time on a prompt lies more than ``OUTLIER_FACTOR`` above the median of all the methods' kept
   times there, that method gets more rounds too, up to ``MAX_ROUNDS``. A method that really is that
   slow keeps its time: the extra rounds only confirm it.
4. **Quietness.** The machine's load just before the run is recorded with the table
   (``timing.sample_load``); a busy machine is named, not hidden.
5. **T(1).** Every table records the one-token forward of its own run (plain decoding's decode time
   per step). Two tables are compared only when their T(1) agree within ``COMPARABLE_T1``; otherwise
   :func:`require_comparable` refuses, since a ratio across them would mix two machines' speeds.
"""
from __future__ import annotations

import statistics
import time
from typing import Sequence

ROUNDS = 2
MAX_ROUNDS = 4
SPIKE_FACTOR = 1.25
OUTLIER_FACTOR = 1.5
COMPARABLE_T1 = 0.10


def check_rounds(rounds) -> int:
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
    return rounds


def order_of(methods: Sequence, round_index: int) -> list:
    """The order methods run in on round ``round_index``: as given, reversed on odd rounds."""
    methods = list(methods)
    return methods if round_index % 2 == 0 else methods[::-1]


def spiked(seconds: Sequence[float]) -> bool:
    """Whether a method's rounds on one prompt disagree by more than ``SPIKE_FACTOR``."""
    return len(seconds) >= 2 and max(seconds) > SPIKE_FACTOR * min(seconds)


def wants_another_round(seconds: Sequence[float]) -> bool:
    """Rule 3: re-time while the rounds disagree, up to ``MAX_ROUNDS``."""
    return spiked(seconds) and len(seconds) < MAX_ROUNDS


def outliers(kept: dict) -> list:
    """Rule 3, outliers: the methods whose kept time on a prompt lies more than ``OUTLIER_FACTOR``
    above the median of every method's kept time there. With fewer than three methods the median
    cannot tell a spike from a real difference, so nothing is flagged."""
    if len(kept) < 3:
        return []
    median = statistics.median(kept.values())
    return [m for m, s in kept.items() if s > OUTLIER_FACTOR * median]


def kept_index(seconds: Sequence[float]) -> int:
    """Which round is kept: the one with the median time (the lower middle for an even count)."""
    median = statistics.median_low(seconds)
    return list(seconds).index(median)


def describe(rounds: int = ROUNDS) -> str:
    """The protocol in one line, stored with every table."""
    return (f"methods interleaved per prompt; {rounds} rounds, every other in reverse order; a method whose rounds "
            f"on a prompt differ by more than {SPIKE_FACTOR:g}x, or whose kept run lies more than {OUTLIER_FACTOR:g}x "
            f"above the prompt's median over methods, is re-timed (up to {MAX_ROUNDS} rounds); the run with the median "
            "time is kept (the lower middle of an even count)")


def record(load, t1_s: float, rounds: int = ROUNDS) -> dict:
    """The protocol section of a stored table: the rules, the machine's load before the run (a
    ``timing.MachineLoad``) and the run's T(1) in seconds."""
    return {"protocol": describe(rounds), "rounds": rounds, "spike_factor": SPIKE_FACTOR,
            "outlier_factor": OUTLIER_FACTOR,
            "load_before": load.describe(), "busy_before": bool(load.busy), "t1_s": float(t1_s),
            "date": time.strftime("%Y-%m-%d")}


def untimed(what: str) -> dict:
    """The protocol section of a stored table that holds no timings to compare (counts, outputs),
    saying what it holds instead, so that every table states how it was taken."""
    return {"protocol": f"no timings compared: {what}"}


def decode_t1(plain: dict) -> float:
    """The T(1) a run measured: plain decoding's seconds per decode step from its pooled counters
    (target time with the prefill left out, over steps), the unit every cost in a table is read in."""
    return (plain["target_time_s"] - plain["prefill_time_s"]) / plain["steps"]


def t1_of(meta: dict) -> float:
    """A table's T(1): recorded by this protocol, or :func:`decode_t1` of its plain-decoding counters."""
    if "t1_s" in meta:
        return float(meta["t1_s"])
    plain = meta.get("counters", {}).get("plain")
    if plain is None:
        raise ValueError("the table records no T(1) and no plain-decoding counters to derive it from")
    return decode_t1(plain)


def comparable(a: dict, b: dict) -> tuple:
    """(whether two tables' figures may be set against each other, why): same machine line, and
    T(1) within ``COMPARABLE_T1`` of each other."""
    ma, mb = a.get("machine"), b.get("machine")
    if ma and mb and ma != mb:
        return False, f"measured on different setups ({ma!r} against {mb!r})"
    ta, tb = t1_of(a), t1_of(b)
    gap = max(ta, tb) / min(ta, tb) - 1
    if gap > COMPARABLE_T1:
        return False, (f"their one-token forwards differ by {gap:.0%} ({ta * 1e3:.1f} against {tb * 1e3:.1f} ms), "
                       f"more than {COMPARABLE_T1:.0%}: the machine ran at another speed")
    return True, f"same setup, T(1) within {gap:.0%}"


def require_comparable(a: dict, b: dict) -> None:
    """Raise ValueError when two tables' figures cannot be set against each other (:func:`comparable`)."""
    ok, why = comparable(a, b)
    if not ok:
        raise ValueError(f"the two tables cannot be compared: {why}; re-measure one of them")
