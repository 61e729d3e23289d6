"""Small timing helpers shared by the notebooks and the benchmark.

* :func:`median_time` / :func:`time_runs`: warm up, then time a call several times (CUDA is
  synchronised before each clock read, since its kernels run asynchronously) and keep the median.
* :func:`decode_seconds` / :func:`decode_rate`: the decode phase of a generation (wall time minus
  the prefill), and tokens per second over it, for one result or pooled over many. This is the
  quantity the speedup formula predicts: the prefill is the same for every method.
* :func:`measure_cost_curve`: T(n), one target forward scoring n tokens after a cached context,
  the machine's side of every speedup prediction (``sizing`` caches it per machine).
* :func:`check_quiet`: before measuring, sample how busy the CPUs are. On a shared machine other
  processes make every timing meaningless; the check prints a clearly marked notice and returns
  the figures, it never raises (tests and CI run notebooks under load on purpose).

No timing here is ever a pass/fail threshold.
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from ... import kv

BUSY_NOTICE = "NOTICE: BUSY MACHINE"  # the marker check_quiet prints (searchable in saved outputs)


def sync_device(device) -> None:
    """Wait for queued GPU work on ``device`` (None: the current CUDA device, if any) before a clock is read."""
    if device is None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        return
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_runs(fn: Callable[[], object], repeats: int = 5, warmup: int = 1, device=None) -> list:
    """Call ``fn()`` ``warmup`` times untimed, then ``repeats`` times timed; return the seconds.

    device: a torch device (or name) to synchronise around each timed call; None synchronises
    CUDA when it is in use and does nothing on a CPU-only machine.
    """
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync_device(device)
        t0 = time.perf_counter()
        fn()
        sync_device(device)
        times.append(time.perf_counter() - t0)
    return times


def median_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1, device=None) -> float:
    """Median seconds of ``repeats`` timed calls of ``fn()`` after ``warmup`` untimed ones."""
    return float(statistics.median(time_runs(fn, repeats=repeats, warmup=warmup, device=device)))


def _stats_of(item):
    return getattr(item, "stats", item)


def decode_seconds(result) -> float:
    """Seconds of the decode phase of one generation: wall time minus the prefill.

    result: a GenerationResult or its SpecStats.
    """
    s = _stats_of(result)
    return float(s.wall_time_s - s.prefill_time_s)


def decode_rate(results) -> float:
    """Tokens per second of the decode phase: emitted tokens / decode seconds.

    results: one GenerationResult or SpecStats, or an iterable of them (pooled: total tokens over
    total seconds, so long generations weigh more, as in a server). ``emitted`` counts the tokens
    of the verification steps, i.e. everything after the prefill's first token.
    """
    items = [results] if hasattr(_stats_of(results), "wall_time_s") else list(results)
    if not items:
        raise ValueError("decode_rate needs at least one result")
    tokens = sum(_stats_of(r).emitted for r in items)
    seconds = sum(decode_seconds(r) for r in items)
    return tokens / seconds if seconds > 0 else float("nan")


@dataclass
class MachineLoad:
    """What :func:`check_quiet` saw: CPU utilisation over the sample (percent of all CPUs, or None
    when it could not be measured), the 1-minute load average (or None), the CPU count, and the
    verdict."""

    cpu_percent: float | None
    load_average: float | None
    cpus: int
    busy: bool
    source: str  # "psutil" or "loadavg" or "unavailable"

    def describe(self) -> str:
        parts = []
        if self.cpu_percent is not None:
            parts.append(f"CPU use {self.cpu_percent:.0f} % of {self.cpus} CPUs over the last second")
        if self.load_average is not None and (self.busy or self.cpu_percent is None):
            parts.append(f"load average {self.load_average:.1f}")
        return ", ".join(parts) or "load not measurable here"


def sample_load(interval: float = 1.0) -> MachineLoad:
    """Measure how busy the CPUs are, without judging. Prefers psutil's utilisation over
    ``interval`` seconds (the load average lags by a minute, so it still counts a job that just
    finished, e.g. the previous notebook); falls back to the 1-minute load average."""
    cpus = os.cpu_count() or 1
    try:
        load_avg = os.getloadavg()[0]
    except (AttributeError, OSError):
        load_avg = None
    try:
        import psutil

        pct = float(psutil.cpu_percent(interval=interval))
        return MachineLoad(pct, load_avg, cpus, False, "psutil")
    except Exception:  # noqa: BLE001  (psutil missing or unusable: fall back)
        return MachineLoad(None, load_avg, cpus, False, "loadavg" if load_avg is not None else "unavailable")


def is_busy(load: MachineLoad, max_cpu_percent: float = 25.0, max_load_fraction: float = 0.75) -> bool:
    """The verdict for a sample: busy when CPU use over the sample exceeds ``max_cpu_percent``
    (psutil), or, without psutil, when the load average exceeds ``max_load_fraction`` x CPUs."""
    if load.cpu_percent is not None:
        return load.cpu_percent > max_cpu_percent
    if load.load_average is not None:
        return load.load_average > max_load_fraction * load.cpus
    return False


def check_quiet(interval: float = 1.0, max_cpu_percent: float = 25.0, max_load_fraction: float = 0.75,
                verbose: bool = True) -> MachineLoad:
    """Check that the machine is quiet before timing; print a marked notice when it is not.

    Samples CPU use for ``interval`` seconds (psutil; the 1-minute load average otherwise) and
    returns a :class:`MachineLoad` whose ``busy`` says whether other work competes for the CPUs.
    With ``verbose`` it prints one line: a confirmation when quiet, a notice starting with
    ``BUSY_NOTICE`` when busy. It never raises: timings taken on a busy machine still run, they
    are just not worth publishing.
    """
    load = sample_load(interval)
    load.busy = is_busy(load, max_cpu_percent, max_load_fraction)
    if verbose:
        if load.busy:
            print(f"{BUSY_NOTICE}: {load.describe()}. Other processes compete for the CPU, so the "
                  "timings below are noisy; rerun on a quiet machine before trusting them.")
        else:
            print(f"machine quiet enough for timing ({load.describe()})")
    return load


def busy_machine_warning(interval: float = 1.0) -> str | None:
    """A warning line when other processes already load the CPUs, else None (the benchmark CLI).

    Measured here: with another process running torch on both cores, torch's default 2 threads
    spin against it and a 48-token generation took 5 to 125 s at random; ``--threads 1`` avoids
    most of that collapse (ratios stay usable, absolute numbers do not).
    """
    load = check_quiet(interval=interval, verbose=False)
    if not load.busy:
        return None
    return (f"warning: {load.describe()} before starting: other processes compete for the CPU, "
            f"timings will be noisy (torch uses {torch.get_num_threads()} threads; "
            "--threads 1 suffers less from contention)")


def start_timed_cli(threads: int | None = None) -> None:
    """What a timing command does first: set torch's CPU threads (None: torch's choice), then say
    on stderr if other processes already load the CPUs (:func:`busy_machine_warning`)."""
    import sys

    if threads:
        torch.set_num_threads(threads)
    warning = busy_machine_warning()
    if warning:
        print(warning, file=sys.stderr)


@torch.inference_mode()
def measure_cost_curve(model, ns=range(1, 17), context_len: int = 200, repeats: int = 7, warmup: int = 2,
                       seed: int = 0) -> dict:
    """Measure T(n): seconds for one target forward scoring n new tokens after a cached context.

    Why: a decode step is memory-bound (it streams all weights for one token), so scoring n
    tokens at once costs little more than one; T(k+1)/T(1) is the verify cost in the speedup
    formula (analysis.expected_speedup). The context is ``context_len`` seeded random token ids
    prefilled into a KV cache; each timed forward feeds n more tokens (all n positions' logits, as
    in verification), then the cache is cropped back with ``kv.crop_to``. Rounds go over all n in
    turn, in a freshly shuffled (seeded) order each round, so that machine drift hits every n alike
    and no n always follows the largest one; ``warmup`` rounds are discarded; the median is kept.

    Returns plain Python values: ``{"ns": [int], "times_s": [float], "relative": [float]
    (T(n)/T(ns[0]), i.e. T(n)/T(1) with the default ns), "samples_s": [[float]] (each n's timings,
    one per round), "context_len", "repeats", "device", "dtype"}``.
    """
    ns = [int(n) for n in ns]
    if not ns or min(ns) < 1:
        raise ValueError(f"ns must be a non-empty list of ints >= 1, got {ns!r}")
    if not isinstance(repeats, int) or repeats < 1 or not isinstance(warmup, int) or warmup < 0:
        raise ValueError("repeats must be an int >= 1 and warmup an int >= 0")
    if not isinstance(context_len, int) or context_len < 1:
        raise ValueError(f"context_len must be an int >= 1, got {context_len!r}")
    window = getattr(model.config, "max_position_embeddings", None)
    if window is not None and context_len + max(ns) > window:
        raise ValueError(f"context_len + max(ns) = {context_len + max(ns)} exceeds the context window {window}")
    device = next(model.parameters()).device
    vocab = model.get_input_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(seed)
    context = torch.randint(0, vocab, (1, context_len), generator=gen).to(device)
    new = torch.randint(0, vocab, (1, max(ns)), generator=gen).to(device)
    cache = kv.new_cache(model)
    model(input_ids=context, past_key_values=cache, use_cache=True, logits_to_keep=1)
    samples = {n: [] for n in ns}
    for r in range(warmup + repeats):
        for i in torch.randperm(len(ns), generator=gen).tolist():
            n = ns[i]
            sync_device(device)
            t0 = time.perf_counter()
            model(input_ids=new[:, :n], past_key_values=cache, use_cache=True)
            sync_device(device)
            dt = time.perf_counter() - t0
            kv.crop_to(cache, context_len)
            if r >= warmup:
                samples[n].append(dt)
    times = [float(statistics.median(samples[n])) for n in ns]
    return {"ns": ns, "times_s": times, "relative": [float(t / times[0]) for t in times],
            "samples_s": [[float(t) for t in samples[n]] for n in ns],
            "context_len": int(context_len), "repeats": int(repeats), "device": str(device),
            "dtype": str(next(model.parameters()).dtype).replace("torch.", "")}
