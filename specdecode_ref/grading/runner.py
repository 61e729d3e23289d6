"""The grader's side of grading: one process per submission, the verdicts it reports, and the
checks that decide whether they can be believed.

Each grading process (``child.py``) reports every test's verdict over a pipe while it runs. The
runner believes a verdict only when pytest's own output agrees: the line pytest prints for each
test as it ends, the summary at the end, a canary test that must fail, and the process's exit
status. A submission whose verdicts disagree with them, or whose process reports that pytest's
machinery or the tests were changed under it, gets status "tampered" and 0 points.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from .labs import IMPL_ENV, Lab, Submission, sibling_labs, which_lab

DEFAULT_TEST_TIMEOUT = 20.0  # CPU seconds per test (its fixtures included)
DEFAULT_TIMEOUT = 300.0  # CPU seconds per submission (all its tests, plus start-up)
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
_CHILD = Path(__file__).resolve().parent / "child.py"
PYTEST_TESTS_FAILED = 1  # pytest's exit status when some test failed: always, since the canary fails

_LIVE = re.compile(r"^(?P<id>\S.*?::.*?) (?P<word>PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)(?: \(.*\))?\s+\[\s*\d+%\]\s*$")
_SUMMARY = re.compile(r"^=*\s*(?P<counts>(?:\d+ [a-z]+(?:, )?)+) in [\d.]+s\b.*?=*$")
_SUMMARY_HEADER = re.compile(r"^=+ short test summary info =+$")
_SHORT = re.compile(r"^(?P<word>PASSED|FAILED|ERROR) (?P<id>\S.*?::.*?)(?: - .*)?$")
_SKIPPED = re.compile(r"^SKIPPED \[(\d+)\] ")
_START = "===== grading "
_DONE = "===== done "


# --------------------------------------------------------------------------------------------
# Running grading processes.
# --------------------------------------------------------------------------------------------

def _child_env(threads: int) -> dict:
    env = dict(os.environ)
    env.pop(IMPL_ENV, None)
    root = str(_PACKAGE_ROOT)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ in the labs or the submissions
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # only our recorder: no nbval, anyio, ... in the child
    for var in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "FORCE_COLOR", "PY_COLORS"):  # pytest's output, as parsed below
        env.pop(var, None)
    env["NO_COLOR"] = "1"
    env["COLUMNS"] = "400"  # one line per test in pytest's output, however long its name
    env["PYTHONUNBUFFERED"] = "1"  # pytest's per-test lines reach the log even if the process dies
    env.setdefault("MPLBACKEND", "Agg")
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    return env


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
WALL_FACTOR = 4.0  # the wall-clock backstop, in multiples of the CPU-time limit


def _cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system, all threads) used so far by a running process, where the system
    tells it (Linux's /proc); None elsewhere."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def _wait_within_limits(proc: subprocess.Popen, timeout: float) -> tuple:
    """Wait for a grading process, stopping it at ``timeout`` seconds of its own CPU time.

    CPU time, not the wall clock, because a busy machine must not cost an honest submission its
    points: another job on the same cores makes a test wait longer, not compute longer. Code that
    blocks without computing (a sleep, a deadlock) is stopped at WALL_FACTOR times the limit on
    the wall clock. Where the CPU time cannot be read, the limit is on the wall clock.
    Returns (exit status or None if stopped, CPU seconds used, None or the limit that was hit).
    """
    t0 = time.perf_counter()
    cpu = 0.0
    while True:
        try:
            rc = proc.wait(timeout=0.25)
            return rc, cpu, None
        except subprocess.TimeoutExpired:
            pass
        wall = time.perf_counter() - t0
        now = _cpu_seconds(proc.pid)
        if now is None:
            if wall > timeout:
                return None, cpu, f"ran longer than {timeout:g} s"
            continue
        cpu = now
        if cpu > timeout:
            return None, cpu, f"used more than {timeout:g} s of CPU time"
        if wall > WALL_FACTOR * timeout:
            return None, cpu, (f"ran {wall:.0f} s on the wall clock ({WALL_FACTOR:g} times its {timeout:g} s "
                               f"of CPU time) while using {cpu:.0f} s of CPU: blocked")


def _run_child(lab: Lab, subs: list, workdir: Path, files: list, test_timeout: float, timeout: float,
               threads: int, log_path: Path) -> dict:
    """Run one grading process for ``subs``; returns what it reported and how it ended."""
    nonce = secrets.token_hex(6)
    canary = f"test_grader_canary_{nonce}"
    canary_file = workdir / f"grading_zz_canary_{nonce}.py"
    canary_file.write_text(f'def {canary}():\n    """Fails on purpose: the grader checks that it is reported failed."""\n'
                           f'    assert False, "canary {nonce}"\n')
    read_fd, write_fd = os.pipe()
    job = {"lab_dir": str(lab.dir), "files": [str(f) for f in files], "hidden_files": [str(f) for f in lab.hidden_files],
           "test_timeout": test_timeout, "workdir": str(workdir), "impl_env": IMPL_ENV, "verdict_fd": write_fd,
           "canary": canary, "canary_file": str(canary_file),
           "submissions": [{"name": s.name, "path": str(s.path)} for s in subs]}
    job_path = workdir / "job.json"
    job_path.write_text(json.dumps(job))
    lines: list = []

    def read():
        with os.fdopen(read_fd, "rb") as pipe:
            for raw in pipe:
                lines.append(raw)

    reader = threading.Thread(target=read, daemon=True)
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        try:
            proc = subprocess.Popen([sys.executable, str(_CHILD), str(job_path)], cwd=workdir, env=_child_env(threads),
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, pass_fds=(write_fd,))
        finally:
            os.close(write_fd)  # the child holds the only write end: EOF when it is gone
        reader.start()
        rc, cpu, limit_hit = _wait_within_limits(proc, timeout)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the child and anything it started
        except (ProcessLookupError, PermissionError):
            pass
        if rc is None:
            rc = proc.wait()
    reader.join(timeout=10)
    return {"events": _parse_events(lines, len(subs)), "rc": rc, "timed_out": limit_hit is not None,
            "limit": limit_hit, "cpu_s": cpu, "duration": time.perf_counter() - t0, "canary": canary, "nonce": nonce,
            "log": log_path.read_text(errors="replace")}


def _parse_events(lines: list, n_subs: int) -> list:
    """Split the pipe's JSON lines per submission: [{"events": [...], "problems": [...]}, ...]."""
    out = [{"events": [], "problems": []} for _ in range(n_subs)]
    if lines and not lines[-1].endswith(b"\n"):
        lines = lines[:-1]  # a process stopped in the middle of a message: the rest never came
    for raw in lines:
        try:
            ev = json.loads(raw)
            sub = ev["sub"]
            assert isinstance(sub, int) and 0 <= sub < n_subs and isinstance(ev.get("ev"), str)
        except Exception:  # noqa: BLE001 - anything that is not the recorder's JSON
            for o in out:
                o["problems"].append("an unreadable message arrived on the grader's verdict channel")
            continue
        out[sub]["events"].append(ev)
    return out


# --------------------------------------------------------------------------------------------
# What pytest printed.
# --------------------------------------------------------------------------------------------

def _key(display_id: str) -> tuple:
    path, _, name = display_id.partition("::")
    return (Path(path).name, name)


def _segments(log: str, subs: list) -> list:
    """The part of the log that belongs to each submission (between the child's markers), and
    whatever was printed after the last marker."""
    lines = log.splitlines()
    starts = {}
    done = {}
    for i, line in enumerate(lines):
        for j, s in enumerate(subs):
            if line.startswith(f"{_START}{s.name}: "):
                starts.setdefault(j, i)
            if line == f"{_DONE}{s.name}":
                done[j] = i  # the last one: a submission may print a fake marker while it is tested
    segs = []
    for j in range(len(subs)):
        a = starts.get(j, len(lines))
        b = done.get(j)
        segs.append({"lines": lines[a:b] if b is not None else lines[a:], "done": b is not None,
                     "after": lines[b + 1:] if b is not None and j == len(subs) - 1 else []})
    return segs


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _pytest_output(seg_lines: list) -> dict:
    """What pytest printed about each test: the line it prints as each test ends (-v), the short
    summary at the end (one line per test), and the final counts."""
    live: dict = {}
    seg_lines = [_ANSI.sub("", line) for line in seg_lines]
    for line in seg_lines:
        m = _LIVE.match(line)
        if m:
            live.setdefault(_key(m.group("id")), []).append(m.group("word"))
    summary, end = None, len(seg_lines)
    for i in range(len(seg_lines) - 1, -1, -1):
        m = _SUMMARY.match(seg_lines[i])
        if m:
            summary, end = Counter(), i
            for part in m.group("counts").split(", "):
                n, word = part.split(" ", 1)
                summary[{"error": "errors"}.get(word, word)] += int(n)
            break
    short: dict = {}
    short_counts = Counter()
    start = next((i for i in range(end - 1, -1, -1) if _SUMMARY_HEADER.match(seg_lines[i])), None)
    if summary is not None and start is not None:
        for line in seg_lines[start + 1:end]:
            m = _SHORT.match(line)
            if m:
                short.setdefault(_key(m.group("id")), []).append(m.group("word"))
                short_counts[{"PASSED": "passed", "FAILED": "failed", "ERROR": "errors"}[m.group("word")]] += 1
            m = _SKIPPED.match(line)
            if m:
                short_counts["skipped"] += int(m.group(1))
    return {"live": live, "short": short, "summary": summary, "short_counts": short_counts}


# --------------------------------------------------------------------------------------------
# One submission's record: the verdicts, checked against pytest's output and the exit status.
# --------------------------------------------------------------------------------------------

def _totals(rec: dict) -> None:
    tests = rec["tests"]
    rec["max_score"] = sum(t["points"] for t in tests)
    if rec["status"] == "tampered":  # nothing it reported can be believed
        for t in tests:
            t["earned"] = 0.0
    rec["score"] = sum(t["earned"] for t in tests)
    rec["percent"] = round(100.0 * rec["score"] / rec["max_score"], 1) if rec["max_score"] else 0.0
    rec["passed"] = sum(t["outcome"] == "passed" for t in tests) if rec["status"] != "tampered" else 0
    rec["total"] = len(tests)


def _assemble(sub: Submission, run: dict | None, index: int, seg: dict | None, isolated: bool, lab: Lab) -> dict:
    rec = {"student": sub.name, "role": sub.role, "submission": str(sub.path) if sub.path else "", "status": "ok",
           "score": 0.0, "max_score": 0.0, "percent": 0.0, "passed": 0, "total": 0, "duration_s": 0.0,
           "flags": [], "message": sub.note, "tests": [], "evidence": []}
    if sub.status or sub.path is None or run is None:
        rec["status"] = sub.status or "missing"
        _totals(rec)
        return rec
    rc, timed_out = run["rc"], run["timed_out"]
    events = run["events"][index]
    evidence = list(dict.fromkeys(events["problems"]))
    collected, tests, finished, collect_errors = None, {}, None, []
    seen = set()
    for ev in events["events"]:
        kind = ev["ev"]
        if finished is not None and kind != "start":
            evidence.append(f"a '{kind}' verdict arrived after the tests had finished")
            continue
        if kind == "collected" and collected is None:
            collected = ev["tests"]
            tests = {tuple(t["key"]): dict(t, outcome="not run", message="", earned=0.0) for t in collected}
        elif kind == "test":
            key = tuple(ev.get("key", ()))
            if key not in tests:
                evidence.append(f"a verdict for an unknown test {key[-1] if key else '?'} arrived")
            elif key in seen:
                evidence.append(f"two verdicts arrived for {key[1]}")
            else:
                seen.add(key)
                t = tests[key]
                t["outcome"], t["message"] = str(ev.get("outcome")), str(ev.get("message", ""))
                t["earned"] = t["points"] if t["outcome"] == "passed" else 0.0
        elif kind == "tampered":
            evidence.append(f"during the tests, {ev.get('why', 'something changed')}")
        elif kind == "collect_error":
            collect_errors.append(str(ev.get("message", "")))
        elif kind == "finished":
            finished = ev
        elif kind != "start":
            evidence.append(f"an unexpected '{kind}' message arrived on the verdict channel")

    # Cross-check with what pytest printed, the canary and the exit status.
    out = _pytest_output(seg["lines"] if seg else [])
    canary = next((t for t in tests.values() if t.get("canary")), None)
    sources = (out["live"], out["short"])  # as each test ended, and the short summary at the end
    for key, t in tests.items():
        if t.get("canary") or key not in seen or t["outcome"] == "skipped":
            continue
        said = [src[key] for src in sources if key in src]
        if not said:
            evidence.append(f"{key[1]}: a verdict arrived but pytest never reported the test")
        for words in said:
            if (t["outcome"] == "passed") != (set(words) == {"PASSED"}):
                evidence.append(f"{key[1]}: the verdict says {t['outcome']}, pytest said {' and '.join(words)}")
                break
    if finished is not None:
        missing = [k[1] for src in sources for k in src if k[1] != run["canary"] and k not in seen]
        if missing:
            evidence.append(f"pytest reported {missing[0]} but no verdict arrived for it")
        canary_said = [set(ws) for src in sources for k, ws in src.items() if k[1] == run["canary"]]
        if (canary is None or canary["outcome"] != "failed" or run["nonce"] not in canary["message"]
                or not canary_said or any(ws != {"FAILED"} for ws in canary_said)):
            evidence.append("the grader's canary test, which fails on purpose, was not reported failed")
        if out["summary"] is None:
            evidence.append("pytest's final summary is missing from its output")
        else:
            counts = Counter({k: out["summary"][k] for k in ("passed", "failed", "errors", "skipped")})
            if +out["short_counts"] != +counts:
                evidence.append(f"pytest's summary ({dict(out['summary'])}) does not match the tests it listed")
        if finished.get("exitstatus") != PYTEST_TESTS_FAILED:
            evidence.append(f"pytest's exit status was {finished.get('exitstatus')}, but the canary always fails")
        if isolated and not timed_out and rc != finished.get("exitstatus"):  # a stopped process's status is ours
            evidence.append(f"the process exited with status {rc}, pytest's exit status was {finished.get('exitstatus')}")
        if seg is not None and any(_SUMMARY.match(x) or _SUMMARY_HEADER.match(x) for x in seg["after"]):
            evidence.append("something printed a test summary after pytest had finished")
    elif isolated and rc == 0 and not timed_out:
        evidence.append("the process exited with status 0 before its tests had finished")

    rec["tests"] = [t for t in tests.values() if not t.get("canary")]
    for t in rec["tests"]:
        t.pop("key", None)
        t.pop("canary", None)
    rec["duration_s"] = round(float((finished or {}).get("duration_s", run["duration"])), 2)
    if isolated and run.get("cpu_s"):
        rec["cpu_s"] = round(float(run["cpu_s"]), 1)  # the process's CPU time, as last read while it ran
    if evidence:
        rec["status"] = "tampered"
        rec["evidence"] = list(dict.fromkeys(evidence))
        rec["message"] = "the results cannot be trusted: " + "; ".join(rec["evidence"][:3])
    elif collect_errors:
        rec["status"] = "grader error"
        rec["message"] = collect_errors[0]
    elif collected is None or finished is None:
        rec["status"] = "timeout" if timed_out else "crashed"
        rec["message"] = (f"time limit: the grading process {run.get('limit')}" if timed_out
                          else f"grader process exit code {rc}")
        for t in rec["tests"]:
            if t["outcome"] == "not run":
                t["outcome"] = rec["status"]
    elif timed_out and isolated:  # e.g. a thread left running keeps the interpreter from exiting
        rec["status"] = "timeout"
        rec["message"] = f"every test finished, but then the grading process {run.get('limit')} without exiting"
    elif rec["tests"] and all(t["outcome"] == "load error" for t in rec["tests"]):
        rec["status"] = "load error"
        rec["message"] = rec["tests"][0]["message"]
    _totals(rec)
    if lab.reference_patterns and sub.role == "student" and lab.dir not in sub.path.parents:
        try:
            src = sub.path.read_text()
        except OSError:
            src = ""
        for pattern in lab.reference_patterns:
            m = re.search(pattern, src)
            if m:
                rec["flags"].append(f"uses the reference? ({' '.join(m.group(0).split())[:60]})")
    return rec


def _check_lab_match(subs: list, lab: Lab, others) -> None:
    """Mark submissions that are not for this lab ("wrong lab", "ambiguous"); files of the lab's
    own folder (reference, solution, planted bugs, ...) always belong to it."""
    candidates = None
    for s in subs:
        if s.path is None or s.status or lab.dir in s.path.parents:
            continue
        if candidates is None:
            candidates = sibling_labs(lab, others)
        status, message = which_lab(s.path, lab, candidates)
        if status:
            s.status, s.note = status, message


def grade(lab_dir, submissions: list, out: str | os.PathLike | None = None, test_timeout: float = DEFAULT_TEST_TIMEOUT,
          timeout: float = DEFAULT_TIMEOUT, isolate: bool = True, jobs: int = 1, threads: int = 1,
          visible_only: bool = False, quiet: bool = False, other_labs=(), isolate_roles=("tamper attempt",)) -> dict:
    """Grade ``submissions`` (a list of :class:`Submission` or (name, path) pairs) for one lab.

    isolate: one process per submission (the default; a crash or an endless loop costs only
    that submission, and its exit status is checked too). isolate=False grades them all in one
    process, which is faster for trusted code (the self-test); submissions whose role is in
    ``isolate_roles`` still get their own process. other_labs: labs graded in the same run, to
    tell which lab a bare file belongs to. Returns the report dict; writes it when ``out`` is given.
    """
    from .report import finish_report, write_report

    lab = Lab.open(lab_dir)
    subs = [s if isinstance(s, Submission) else Submission(str(s[0]), Path(s[1]).resolve() if s[1] else None)
            for s in submissions]
    _check_lab_match(subs, lab, other_labs)
    files = lab.files(visible_only)
    started = _dt.datetime.now().isoformat(timespec="seconds")
    t0 = time.perf_counter()
    keep_logs = Path(out) / "logs" if out is not None else None
    if keep_logs is not None:
        keep_logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="specdecode-grading-") as tmp:
        tmp = Path(tmp)
        todo = [i for i, s in enumerate(subs) if s.path is not None and not s.status]
        if isolate:
            groups = [[i] for i in todo]
        else:
            shared = [i for i in todo if subs[i].role not in isolate_roles]
            groups = ([shared] if shared else []) + [[i] for i in todo if subs[i].role in isolate_roles]

        def run_group(gi, group):
            wd = tmp / f"g{gi}"
            wd.mkdir()
            log = tmp / f"log{gi}.txt"
            limit = timeout * len(group)
            group_subs = [subs[i] for i in group]
            run = _run_child(lab, group_subs, wd, files, test_timeout, limit, threads, log)
            if keep_logs is not None:
                name = subs[group[0]].name if len(group) == 1 else "all"
                shutil.copy(log, keep_logs / f"{_safe(name)}.txt")
            segs = _segments(run["log"], group_subs)
            return [(i, run, j, segs[j], len(group) == 1) for j, i in enumerate(group)]

        outcomes = []
        if jobs > 1 and len(groups) > 1:
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(jobs) as pool:
                for res in pool.map(lambda a: run_group(*a), enumerate(groups)):
                    outcomes += res
        else:
            for gi, group in enumerate(groups):
                outcomes += run_group(gi, group)
                if not quiet and len(groups) > 1:
                    print(f"  graded {subs[group[0]].name}", file=sys.stderr, flush=True)
        results = {i: (run, j, seg, iso) for i, run, j, seg, iso in outcomes}
        records = [_assemble(s, *results.get(i, (None, 0, None, True)), lab) for i, s in enumerate(subs)]
    report = finish_report(lab, records, files, visible_only, started, time.perf_counter() - t0)
    if out is not None:
        write_report(report, out)
    return report


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "submission"
