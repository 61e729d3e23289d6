"""Graded labs: load a lab's implementation, give tests points, grade submissions.

A lab is a folder ``labs/labNN_topic/`` that follows these conventions (adding a lab means
adding a folder; nothing here lists the labs):

    labNN_topic.ipynb          guided notebook; ``lab = load_lab()`` gives it the implementation
    student.py                 documented stubs that raise NotImplementedError (students edit it)
    reference.py               the same names as thin adapters over specdecode_ref
    solution.py                (optional) a worked solution written the way a student would
    grading_labNN.py           pytest tests with ``@points(n)``: the self-check students may see
    grading_labNN_hidden.py    more tests, the edge cases the notebook does not show
    planted_bugs/*.py          wrong solutions that must lose points (checked by ``--self-test``);
                               a docstring line ``caught by: test_a, test_b`` names tests that
                               must fail for it

Which implementation runs is one switch, read by the notebook and the grading tests alike:
``load_lab(impl)`` or the environment variable ``SPECDECODE_LAB_IMPL`` = ``student`` (default),
``reference``, ``solution`` or a path to a ``.py`` file (a submission).

Command line (``python -m specdecode_ref.grading --help``)::

    python -m specdecode_ref.grading labs/lab01_rejection_sampler              # grade student.py
    python -m specdecode_ref.grading labs/lab01_rejection_sampler --reference  # the reference
    python -m specdecode_ref.grading labs/lab01_rejection_sampler --submission alice/student.py
    python -m specdecode_ref.grading labs/lab0* --submissions collected/ --out grades/
    python -m specdecode_ref.grading labs/lab0* --self-test     # reference 100 %, stubs 0, bugs < 100 %
    python -m specdecode_ref.grading handout labs/lab01_rejection_sampler --out handout/

Every submission is graded in its own Python process with a time limit, and every test has its
own time limit too, so an infinite loop or a crash costs that submission points and nothing else.
A test that raises NotImplementedError (an untouched stub) simply scores 0. The grader prints a
score table and writes ``report.json`` (everything, with failure messages) and ``scores.csv``
(one row per submission, one column per test) into the output folder.

Grading runs the submitted code: for untrusted submissions run the grader in a container or a
throw-away account.
"""
from __future__ import annotations

import argparse
import ast
import csv
import datetime as _dt
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

IMPL_ENV = "SPECDECODE_LAB_IMPL"
NAMED_IMPLS = ("student", "reference", "solution")
DEFAULT_TEST_TIMEOUT = 20.0  # seconds per test
DEFAULT_TIMEOUT = 300.0  # seconds per submission (all its tests, plus start-up)
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------------------------
# What grading tests use: points, the `lab` fixture, a chi-square helper.
# --------------------------------------------------------------------------------------------

class GradingTimeout(BaseException):
    """Raised inside a test that ran past its time limit. A BaseException, so that a submission's
    ``except Exception`` cannot swallow it."""


class LabLoadError(Exception):
    """The implementation file could not be found or imported (e.g. a syntax error)."""


def points(n: float):
    """Decorator: the test is worth ``n`` points (each parametrized case separately)."""
    if not isinstance(n, (int, float)) or n < 0:
        raise ValueError(f"points must be a number >= 0, got {n!r}")

    def mark(fn):
        fn.__grading_points__ = float(n)
        return fn

    return mark


def _resolve_impl(impl, lab_dir: Path) -> tuple[Path, str]:
    impl = impl if impl is not None else os.environ.get(IMPL_ENV, "").strip() or "student"
    impl = str(impl)
    if impl in NAMED_IMPLS:
        path = lab_dir / f"{impl}.py"
        label = {"student": "your student.py", "reference": "the reference implementation (reference.py)",
                 "solution": "the worked solution (solution.py)"}[impl]
    else:
        path = Path(impl).expanduser()
        label = str(path)
    if not path.is_file():
        raise LabLoadError(f"no implementation file {path} (impl={impl!r}; use student, reference, "
                           f"solution or a path to a .py file)")
    return path.resolve(), label


def load_lab(impl: str | os.PathLike | None = None, lab_dir: str | os.PathLike | None = None,
             verbose: bool = False):
    """Import a lab implementation and return it as a module.

    impl: "student" (``student.py`` in the lab folder), "reference", "solution", or a path to a
    .py file; None reads ``$SPECDECODE_LAB_IMPL`` and falls back to "student".
    lab_dir: the lab folder (default: the current directory, which is the notebook's folder in
    Jupyter). Every call imports the file afresh, so re-running it picks up your edits.
    """
    lab_dir = Path(lab_dir if lab_dir is not None else Path.cwd()).resolve()
    path, label = _resolve_impl(impl, lab_dir)
    name = f"_lab_impl_{lab_dir.name}_{path.stem}_{abs(hash(str(path))) % 10**8}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up here
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - a submission may raise anything while importing
        sys.modules.pop(name, None)
        if isinstance(exc, (KeyboardInterrupt, GradingTimeout)):
            raise
        raise LabLoadError(f"could not import {path}: {type(exc).__name__}: {exc}") from exc
    module.__lab_impl__ = label
    if verbose:
        print(f"{lab_dir.name}: using {label}")
    return module


def lab_fixture(grading_file: str):
    """A module-scoped pytest fixture named ``lab`` that loads the implementation under test.

    In a grading file: ``lab = lab_fixture(__file__)``; tests then take ``lab`` as an argument.
    A file that fails to import makes every test error (0 points) instead of stopping the run.
    """
    import pytest

    lab_dir = Path(grading_file).resolve().parent

    @pytest.fixture(scope="module", name="lab")
    def _lab():
        return load_lab(lab_dir=lab_dir)

    return _lab


def chi2_pvalue(counts, probs, min_expected: float = 5.0) -> float:
    """p-value of a chi-square goodness-of-fit test of observed ``counts`` against ``probs``.

    Bins expected to hold fewer than ``min_expected`` counts are pooled into one, so that the
    chi-square approximation holds. Any count in a bin of probability 0 gives 0.0.
    """
    import numpy as np
    from scipy import stats

    counts = np.asarray(counts, dtype=float).ravel()
    probs = np.asarray(probs, dtype=float).ravel()
    if counts.shape != probs.shape:
        raise ValueError(f"counts {counts.shape} and probs {probs.shape} differ in length")
    if (counts[probs <= 0] > 0).any():
        return 0.0
    probs = probs / probs.sum()
    expected = probs * counts.sum()
    big = expected >= min_expected
    obs = list(counts[big])
    exp = list(expected[big])
    if (~big).any() and expected[~big].sum() > 0:
        obs.append(counts[~big].sum())
        exp.append(expected[~big].sum())
    if len(obs) < 2:
        return 1.0
    return float(stats.chisquare(np.array(obs), np.array(exp)).pvalue)


# --------------------------------------------------------------------------------------------
# Labs and submissions on disk.
# --------------------------------------------------------------------------------------------

@dataclass
class Lab:
    dir: Path
    visible_files: list
    hidden_files: list
    planted_bugs: list
    reference_patterns: list = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.dir.name

    @property
    def number(self) -> str:
        m = re.match(r"(lab\d+)", self.name)
        return m.group(1) if m else self.name

    def files(self, visible_only: bool = False) -> list:
        return list(self.visible_files) + ([] if visible_only else list(self.hidden_files))

    @staticmethod
    def open(path) -> "Lab":
        d = Path(path).resolve()
        if not d.is_dir():
            raise SystemExit(f"{path}: not a folder (expected a lab folder such as labs/lab01_rejection_sampler)")
        grading = sorted(d.glob("grading_*.py"))
        if not grading:
            raise SystemExit(f"{path}: no grading_*.py files: is this a lab folder?")
        hidden = [f for f in grading if f.stem.endswith("_hidden")]
        visible = [f for f in grading if f not in hidden]
        bugs = sorted((d / "planted_bugs").glob("*.py")) if (d / "planted_bugs").is_dir() else []
        patterns = []
        for f in grading:  # REFERENCE_PATTERNS = [regex, ...] in a grading file: code worth flagging
            try:
                tree = ast.parse(f.read_text())
            except SyntaxError:
                continue
            for node in tree.body:
                if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "REFERENCE_PATTERNS"
                                                         for t in node.targets)):
                    patterns += list(ast.literal_eval(node.value))
        return Lab(d, visible, hidden, bugs, patterns)


@dataclass
class Submission:
    name: str
    path: Path | None  # None: nothing found for this student
    note: str = ""


def find_submissions(folder, lab: Lab) -> list:
    """One submission per entry of ``folder``: ``NAME.py``, or a folder ``NAME/`` holding
    ``NAME/labNN_topic/student.py``, ``NAME/labNN*/student.py``, ``NAME/labNN_topic.py``,
    ``NAME/student.py`` or a single ``.py`` file (tried in that order)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SystemExit(f"--submissions {folder}: not a folder")
    subs = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith((".", "_")):
            continue
        if entry.is_file() and entry.suffix == ".py":
            subs.append(Submission(entry.stem, entry.resolve()))
        elif entry.is_dir():
            candidates = [entry / lab.name / "student.py"]
            candidates += sorted(p / "student.py" for p in entry.iterdir() if p.is_dir() and p.name.startswith(lab.number))
            candidates += [entry / f"{lab.name}.py", entry / "student.py"]
            found = next((c for c in candidates if c.is_file()), None)
            if found is None:
                pys = sorted(entry.glob("*.py"))
                found = pys[0] if len(pys) == 1 else None
            subs.append(Submission(entry.name, found.resolve() if found else None,
                                   "" if found else f"no student.py for {lab.name} in {entry}"))
    return subs


def _planted_bug_expectations(path: Path) -> list:
    m = re.search(r"^\s*caught by:\s*(.+)$", path.read_text(), flags=re.MULTILINE)
    return [t.strip() for t in m.group(1).split(",") if t.strip()] if m else []


# --------------------------------------------------------------------------------------------
# The child process: pytest with a recorder plugin, one or more submissions in turn.
# --------------------------------------------------------------------------------------------

def _first_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).strip().split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Recorder:
    """pytest plugin: records every test's points and outcome, writing JSON after each report."""

    def __init__(self, out_path: Path, test_timeout: float, hidden_files: set):
        self.out_path = out_path
        self.test_timeout = test_timeout
        self.hidden_files = hidden_files
        self.tests: dict = {}
        self.collect_errors: list = []
        self.finished = False
        self.t0 = time.perf_counter()

    def _write(self):
        tmp = self.out_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"tests": list(self.tests.values()), "collect_errors": self.collect_errors,
                                   "finished": self.finished,
                                   "duration_s": round(time.perf_counter() - self.t0, 2)}))
        os.replace(tmp, self.out_path)

    def pytest_collectreport(self, report):
        if report.failed:
            self.collect_errors.append(_first_line(report.longreprtext, 2000))

    def pytest_collection_modifyitems(self, session, config, items):
        names = {}
        for item in items:
            fn = getattr(item, "function", None)
            file = Path(str(item.path)).name
            name = item.nodeid.split("::", 1)[-1]
            if name in names:
                name = f"{file}::{name}"
            names[name] = True
            doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
            self.tests[item.nodeid] = {
                "name": name, "file": file, "points": float(getattr(fn, "__grading_points__", 1.0)),
                "hidden": file in self.hidden_files, "doc": doc[0] if doc else "",
                "outcome": "not run", "message": "", "earned": 0.0}
        self._write()

    def _alarm(self, signum, frame):
        raise GradingTimeout(f"test ran longer than {self.test_timeout:g} s")

    def _arm(self):
        if self.test_timeout and hasattr(signal, "SIGALRM"):
            signal.signal(signal.SIGALRM, self._alarm)
            # Re-fires every second in case the first one is swallowed by a bare `except:`.
            signal.setitimer(signal.ITIMER_REAL, self.test_timeout, 1.0)

    def _disarm(self):
        if self.test_timeout and hasattr(signal, "SIGALRM"):
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)

    def pytest_runtest_protocol(self, item, nextitem):
        self._arm()  # covers fixture setup (importing the submission), the test and teardown

    def pytest_runtest_logfinish(self, nodeid, location):
        self._disarm()

    def pytest_runtest_makereport(self, item, call):
        rec = self.tests.get(item.nodeid)
        if rec is None:
            return
        if call.excinfo is None:
            if call.when == "call" and rec["outcome"] == "not run":
                rec["outcome"], rec["earned"] = "passed", rec["points"]
        elif rec["outcome"] in ("not run", "passed"):  # the first failure wins
            exc = call.excinfo.value
            if call.excinfo.errisinstance(NotImplementedError):
                outcome, msg = "not implemented", _first_line(exc) or "NotImplementedError"
            elif call.excinfo.errisinstance(GradingTimeout):
                outcome, msg = "timeout", str(exc)
            elif call.excinfo.typename == "Skipped":
                outcome, msg = "skipped", _first_line(exc)
            elif call.excinfo.errisinstance(AssertionError):
                outcome, msg = "failed", _first_line(exc) or "assertion failed"
            else:
                outcome = "error" if call.when == "call" else f"error in {call.when}"
                msg = f"{call.excinfo.typename}: {_first_line(exc)}"
            if isinstance(exc, LabLoadError) or "LabLoadError" in call.excinfo.typename:
                outcome = "load error"
            rec["outcome"], rec["message"], rec["earned"] = outcome, msg, 0.0
        self._write()

    def pytest_sessionfinish(self, session, exitstatus):
        self.finished = True
        self._write()


def _child_main(job_path: str) -> int:
    """Grade the submissions listed in a job file (run by the grader in a fresh process)."""
    import pytest

    job = json.loads(Path(job_path).read_text())
    ini = Path(job["workdir"]) / "pytest.ini"
    ini.write_text("[pytest]\n")
    hidden = {Path(f).name for f in job["hidden_files"]}
    for sub in job["submissions"]:
        os.environ[IMPL_ENV] = sub["path"]
        print(f"===== grading {sub['name']}: {sub['path']}", flush=True)
        recorder = _Recorder(Path(sub["result"]), job["test_timeout"], hidden)
        args = [*job["files"], "-q", "-p", "no:cacheprovider", "--noconftest",
                "-c", str(ini), "--rootdir", job["lab_dir"], "-o", "addopts=", "-o", "python_files=grading_*.py",
                "-W", "ignore::DeprecationWarning", "--tb=short", "-rN"]
        try:
            pytest.main(args, plugins=[recorder])
        except BaseException as exc:  # noqa: BLE001 - keep grading the next submission
            print(f"grader: pytest stopped with {type(exc).__name__}: {exc}", flush=True)
        sys.stdout.flush()
    return 0


# --------------------------------------------------------------------------------------------
# The parent: run children, assemble, print, write the report.
# --------------------------------------------------------------------------------------------

def _child_env(threads: int) -> dict:
    env = dict(os.environ)
    env.pop(IMPL_ENV, None)
    root = str(_PACKAGE_ROOT)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ in the labs or the submissions
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # only our recorder: no nbval, anyio, ... in the child
    env.setdefault("MPLBACKEND", "Agg")
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    return env


def _run_child(lab: Lab, subs: list, workdir: Path, files: list, test_timeout: float, timeout: float,
               threads: int, log_path: Path) -> tuple:
    results = [workdir / f"result_{i}.json" for i in range(len(subs))]
    job = {"lab_dir": str(lab.dir), "files": [str(f) for f in files], "hidden_files": [str(f) for f in lab.hidden_files],
           "test_timeout": test_timeout, "workdir": str(workdir),
           "submissions": [{"name": s.name, "path": str(s.path), "result": str(r)} for s, r in zip(subs, results)]}
    job_path = workdir / "job.json"
    job_path.write_text(json.dumps(job))
    t0 = time.perf_counter()
    timed_out = False
    with open(log_path, "w") as log:
        # Run this file as a script, not with -m: importing the package would load torch and
        # transformers into every grading process, even for labs that need only numpy.
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "_child", str(job_path)],
                                cwd=workdir, env=_child_env(threads), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the child and anything it started
            except ProcessLookupError:
                pass
            rc = proc.wait()
    return results, rc, timed_out, time.perf_counter() - t0


def _totals(rec: dict) -> None:
    tests = rec["tests"]
    rec["max_score"] = sum(t["points"] for t in tests)
    rec["score"] = sum(t["earned"] for t in tests)
    rec["percent"] = round(100.0 * rec["score"] / rec["max_score"], 1) if rec["max_score"] else 0.0
    rec["passed"] = sum(t["outcome"] == "passed" for t in tests)
    rec["total"] = len(tests)


def _assemble(sub: Submission, result_path: Path | None, rc, timed_out: bool, duration: float, lab: Lab) -> dict:
    rec = {"student": sub.name, "submission": str(sub.path) if sub.path else "", "status": "ok",
           "score": 0.0, "max_score": 0.0, "percent": 0.0, "passed": 0, "total": 0,
           "duration_s": round(duration, 2), "flags": [], "message": sub.note, "tests": []}
    data = None
    if result_path is not None and result_path.is_file():
        try:
            data = json.loads(result_path.read_text())
        except json.JSONDecodeError:
            data = None
    if sub.path is None:
        rec["status"] = "missing"
    elif data is None:
        rec["status"] = "timeout" if timed_out else "crashed"
        rec["message"] = "time limit" if timed_out else f"grader process exit code {rc}"
    else:
        rec["tests"] = data["tests"]
        if data["collect_errors"]:
            rec["status"] = "grader error"
            rec["message"] = data["collect_errors"][0]
        elif not data["finished"]:
            rec["status"] = "timeout" if timed_out else "crashed"
            rec["message"] = "time limit" if timed_out else f"grader process exit code {rc}"
            for t in rec["tests"]:
                if t["outcome"] == "not run":
                    t["outcome"] = rec["status"]
        elif rec["tests"] and all(t["outcome"] == "load error" for t in rec["tests"]):
            rec["status"] = "load error"
            rec["message"] = rec["tests"][0]["message"]
        rec["duration_s"] = data.get("duration_s", rec["duration_s"])
    _totals(rec)
    if sub.path is not None and lab.reference_patterns and sub.path.parent != lab.dir:
        try:
            src = sub.path.read_text()
        except OSError:
            src = ""
        for pattern in lab.reference_patterns:
            m = re.search(pattern, src)
            if m:
                rec["flags"].append(f"uses the reference? ({_first_line(m.group(0), 60)})")
    return rec


def grade(lab_dir, submissions: list, out: str | os.PathLike | None = None, test_timeout: float = DEFAULT_TEST_TIMEOUT,
          timeout: float = DEFAULT_TIMEOUT, isolate: bool = True, jobs: int = 1, threads: int = 1,
          visible_only: bool = False, quiet: bool = False) -> dict:
    """Grade ``submissions`` (a list of :class:`Submission` or (name, path) pairs) for one lab.

    isolate: one process per submission (the default; a crash or an endless loop costs only
    that submission). isolate=False grades them all in one process, which is faster for
    trusted code (the self-test). Returns the report dict; writes it when ``out`` is given.
    """
    lab = Lab.open(lab_dir)
    subs = [s if isinstance(s, Submission) else Submission(str(s[0]), Path(s[1]).resolve() if s[1] else None)
            for s in submissions]
    files = lab.files(visible_only)
    started = _dt.datetime.now().isoformat(timespec="seconds")
    t0 = time.perf_counter()
    keep_logs = Path(out) / "logs" if out is not None else None
    if keep_logs is not None:
        keep_logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="specdecode-grading-") as tmp:
        tmp = Path(tmp)
        todo = [i for i, s in enumerate(subs) if s.path is not None]
        groups = [[i] for i in todo] if isolate else ([todo] if todo else [])

        def run_group(gi, group):
            wd = tmp / f"g{gi}"
            wd.mkdir()
            log = wd / "log.txt"
            limit = timeout * len(group)
            results, rc, timed_out, dur = _run_child(lab, [subs[i] for i in group], wd, files, test_timeout,
                                                     limit, threads, log)
            if keep_logs is not None:
                name = subs[group[0]].name if len(group) == 1 else "all"
                shutil.copy(log, keep_logs / f"{_safe(name)}.txt")
            return [(i, r, rc, timed_out, dur / len(group)) for i, r in zip(group, results)]

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
        results = {i: (r, rc, timed_out, dur) for i, r, rc, timed_out, dur in outcomes}
        records = [_assemble(s, *results.get(i, (None, None, False, 0.0)), lab) for i, s in enumerate(subs)]
    template = next(([{k: t[k] for k in ("name", "file", "points", "hidden", "doc")} for t in r["tests"]]
                     for r in records if r["tests"] and r["status"] in ("ok", "load error")), None)
    if template:  # submissions that produced no results still list every test, with 0 points
        for r in records:
            if not r["tests"]:
                r["tests"] = [dict(t, outcome=r["status"], earned=0.0, message="") for t in template]
                _totals(r)
    tests = template or []
    report = {
        "lab": lab.name, "lab_dir": str(lab.dir), "generated_at": started,
        "grading_files": [f.name for f in files], "visible_only": visible_only,
        "max_score": sum(t["points"] for t in tests),
        "tests": tests, "submissions": records, "elapsed_s": round(time.perf_counter() - t0, 1),
    }
    if out is not None:
        write_report(report, out)
    return report


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "submission"


def write_report(report: dict, out) -> tuple:
    """Write ``report.json`` and ``scores.csv`` into ``out``; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    jpath, cpath = out / "report.json", out / "scores.csv"
    jpath.write_text(json.dumps(report, indent=1))
    names = [t["name"] for t in report["tests"]]
    with open(cpath, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "status", "score", "max_score", "percent", "passed", "total", "flags", "submission",
                    *names])
        for r in report["submissions"]:
            earned = {t["name"]: t["earned"] for t in r["tests"]}
            w.writerow([r["student"], r["status"], _num(r["score"]), _num(r["max_score"]), r["percent"], r["passed"],
                        r["total"], "; ".join(r["flags"]), r["submission"], *[_num(earned.get(n, 0.0)) for n in names]])
    return jpath, cpath


def _num(x: float):
    return int(x) if float(x).is_integer() else round(x, 2)


def _relative(path: str) -> str:
    try:
        return str(Path(path).relative_to(Path.cwd())) if path else path
    except ValueError:
        return path


def _table(rows: list, header: list, align: str) -> str:
    """A plain-text table; align has one letter per column, l(eft) or r(ight)."""
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(r):
        return "  ".join(c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(r, widths, align)).rstrip()

    return "\n".join([line(cells[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in cells[1:]])


def format_report(report: dict, details: bool | None = None) -> str:
    """The score table (and, for a single submission or with details=True, a per-test table)."""
    subs = report["submissions"]
    out = [f"{report['lab']}: {len(subs)} submission(s), {_num(report['max_score'])} points"
           + (" (visible tests only)" if report.get("visible_only") else "")]
    if details is None:
        details = len(subs) == 1
    if details:
        for r in subs:
            out.append("")
            out.append(f"{r['student']}  ({_relative(r['submission']) or 'no file'})")
            rows = [[t["name"], f"{_num(t['earned'])}/{_num(t['points'])}", t["outcome"],
                     ("hidden" if t["hidden"] else ""), _first_line(t["message"], 90)] for t in r["tests"]]
            if rows:
                out.append(_table(rows, ["test", "points", "result", "", "message"], "lrlll"))
            if r["message"] and r["status"] != "ok":
                out.append(f"  {r['status']}: {_first_line(r['message'], 200)}")
    out.append("")
    rows = [[r["student"], _num(r["score"]), _num(r["max_score"]), f"{r['percent']:.1f}%", f"{r['passed']}/{r['total']}",
             r["status"], "; ".join(r["flags"])] for r in subs]
    out.append(_table(rows, ["student", "score", "max", "percent", "passed", "status", "flags"], "lrrrrll"))
    if len(subs) > 1 and report["tests"]:
        rates = []
        for t in report["tests"]:
            n = sum(any(x["name"] == t["name"] and x["outcome"] == "passed" for x in r["tests"]) for r in subs)
            rates.append((n / len(subs), t["name"]))
        hardest = sorted(rates)[:5]
        out.append("")
        out.append("hardest tests: " + ", ".join(f"{name} ({100 * rate:.0f}% passed)" for rate, name in hardest))
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Self-test (CI), self-check (notebooks), handout.
# --------------------------------------------------------------------------------------------

def self_test_submissions(lab: Lab) -> list:
    subs = [Submission("reference", lab.dir / "reference.py")]
    if (lab.dir / "solution.py").is_file():
        subs.append(Submission("solution", lab.dir / "solution.py"))
    subs.append(Submission("stubs", lab.dir / "student.py"))
    subs += [Submission(f"bug:{p.stem}", p) for p in lab.planted_bugs]
    return subs


def check_self_test(lab: Lab, report: dict) -> list:
    """Problems with a self-test report (empty when the grader proved it can pass and fail)."""
    problems = []
    by_name = {r["student"]: r for r in report["submissions"]}
    for name in ("reference", "solution"):
        r = by_name.get(name)
        if r is not None and (r["status"] != "ok" or r["score"] != r["max_score"] or not r["total"]):
            bad = [f"{t['name']} ({t['outcome']}: {t['message']})" for t in r["tests"] if t["outcome"] != "passed"]
            problems.append(f"{name} scored {r['percent']}% (status {r['status']}): {'; '.join(bad) or r['message']}")
    stubs = by_name["stubs"]
    if stubs["status"] != "ok" or stubs["score"] != 0 or not stubs["total"]:
        problems.append(f"untouched stubs: status {stubs['status']}, score {stubs['score']} (want ok and 0)")
    not_stub = [t["name"] for t in stubs["tests"] if t["outcome"] != "not implemented"]
    if not_stub:
        problems.append(f"stubs: tests that did not stop at NotImplementedError: {not_stub}")
    if len(lab.planted_bugs) < 2:
        problems.append(f"{lab.name} has {len(lab.planted_bugs)} planted bugs (want at least 2)")
    for p in lab.planted_bugs:
        r = by_name[f"bug:{p.stem}"]
        if r["status"] != "ok":
            problems.append(f"planted bug {p.stem}: status {r['status']} ({r['message']})")
        if r["score"] >= r["max_score"]:
            problems.append(f"planted bug {p.stem} lost no points")
        failed = {t["name"] for t in r["tests"] if t["outcome"] != "passed"}
        want = _planted_bug_expectations(p)
        if not want:
            problems.append(f"planted bug {p.stem}: no 'caught by:' line")
        missed = [t for t in want if not any(f == t or f.startswith(t + "[") for f in failed)]
        if missed:
            problems.append(f"planted bug {p.stem}: expected to fail {missed}, but they passed")
    return problems


def self_test(lab_dir, out=None, isolate: bool = False, quiet: bool = True, **kw) -> tuple:
    """Grade the reference, the worked solution, the untouched stubs and every planted bug.
    Returns ``(problems, report)``; no problems means the reference and solution score 100 %, the
    stubs 0 (every test stopped at NotImplementedError) and each planted bug loses points,
    including on the tests named in its ``caught by:`` line."""
    lab = Lab.open(lab_dir)
    report = grade(lab.dir, self_test_submissions(lab), out=out, isolate=isolate, quiet=quiet, **kw)
    return check_self_test(lab, report), report


def self_check(impl=None, lab_dir=None, hidden: bool = False, **kw) -> dict:
    """For the end of a lab notebook: grade this lab's implementation on the visible tests (the
    hidden ones too with hidden=True) and print the table. ``impl`` as in :func:`load_lab`."""
    lab_dir = Path(lab_dir if lab_dir is not None else Path.cwd()).resolve()
    path, label = _resolve_impl(impl, lab_dir)
    name = path.stem if path.parent == lab_dir else str(path)
    report = grade(lab_dir, [Submission(name, path)], visible_only=not hidden, quiet=True, **kw)
    print(format_report(report))
    return report


def handout(lab_dir, out) -> Path:
    """Copy what students get: the notebook with its outputs cleared, student.py, reference.py
    (for the notebook's reference switch), README.md and the visible grading tests. Withheld:
    the hidden tests, solution.py, planted_bugs/."""
    import nbformat

    lab = Lab.open(lab_dir)
    dest = Path(out) / lab.name
    dest.mkdir(parents=True, exist_ok=True)
    for nb_path in sorted(lab.dir.glob("*.ipynb")):
        nb = nbformat.read(nb_path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        nbformat.write(nb, dest / nb_path.name)
    for f in ["student.py", "reference.py", "README.md", *[p.name for p in lab.visible_files]]:
        if (lab.dir / f).is_file():
            shutil.copy(lab.dir / f, dest / f)
    return dest


# --------------------------------------------------------------------------------------------
# Command line.
# --------------------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m specdecode_ref.grading",
        description="Grade specdecode labs. Also: `handout LAB_DIR... --out DIR` copies what students get.",
        epilog="Default: grade the lab's own student.py. Reports go to OUT/<lab>/report.json and scores.csv.")
    p.add_argument("labs", nargs="+", help="lab folder(s), e.g. labs/lab01_rejection_sampler")
    p.add_argument("--submission", action="append", default=[], metavar="FILE",
                   help="a student's .py file (repeatable); named after the file, or its folder for student.py")
    p.add_argument("--submissions", metavar="DIR",
                   help="a folder with one NAME.py or NAME/ (holding student.py) per student")
    p.add_argument("--reference", action="store_true", help="grade the reference implementation")
    p.add_argument("--solution", action="store_true", help="grade the worked solution (solution.py)")
    p.add_argument("--self-test", action="store_true",
                   help="grade reference, solution, stubs and planted bugs (in one process: trusted code); "
                        "fail unless reference and solution score 100%%, the stubs 0 and every planted bug "
                        "loses points, including on the tests its 'caught by:' line names")
    p.add_argument("--out", metavar="DIR", help="report folder (default: grading_reports/)")
    p.add_argument("--visible-only", action="store_true", help="skip the hidden tests (a student's self-check)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per submission (default %(default)s)")
    p.add_argument("--test-timeout", type=float, default=DEFAULT_TEST_TIMEOUT,
                   help="seconds per test (default %(default)s)")
    p.add_argument("--jobs", type=int, default=1, help="submissions graded in parallel (default 1)")
    p.add_argument("--threads", type=int, default=1, help="torch/BLAS threads per submission (default 1)")
    p.add_argument("--no-isolate", action="store_true",
                   help="grade all submissions in one process (faster; only for trusted code)")
    p.add_argument("--details", action="store_true", help="print every test of every submission")
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_child"]:
        return _child_main(argv[1])
    if argv[:1] == ["handout"]:
        hp = argparse.ArgumentParser(prog="python -m specdecode_ref.grading handout",
                                     description="Copy what students get (notebook without outputs, student.py, "
                                                 "reference.py, visible tests) into OUT/<lab>/.")
        hp.add_argument("labs", nargs="+")
        hp.add_argument("--out", required=True)
        ha = hp.parse_args(argv[1:])
        for d in ha.labs:
            print(f"handout: {handout(d, ha.out)}")
        return 0
    args = _parser().parse_args(argv)
    out_root = Path(args.out or "grading_reports")
    status = 0
    kw = dict(test_timeout=args.test_timeout, timeout=args.timeout, jobs=args.jobs, threads=args.threads,
              visible_only=args.visible_only)
    for d in args.labs:
        lab = Lab.open(d)
        out = out_root / lab.name
        if args.self_test:
            problems, report = self_test(lab.dir, out=out, quiet=False, **kw)
            print(format_report(report, details=args.details))
            print(f"\nself-test {lab.name}: " + ("PASSED" if not problems else "FAILED\n  " + "\n  ".join(problems)))
            status |= bool(problems)
        else:
            subs = []
            if args.reference:
                subs.append(Submission("reference", lab.dir / "reference.py"))
            if args.solution:
                subs.append(Submission("solution", lab.dir / "solution.py"))
            for f in args.submission:
                fp = Path(f).resolve()
                if not fp.is_file():
                    raise SystemExit(f"--submission {f}: no such file")
                name = fp.parent.name if fp.name == "student.py" else fp.stem
                subs.append(Submission(name, fp))
            if args.submissions:
                subs += find_submissions(args.submissions, lab)
            if not subs:
                subs = [Submission("student.py", lab.dir / "student.py")]
            report = grade(lab.dir, subs, out=out, isolate=not args.no_isolate, **kw)
            print(format_report(report, details=True if args.details else None))
        print(f"\nreport: {out / 'report.json'}  {out / 'scores.csv'}  (elapsed {report['elapsed_s']} s)\n")
    return status


if __name__ == "__main__":
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        sys.path.pop(0)  # run as a script: do not expose the package's modules as top-level ones
    # Grading files import `specdecode_ref.grading`: give them this module, not a second copy.
    sys.modules.setdefault("specdecode_ref.grading", sys.modules[__name__])
    sys.exit(main())
