"""Timing helpers: call counts, medians, decode rates and the quiet-machine check.

No timing thresholds: the clock is replaced where a value matters, and real timings are only
checked to be positive numbers.
"""
import statistics

import pytest

from specdecode_ref.measure.harness import bench, timing
from specdecode_ref.metrics import SpecStats


def test_time_runs_counts_warmup_and_repeats():
    calls = []
    times = timing.time_runs(lambda: calls.append(1), repeats=4, warmup=2)
    assert len(calls) == 6 and len(times) == 4 and all(t >= 0 for t in times)
    with pytest.raises(ValueError, match="repeats"):
        timing.time_runs(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="warmup"):
        timing.time_runs(lambda: None, warmup=-1)


def test_median_time_is_the_median_of_the_timed_calls(monkeypatch):
    ticks = iter([0.0, 1.0, 10.0, 13.0, 20.0, 22.0])  # timed calls of 1, 3 and 2 s
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(ticks))
    calls = []
    assert timing.median_time(lambda: calls.append(1), repeats=3, warmup=1) == 2.0
    assert len(calls) == 4  # the warm-up is not timed


def _stats(emitted, wall, prefill):
    return SpecStats(emitted=emitted, wall_time_s=wall, prefill_time_s=prefill)


def test_decode_rate_single_and_pooled():
    a, b = _stats(10, 3.0, 1.0), _stats(30, 5.0, 1.0)
    assert timing.decode_seconds(a) == 2.0
    assert timing.decode_rate(a) == 5.0
    assert timing.decode_rate([a, b]) == pytest.approx(40 / 6)  # pooled, not the mean of the rates

    class Result:  # anything with a .stats, like GenerationResult
        stats = b

    assert timing.decode_rate(Result()) == 7.5 and timing.decode_rate([Result(), a]) == pytest.approx(40 / 6)
    assert timing.decode_rate(_stats(0, 1.0, 1.0)) != timing.decode_rate(_stats(0, 1.0, 1.0))  # NaN
    with pytest.raises(ValueError):
        timing.decode_rate([])


def test_verdicts():
    quiet = timing.MachineLoad(cpu_percent=3.0, load_average=4.0, cpus=2, busy=False, source="psutil")
    busy = timing.MachineLoad(cpu_percent=90.0, load_average=0.1, cpus=2, busy=False, source="psutil")
    # CPU use over the sample wins over the lagging load average (the previous notebook just ended)
    assert not timing.is_busy(quiet) and timing.is_busy(busy)
    assert timing.is_busy(timing.MachineLoad(None, 1.8, 2, False, "loadavg"))
    assert not timing.is_busy(timing.MachineLoad(None, 0.5, 2, False, "loadavg"))
    assert not timing.is_busy(timing.MachineLoad(None, None, 2, False, "unavailable"))
    busy.busy = True
    assert "90 %" in busy.describe() and "load average" in busy.describe()
    # A quiet verdict names only the CPU sample: the lagging load average would read as a warning.
    assert "load average" not in quiet.describe() and "3 %" in quiet.describe()


def test_check_quiet_prints_a_marked_notice_and_never_raises(monkeypatch, capsys):
    monkeypatch.setattr(timing, "sample_load",
                        lambda interval: timing.MachineLoad(97.0, 2.5, 2, False, "psutil"))
    load = timing.check_quiet(interval=0.01)
    out = capsys.readouterr().out
    assert load.busy and out.startswith(timing.BUSY_NOTICE)
    assert bench.busy_machine_warning().startswith("warning:")

    monkeypatch.setattr(timing, "sample_load",
                        lambda interval: timing.MachineLoad(2.0, 0.1, 2, False, "psutil"))
    load = timing.check_quiet(interval=0.01)
    out = capsys.readouterr().out
    assert not load.busy and timing.BUSY_NOTICE not in out
    assert bench.busy_machine_warning() is None


def test_sample_load_real():
    load = timing.sample_load(interval=0.05)
    assert load.cpus >= 1 and load.source in ("psutil", "loadavg", "unavailable")
    assert load.cpu_percent is None or 0.0 <= load.cpu_percent <= 100.0


def test_first_mismatch():
    assert bench.first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert bench.first_mismatch([1, 2, 3], [1, 5, 3]) == 1
    assert bench.first_mismatch([1, 2], [1, 2, 3]) == 2 and bench.first_mismatch([1, 2, 3], [1, 2]) == 2
    assert bench.first_mismatch([], []) is None
