"""The self-test: the grader proves, for each lab, that it can pass and fail.

It grades the reference and the worked solution (must score 100 %), the untouched stubs (0, each
test stopped at NotImplementedError), every planted bug and mutant (each loses points on the
tests its docstring names, and no more than its ``at most:`` share), and the attacks in
``tamper_attempts/`` appended to the stubs: each must score the stubs' honest 0, and no test
message may carry a line of a hidden test. Attacks that work by reading files (``needs: hidden
files``) can only be stopped where the sandbox hides them; in a mode that does not (see
sandbox.py), the self-test says so instead of failing. The trusted files share one judging
process; each attack gets its own, as a student's file would.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from .labs import Lab, Submission, expectations
from .runner import grade

TAMPER_DIR = Path(__file__).resolve().parent / "tamper_attempts"


def tamper_attempts() -> list:
    """The files in ``tamper_attempts/``: each a piece of code that tries to change a grade."""
    return sorted(TAMPER_DIR.glob("*.py"))


def _write_tamper_submissions(lab: Lab, folder: Path) -> list:
    """Each tamper attempt appended to the lab's untouched stubs (an honest score of 0)."""
    subs = []
    for attempt in tamper_attempts():
        path = folder / f"{attempt.stem}.py"
        path.write_text(tampering_file(lab, attempt))
        subs.append(Submission(f"tamper:{attempt.stem}", path, role="tamper attempt"))
    return subs


def tampering_file(lab: Lab, attempt: Path) -> str:
    """A tamper attempt appended to the lab's untouched stubs (an honest score of 0)."""
    stubs = (lab.dir / "student.py").read_text()
    return f"{stubs}\n\n# ---- {attempt.name}: a try at changing the grade ----\n{attempt.read_text()}"


def sample_submissions(lab_dir, out) -> dict:
    """Three students' files whose grades are known, for trying the whole grading path as an
    instructor would: ``correct.py`` (the worked solution: 100 %), ``buggy.py`` (the first planted
    bug, written out as one file: loses the points its docstring names) and ``tampering.py`` (the
    stubs plus code that rewrites pytest's collected tests into no-ops: 0 points, the stubs' honest
    score). Written into ``out``;
    returns {name: path}."""
    from .mutation import as_one_file

    lab = Lab.open(lab_dir)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = {"correct.py": (lab.dir / "solution.py").read_text(), "buggy.py": as_one_file(lab.planted_bugs[0]),
             "tampering.py": tampering_file(lab, TAMPER_DIR / "rewrite_test_objects.py")}
    paths = {}
    for name, text in files.items():
        paths[name] = out / name
        paths[name].write_text(text)
    return paths


def self_test_submissions(lab: Lab) -> list:
    subs = [Submission("reference", lab.dir / "reference.py", role="reference")]
    if (lab.dir / "solution.py").is_file():
        subs.append(Submission("solution", lab.dir / "solution.py", role="solution"))
    subs.append(Submission("stubs", lab.dir / "student.py", role="stubs"))
    subs += [Submission(f"bug:{p.stem}", p, role="planted bug") for p in lab.planted_bugs]
    subs += [Submission(f"mutant:{p.stem}", p, role="mutant") for p in lab.mutants]
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
    for kind, paths in (("bug", lab.planted_bugs), ("mutant", lab.mutants)):
        for p in paths:
            label = f"{'planted bug' if kind == 'bug' else 'mutant'} {p.stem}"
            r = by_name[f"{kind}:{p.stem}"]
            if r["status"] != "ok":
                problems.append(f"{label}: status {r['status']} ({r['message']})")
            if r["score"] >= r["max_score"]:
                problems.append(f"{label} lost no points")
            failed = {t["name"] for t in r["tests"] if t["outcome"] != "passed"}
            want, at_most = expectations(p)
            if not want:
                problems.append(f"{label}: no 'caught by:' line")
            missed = [t for t in want if not any(f == t or f.startswith(t + "[") or f.endswith("::" + t)
                                                 or f.split("::")[-1].startswith(t + "[") for f in failed)]
            if missed:
                problems.append(f"{label}: expected to fail {missed}, but they passed")
            if at_most is not None and r["percent"] > at_most:
                problems.append(f"{label} kept {r['percent']}% of the points (at most {at_most:g}% allowed)")
    hidden_lines = {line.strip() for f in lab.hidden_files for line in f.read_text().splitlines()
                    if line.strip().startswith(("def test_", '"""')) and len(line.strip()) > 12}
    readable = (report.get("isolation") or {}).get("readable_secrets")
    for r in report["submissions"]:
        if r.get("role") != "tamper attempt":
            continue
        attempt = TAMPER_DIR / f"{r['student'].split(':', 1)[-1]}.py"
        if readable and attempt.is_file() and "needs: hidden files" in attempt.read_text():
            continue  # this mode cannot hide files (the report's isolation says so)
        if r["score"] != 0:
            problems.append(f"{r['student']} changed its grade: status {r['status']}, score {r['score']} (want 0)")
        leaked = [t["name"] for t in r["tests"] if any(line in t.get("message", "") for line in hidden_lines)]
        if leaked:
            problems.append(f"{r['student']} showed a hidden test's text in the messages of {leaked[:3]}")
    return problems


def self_test(lab_dir, out=None, isolate: bool = False, quiet: bool = True, tamper: bool = True, **kw) -> tuple:
    """Grade the reference, the worked solution, the untouched stubs, every planted bug and
    mutant, and (with ``tamper``) the tamper attempts. Returns ``(problems, report)``; no problems
    means every expectation of :func:`check_self_test` holds."""
    lab = Lab.open(lab_dir)
    with tempfile.TemporaryDirectory(prefix="specdecode-tamper-") as tmp:
        subs = self_test_submissions(lab) + (_write_tamper_submissions(lab, Path(tmp)) if tamper else [])
        report = grade(lab.dir, subs, out=out, isolate=isolate, quiet=quiet, **kw)
    return check_self_test(lab, report), report
