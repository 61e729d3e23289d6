"""Gradescope's side of grading: one submission graded inside the autograder's container, and
its report written as Gradescope's ``results.json``.

Gradescope unpacks an autograder zip into ``/autograder/source``, puts the student's upload in
``/autograder/submission``, runs ``/autograder/run_autograder`` and reads
``/autograder/results/results.json`` (the format is documented in Gradescope's "Autograder
Specifications"). ``run_autograder`` calls :func:`autograde`, which grades with the same runner
as ``python -m specdecode_ref.grading``: the tests run in the judging process, the upload runs
as an unprivileged user of its own in a student side that cannot see the lab's files, the
upload folder or ``results/``, and every process of that user is killed before results.json is
written. So a submission earns the same points on Gradescope as when the instructor grades it
locally, and nothing it starts outlives the grading to rewrite them.

What a student sees: every visible test with its description and (bounded) failure message; the
hidden tests' names and outcomes, never their messages, when the instructor publishes the
grades (Gradescope hides the total while any test is hidden). The summary says why a submission
scored nothing or less than its tests' points (timeout, crashed, load error, missing, wrong lab).
The grader's own table, with the instructor's flags and any evidence of an attack, goes to
stdout and extra_data, which only instructors see. A failure of the grader itself still writes
results.json: 0 points and one sentence, the reason for the instructor.
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from .labs import Lab, Submission, find_upload

# Gradescope's documented fields (Autograder Specifications, "Output format").
VISIBILITIES = ("hidden", "after_due_date", "after_published", "visible")
FORMATS = ("text", "html", "simple_format", "md", "ansi")
TEST_STATUSES = ("passed", "failed")
TOP_FIELDS = {"score": "number", "execution_time": "number", "output": "string", "output_format": FORMATS,
              "test_output_format": FORMATS, "test_name_format": FORMATS, "visibility": VISIBILITIES,
              "stdout_visibility": VISIBILITIES, "extra_data": "object", "tests": "list", "leaderboard": "list"}
TEST_FIELDS = {"score": "number", "max_score": "number", "status": TEST_STATUSES, "name": "string",
               "name_format": FORMATS, "number": "string", "output": "string", "output_format": FORMATS,
               "tags": "strings", "visibility": VISIBILITIES, "extra_data": "object"}
HIDDEN_TESTS_SHOWN = "after_published"  # hidden tests: shown when the instructor publishes the grades

# Why a submission's tests did not all run, in the words a student reads.
STATUS_WORDS = {
    "grader error": "the grader could not grade this upload; your instructor can see why",
    "timeout": "the grading ran out of time; the tests that finished before keep their points, the rest score 0",
    "crashed": "the grading process died; the tests that finished before keep their points, the rest score 0",
    "load error": "your file could not be imported, so no test could run",
    "missing": "no file to grade was found in the upload",
    "wrong lab": "the uploaded file is not a submission for this lab",
    "ambiguous": "the uploaded file defines the functions of several labs alike",
}


class AutograderError(RuntimeError):
    """The grading itself failed (not the student's code): results.json then holds 0 points and
    one sentence for the student, and the reason for the instructor (extra_data and stdout)."""


def _check(value, kind) -> str | None:
    if isinstance(kind, tuple):
        return None if value in kind else f"must be one of {', '.join(kind)}, not {value!r}"
    ok = {"number": isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
          "string": isinstance(value, str), "object": isinstance(value, dict), "list": isinstance(value, list),
          "strings": isinstance(value, list) and all(isinstance(v, str) for v in value)}[kind]
    return None if ok else f"must be a {'finite number' if kind == 'number' else kind}, not {type(value).__name__}"


def validate_results(results: dict) -> list:
    """Problems with a ``results.json`` against Gradescope's documented fields (empty if none):
    only documented keys, each of its type or one of its documented values, and a score on the
    submission or on every test."""
    if not isinstance(results, dict):
        return ["results.json must hold a JSON object"]
    problems = []
    for key, value in results.items():
        if key not in TOP_FIELDS:
            problems.append(f"unknown top-level field {key!r}")
        elif (why := _check(value, TOP_FIELDS[key])) is not None:
            problems.append(f"{key} {why}")
    tests = results.get("tests", [])
    for i, test in enumerate(tests if isinstance(tests, list) else []):
        if not isinstance(test, dict):
            problems.append(f"tests[{i}] must be an object")
            continue
        for key, value in test.items():
            if key not in TEST_FIELDS:
                problems.append(f"tests[{i}]: unknown field {key!r}")
            elif (why := _check(value, TEST_FIELDS[key])) is not None:
                problems.append(f"tests[{i}].{key} {why}")
    if "score" not in results and not (isinstance(tests, list) and tests
                                       and all(isinstance(t, dict) and "score" in t for t in tests)):
        problems.append("a score is required on the submission or on every test")
    return problems


def _num(x: float):
    return int(x) if float(x).is_integer() else round(float(x), 4)


MESSAGE_LIMIT = 300  # characters of a visible test's failure message a student sees
GRADER_FAILED = ("The grader could not grade this upload (the failure was the grader's, not your code's): "
                 "it scores 0 for now, and your instructor can see what went wrong.")


def _bounded(text: str, limit: int = MESSAGE_LIMIT) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _test_output(test: dict, status: str) -> str:
    """What a student reads under one test: the test's own description and its outcome; for a
    visible test the failure message too (bounded), for a hidden one never (its messages name the
    edge cases it checks)."""
    doc = test.get("doc", "")
    lines = [doc] if doc else []
    outcome, message = test["outcome"], test.get("message", "")
    if outcome == "passed":
        lines.append("passed")
    elif outcome == "not implemented":
        lines.append("not implemented: the function still raises NotImplementedError")
    elif test.get("hidden"):
        lines.append(outcome)
    else:
        lines.append(f"{outcome}: {_bounded(message)}" if message else outcome)
    return "\n".join(lines)


def _summary(report: dict, rec: dict) -> str:
    visible = [t for t in rec["tests"] if not t["hidden"]]
    hidden = [t for t in rec["tests"] if t["hidden"]]
    lines = [f"{report['lab']}: graded by the course's grader."]
    if rec["status"] != "ok":
        lines.append(f"Status: {rec['status']}: {STATUS_WORDS.get(rec['status'], rec['status'])}.")
        if rec["status"] in ("load error", "missing", "wrong lab", "ambiguous") and rec.get("message"):
            lines.append(_bounded(rec["message"], 600))
    if visible:
        earned = sum(t["earned"] for t in visible)
        lines.append(f"Visible tests: {_num(earned)} of {_num(sum(t['points'] for t in visible))} points, "
                     f"{sum(t['outcome'] == 'passed' for t in visible)} of {len(visible)} tests passed.")
    if hidden:
        lines.append(f"{len(hidden)} hidden tests ({_num(sum(t['points'] for t in hidden))} points) check the edge "
                     "cases the docstrings list: their results, and your total, appear when grades are published.")
    return "\n".join(lines)


def results_json(report: dict, index: int = 0) -> dict:
    """Gradescope's results.json for one submission of a grader report: one entry per test with
    its points, the hidden tests shown only once grades are published, a summary for the student,
    and the grader's record (flags, evidence, how it was isolated) in ``extra_data``."""
    rec = report["submissions"][index]
    tests = []
    for t in rec["tests"]:
        tests.append({"name": t["name"], "score": _num(float(t["earned"])), "max_score": _num(t["points"]),
                      "status": "passed" if t["outcome"] == "passed" else "failed",
                      "visibility": HIDDEN_TESTS_SHOWN if t["hidden"] else "visible",
                      "output": _test_output(t, rec["status"])})
    return {
        "score": _num(sum(t["score"] for t in tests)),
        "execution_time": _num(round(float(rec.get("duration_s", 0.0)), 1)),
        "output": _summary(report, rec),
        "output_format": "text", "test_output_format": "text",
        "stdout_visibility": "hidden",  # the grader's table names the instructor's flags
        "extra_data": {"lab": report["lab"], "status": rec["status"], "score": _num(rec["score"]),
                       "max_score": _num(rec["max_score"]), "percent": rec["percent"], "flags": rec["flags"],
                       "evidence": rec.get("evidence", []), "isolation": rec.get("isolation", {})},
        "tests": tests,
    }


def failed_results(config: dict | None, why: str) -> dict:
    """The results.json of an upload the grader itself failed on: every test at 0, one sentence for
    the student, the reason for the instructor."""
    tests = [{"name": t["name"], "score": 0, "max_score": _num(t["points"]), "status": "failed",
              "visibility": HIDDEN_TESTS_SHOWN if t.get("hidden") else "visible", "output": "not graded"}
             for t in (config or {}).get("tests", [])]
    return {"score": 0, "output": GRADER_FAILED, "output_format": "text", "stdout_visibility": "hidden",
            "extra_data": {"lab": (config or {}).get("lab", ""), "status": "grader error", "error": why[-4000:]},
            "tests": tests}


def _write(results_path: Path, results: dict) -> None:
    """Write results.json in one step (a reader never sees half of it)."""
    results_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = results_path.with_name(results_path.name + ".part")
    tmp.write_text(json.dumps(results, indent=1))
    os.replace(tmp, results_path)


def autograde(config_path, submission_dir, results_path, quiet: bool = False) -> dict:
    """What run_autograder runs: grade the upload in ``submission_dir`` for the lab named in the
    autograder's ``config_path`` (autograder.json), write ``results_path`` and return it. Whatever
    fails, a results.json is written (the grader's own failure as 0 points and one sentence)."""
    results_path = Path(results_path)
    config = None
    try:
        config = json.loads(Path(config_path).read_text())
        results = _autograde(Path(config_path), config, Path(submission_dir), results_path, quiet)
    except BaseException as exc:  # noqa: BLE001 - the student must get a results.json whatever happened
        import traceback

        if isinstance(exc, KeyboardInterrupt):
            raise
        why = "".join(traceback.format_exception(exc))
        print(f"autograder error:\n{why}")
        results = failed_results(config, why)
    _write(results_path, results)
    return results


def _autograde(config_path: Path, config: dict, submission_dir: Path, results_path: Path, quiet: bool) -> dict:
    from .report import format_report
    from .runner import grade

    lab = Lab.open(config_path.parent / config["lab_dir"])
    found, note = find_upload(submission_dir, lab) if submission_dir.is_dir() else (None, "no upload")
    sub = Submission("submission", found, note)
    t0 = time.perf_counter()
    report = grade(lab.dir, [sub], out=None, test_timeout=config["test_timeout"], timeout=config["timeout"],
                   wall_timeout=config.get("wall_timeout", 480.0), threads=config.get("threads", 1), quiet=True,
                   apis=config.get("lab_apis"))
    rec = report["submissions"][0]
    if rec["status"] == "grader error":
        raise AutograderError(f"the lab's grading tests failed to load: {rec['message']}")
    if not rec["tests"] and config.get("tests"):  # not graded (missing, wrong lab): every test at 0
        rec["tests"] = [dict(t, outcome=rec["status"], earned=0.0, message="") for t in config["tests"]]
        rec["max_score"] = sum(t["points"] for t in rec["tests"])
    results = results_json(report)
    results["execution_time"] = _num(round(time.perf_counter() - t0, 1))
    problems = validate_results(results)
    if problems:
        raise AutograderError("results.json does not follow Gradescope's format: " + "; ".join(problems))
    if not quiet:  # Gradescope keeps stdout for the instructor
        print(format_report(report, details=True))
        print(f"\nresults.json: {_num(results['score'])} of {_num(rec['max_score'])} points, status {rec['status']}, "
              f"isolation {rec.get('isolation', {}).get('mode')}")
    return results
