"""The grader's side of grading: one judging process per group of submissions, its verdicts, and
the limits that stop it.

The judging process (``judge.py``) runs the lab's tests with pytest and starts each submission
in a student side of its own (``student_side.py``, isolated by ``sandbox.py``); the submission's
code never runs in the judging process, nor here. So the verdicts it streams over a pipe are
the judge's own, and this module only collects them, applies the limits on the whole submission
and assembles each submission's record for the report.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .labs import Lab, Submission, sibling_labs, which_lab

DEFAULT_TEST_TIMEOUT = 20.0  # CPU seconds per test (its fixtures included), on each side
DEFAULT_TIMEOUT = 300.0  # CPU seconds of the judging process per submission (all its tests, plus start-up)
DEFAULT_WALL_TIMEOUT = 480.0  # wall-clock seconds per submission: inside Gradescope's default 10 minutes
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
WALL_FACTOR = 4.0  # a test that blocks is stopped at this many times its CPU limit on the wall clock


# --------------------------------------------------------------------------------------------
# Running judging processes.
# --------------------------------------------------------------------------------------------

def _judge_env(threads: int) -> dict:
    env = dict(os.environ)
    env.pop("SPECDECODE_LAB_IMPL", None)
    root = str(_PACKAGE_ROOT)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ in the labs
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # only our recorder: no nbval, anyio, ... in the judge
    for var in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS"):
        env.pop(var, None)
    env.setdefault("MPLBACKEND", "Agg")
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    return env


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system, all threads) used so far by a running process (Linux's /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def _wait_within_limits(proc: subprocess.Popen, timeout: float, wall_timeout: float) -> tuple:
    """Wait for a judging process: at most ``timeout`` seconds of its own CPU time (a busy
    machine makes it wait, not compute, so an honest submission keeps its time) and at most
    ``wall_timeout`` seconds on the wall clock, the hard stop that keeps a run inside the
    platform's own limit. Returns (exit status or None if stopped, CPU seconds, limit hit)."""
    t0 = time.perf_counter()
    cpu = 0.0
    while True:
        try:
            return proc.wait(timeout=0.25), cpu, None
        except subprocess.TimeoutExpired:
            pass
        wall = time.perf_counter() - t0
        cpu = _cpu_seconds(proc.pid) or cpu
        if cpu > timeout:
            return None, cpu, f"used more than {timeout:g} s of CPU time"
        if wall > wall_timeout:
            return None, cpu, f"ran longer than {wall_timeout:g} s on the wall clock"


def _run_judge(lab: Lab, subs: list, box, workdir: Path, files: list, test_timeout: float, timeout: float,
               wall_timeout: float, threads: int, log_path: Path) -> dict:
    """Run one judging process for ``subs``; returns the events it sent and how it ended."""
    read_fd, write_fd = os.pipe()
    job = {"lab_dir": str(lab.dir), "files": [str(f) for f in files], "hidden_files": [str(f) for f in lab.hidden_files],
           "test_timeout": test_timeout, "workdir": str(workdir), "verdict_fd": write_fd, "threads": threads,
           "sandbox": {"mode": box.mode, "extra_visible": box.extra_visible, "uid": box.uid},
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
            proc = subprocess.Popen([sys.executable, "-m", "specdecode_ref.grading.judge", str(job_path)], cwd=workdir,
                                    env=_judge_env(threads),
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, pass_fds=(write_fd,))
        finally:
            os.close(write_fd)  # the judge holds the only write end: EOF when it is gone
        reader.start()
        rc, cpu, limit_hit = _wait_within_limits(proc, timeout * len(subs), wall_timeout * len(subs))
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if rc is None:
            rc = proc.wait()
    box.kill_all()  # whatever a student side left behind, before any verdict is written
    reader.join(timeout=10)
    events = [[] for _ in subs]
    for raw in lines:
        try:
            ev = json.loads(raw)
            events[int(ev["sub"])].append(ev)
        except (ValueError, KeyError, IndexError, TypeError):
            continue  # a line cut by a stopped process
    return {"events": events, "rc": rc, "uid": box.uid, "timed_out": limit_hit is not None, "limit": limit_hit, "cpu_s": cpu,
            "duration": time.perf_counter() - t0, "log": log_path.read_text(errors="replace")}


# --------------------------------------------------------------------------------------------
# One submission's record.
# --------------------------------------------------------------------------------------------

def _totals(rec: dict) -> None:
    tests = rec["tests"]
    rec["max_score"] = sum(t["points"] for t in tests)
    rec["score"] = sum(t["earned"] for t in tests)
    rec["percent"] = round(100.0 * rec["score"] / rec["max_score"], 1) if rec["max_score"] else 0.0
    rec["passed"] = sum(t["outcome"] == "passed" for t in tests)
    rec["total"] = len(tests)


def _assemble(sub: Submission, run: dict | None, index: int, lab: Lab, isolation: dict) -> dict:
    rec = {"student": sub.name, "role": sub.role, "submission": str(sub.path) if sub.path else "", "status": "ok",
           "score": 0.0, "max_score": 0.0, "percent": 0.0, "passed": 0, "total": 0, "duration_s": 0.0,
           "flags": [], "message": sub.note, "tests": [], "evidence": [],
           "isolation": dict(isolation, uid=run["uid"]) if run and isolation else isolation}
    if sub.status or sub.path is None or run is None:
        rec["status"] = sub.status or "missing"
        _totals(rec)
        return rec
    tests, finished, done, collect_errors, internal = {}, None, None, [], []
    for ev in run["events"][index]:
        kind = ev.get("ev")
        if kind == "collected":
            tests = {t["name"]: dict(t, outcome="not run", message="", earned=0.0) for t in ev["tests"]}
        elif kind == "test" and ev.get("name") in tests:
            t = tests[ev["name"]]
            t["outcome"], t["message"], t["earned"] = ev["outcome"], ev.get("message", ""), float(ev["earned"])
        elif kind == "protocol":
            rec["evidence"].append(f"{ev.get('test')}: {ev.get('message')}")
        elif kind == "collect_error":
            collect_errors.append(str(ev.get("message", "")))
        elif kind == "internal":
            internal.append(str(ev.get("message", "")))
        elif kind == "finished":
            finished = ev
        elif kind == "done":
            done = ev
    rec["tests"] = list(tests.values())
    rec["duration_s"] = round(run["duration"] / max(1, len(run["events"])), 2)
    rec["cpu_s"] = round(float(run.get("cpu_s") or 0.0) / max(1, len(run["events"])), 1)  # the judge's own
    if done is not None and done.get("log"):
        rec["student_log"] = done["log"]
    if collect_errors:
        rec["status"] = "grader error"
        rec["message"] = collect_errors[0]
    elif internal:
        rec["status"] = "grader error"
        rec["message"] = internal[0]
    elif finished is None:
        rec["status"] = "timeout" if run["timed_out"] else "crashed"
        rec["message"] = (f"time limit: the grading {run.get('limit')}" if run["timed_out"]
                          else f"the judging process ended with exit status {run['rc']}")
        for t in rec["tests"]:
            if t["outcome"] == "not run":
                t["outcome"] = rec["status"]
    elif rec["tests"] and all(t["outcome"] == "load error" for t in rec["tests"]):
        rec["status"] = "load error"
        rec["message"] = rec["tests"][0]["message"]
    rec["evidence"] = list(dict.fromkeys(rec["evidence"]))[:20]
    if rec["evidence"]:
        rec["flags"].append("the student side broke the grading protocol (see evidence)")
    _totals(rec)
    if lab.reference_patterns and sub.role == "student" and lab.dir not in sub.path.parents:
        try:
            src = sub.path.read_text(errors="replace")
        except OSError:
            src = ""
        for pattern in lab.reference_patterns:
            m = re.search(pattern, src)
            if m:
                rec["flags"].append(f"uses the reference? ({' '.join(m.group(0).split())[:60]})")
    return rec


def _check_lab_match(subs: list, lab: Lab, others, apis: dict | None = None) -> None:
    """Mark student submissions that are not for this lab ("wrong lab", "ambiguous"). ``apis``
    ({lab: the names its student.py defines}) defaults to the labs next to this one; the
    autograder passes the same table, so both graders give the same verdict."""
    for s in subs:
        if s.path is None or s.status or s.role != "student":
            continue
        if apis is None:
            apis = lab_apis(lab, others)
        status, message = which_lab(s.path, lab.name, apis)
        if status:
            s.status, s.note = status, message


def lab_apis(lab: Lab, others=()) -> dict:
    """{lab name: sorted public names of its student.py} for ``lab``, ``others`` and every lab folder
    next to it: the one table both graders use to tell which lab an upload is for."""
    return dict(sorted((c.name, sorted(c.api_names())) for c in sibling_labs(lab, others)))


def _as_student_files(subs: list, todo: list, folder: Path) -> None:
    """A planted bug or mutant is the solution with one function replaced, and it finds the
    solution next to itself: the student side gets it written out as the one file a student with
    that mistake would hand in (mutation.as_one_file), since it sees nothing of the lab folder."""
    from .mutation import as_one_file

    for i in todo:
        s = subs[i]
        if s.role in ("planted bug", "mutant"):
            folder.mkdir(exist_ok=True)
            path = folder / f"{i}_{s.path.name}"
            path.write_text(as_one_file(s.path))
            subs[i] = Submission(s.name, path, s.note, s.role, s.status)


def _secrets(lab: Lab, subs: list) -> list:
    """Files the student side must not read, for the sandbox's probe: the answer keys, the hidden
    tests, the planted bugs and the class's other files."""
    paths = [lab.dir / "reference.py", lab.dir / "solution.py", *lab.hidden_files, *lab.planted_bugs[:1]]
    paths += [s.path for s in subs if s.path is not None][:3]
    return [str(p) for p in paths if p is not None and Path(p).is_file()]


_SANDBOXES: dict = {}


def sandbox_for(lab: Lab, subs: list, isolation: str | None = None):
    """The student sides' sandbox for this grading (chosen once per process, lab and mode, with its
    probe of this lab's answer key, hidden tests and the class's files)."""
    from . import sandbox

    key = (lab.dir, isolation)
    if key not in _SANDBOXES:
        _SANDBOXES[key] = sandbox.choose(_secrets(lab, subs), want=isolation)
    return _SANDBOXES[key]


def isolation_record(box) -> dict:
    from .sandbox import GUARANTEES

    probe = box.probe or {}
    return {"mode": box.mode, "uid": box.uid, "guarantees": GUARANTEES[box.mode], "readable_secrets": probe.get("reached", []),
            "network": probe.get("network"), "refused": probe.get("refused", [])}


def grade(lab_dir, submissions: list, out: str | os.PathLike | None = None, test_timeout: float = DEFAULT_TEST_TIMEOUT,
          timeout: float = DEFAULT_TIMEOUT, isolate: bool = True, jobs: int = 1, threads: int = 1,
          visible_only: bool = False, quiet: bool = False, other_labs=(), isolate_roles=("tamper attempt",),
          wall_timeout: float = DEFAULT_WALL_TIMEOUT, isolation: str | None = None, apis=None) -> dict:
    """Grade ``submissions`` (a list of :class:`Submission` or (name, path) pairs) for one lab.

    Every submission runs in a student side of its own, in the sandbox the
    machine allows (``isolation`` forces a mode, see sandbox.py). isolate: one judging process per
    submission (the default: a crash of the judge or a time limit costs only that submission);
    isolate=False lets trusted files (the self-test's) share one judging process, which saves its
    start-up; roles in ``isolate_roles`` still get their own. other_labs / apis: to tell which lab a bare file belongs to. Returns the
    report dict; writes it when ``out`` is given.
    """
    from .report import finish_report, write_report

    lab = Lab.open(lab_dir)
    subs = [s if isinstance(s, Submission) else Submission(str(s[0]), Path(s[1]).resolve() if s[1] else None)
            for s in submissions]
    _check_lab_match(subs, lab, other_labs, apis)
    files = lab.files(visible_only)
    started = _dt.datetime.now().isoformat(timespec="seconds")
    t0 = time.perf_counter()
    keep_logs = Path(out) / "logs" if out is not None else None
    if keep_logs is not None:
        keep_logs.mkdir(parents=True, exist_ok=True)
    todo = [i for i, s in enumerate(subs) if s.path is not None and not s.status]
    box = sandbox_for(lab, subs, isolation) if todo else None
    iso = isolation_record(box) if box is not None else {}
    with tempfile.TemporaryDirectory(prefix="specdecode-grading-") as tmp:
        tmp = Path(tmp)
        os.chmod(tmp, 0o700)
        originals = {i: str(s.path) for i, s in enumerate(subs) if s.path is not None}
        _as_student_files(subs, todo, tmp / "one-file")
        if isolate:
            groups = [[i] for i in todo]
        else:
            shared = [i for i in todo if subs[i].role not in isolate_roles]
            groups = ([shared] if shared else []) + [[i] for i in todo if subs[i].role in isolate_roles]

        def run_group(gi, group):
            wd = tmp / f"g{gi}"
            wd.mkdir()
            log = tmp / f"log{gi}.txt"
            group_subs = [subs[i] for i in group]
            from .sandbox import release_uid

            gbox = box.for_one_judge()  # a user id per judging process: students graded at once never share one
            try:
                run = _run_judge(lab, group_subs, gbox, wd, files, test_timeout, timeout, wall_timeout, threads, log)
            except Exception as exc:  # noqa: BLE001 - the grader's own failure: a row for each, never no report
                log.write_text(f"the grader failed: {type(exc).__name__}: {exc}\n")
                run = {"events": [[{"ev": "internal", "message": f"the grader failed: {type(exc).__name__}: {exc}"}]
                                  for _ in group], "rc": None, "uid": gbox.uid, "timed_out": False, "limit": None,
                       "cpu_s": 0.0, "duration": 0.0, "log": ""}
            finally:
                if gbox is not box:
                    release_uid(gbox.uid)
            if keep_logs is not None:
                name = subs[group[0]].name if len(group) == 1 else "all"
                shutil.copy(log, keep_logs / f"{_safe(name)}.txt")
            return [(i, run, j) for j, i in enumerate(group)]

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
        results = {i: (run, j) for i, run, j in outcomes}
        records = [_assemble(s, *results.get(i, (None, 0)), lab, iso) for i, s in enumerate(subs)]
        for i, r in enumerate(records):
            r["submission"] = originals.get(i, r["submission"])
    report = finish_report(lab, records, files, visible_only, started, time.perf_counter() - t0)
    report["isolation"] = iso
    if out is not None:
        write_report(report, out)
    return report


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "submission"
