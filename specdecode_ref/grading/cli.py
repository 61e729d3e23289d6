"""The command line: ``python -m specdecode_ref.grading --help`` (``__main__.py`` calls :func:`main`)."""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from .handouts import handout
from .labs import Lab, Submission, find_submissions
from .report import format_report
from .runner import DEFAULT_TEST_TIMEOUT, DEFAULT_TIMEOUT, DEFAULT_WALL_TIMEOUT, WALL_FACTOR, grade
from .sandbox import MODES
from .selftest import self_test


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m specdecode_ref.grading",
        description="Grade specdecode labs. Also: `handout LAB_DIR... --out DIR` (what students get), "
                    "`samples LAB_DIR... --out DIR` (three students' files with known grades), "
                    "`gradescope LAB_DIR... --out ZIP` (a Gradescope autograder), `gradescope-try ZIP --submission "
                    "FILE...` (that zip run locally as Gradescope runs it), `gradebook REPORTS... --out CSV` (the "
                    "class's grade book); each has its own --help.",
        epilog="Default: grade the lab's own student.py. Reports go to OUT/<lab>/report.json and scores.csv.")
    p.add_argument("labs", nargs="+", help="lab folder(s), e.g. labs/lab01_rejection_sampler")
    p.add_argument("--submission", action="append", default=[], metavar="FILE",
                   help="a student's .py file (repeatable); named after the file, or its folder for student.py")
    p.add_argument("--submissions", metavar="DIR",
                   help="a folder with one NAME.py or NAME/ (holding student.py) per student")
    p.add_argument("--reference", action="store_true", help="grade the reference implementation")
    p.add_argument("--solution", action="store_true", help="grade the worked solution (solution.py)")
    p.add_argument("--self-test", action="store_true",
                   help="grade reference, solution, stubs, planted bugs and mutants (in one process: trusted "
                        "code) and the tamper attempts (one judging process each); fail unless reference and solution "
                        "score 100%%, the stubs 0, every planted bug and mutant loses points (including on the "
                        "tests its 'caught by:' line names) and every tamper attempt scores 0 without seeing a hidden test")
    p.add_argument("--out", metavar="DIR", help="report folder (default: grading_reports/)")
    p.add_argument("--visible-only", action="store_true", help="skip the hidden tests (a student's self-check)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help="CPU seconds of the judging process per submission, all its tests (default %(default)s)")
    p.add_argument("--wall-timeout", type=float, default=DEFAULT_WALL_TIMEOUT,
                   help="wall-clock seconds per submission, the hard stop (default %(default)s)")
    p.add_argument("--isolation", choices=MODES,
                   help="how the submission's code is isolated (default: the strongest this machine allows; "
                        "see labs/README.md)")
    p.add_argument("--test-timeout", type=float, default=DEFAULT_TEST_TIMEOUT,
                   help=f"CPU seconds per test on each side (default %(default)s; a test that blocks is stopped at "
                        f"{WALL_FACTOR:g} times this on the wall clock)")
    p.add_argument("--jobs", type=int, default=1, help="submissions graded in parallel (default 1)")
    p.add_argument("--threads", type=int, default=1, help="torch/BLAS threads per submission (default 1)")
    p.add_argument("--no-isolate", action="store_true",
                   help="grade all submissions in one judging process (each still runs in its own student side)")
    p.add_argument("--details", action="store_true", help="print every test of every submission")
    return p


def _handout_main(argv: list) -> int:
    hp = argparse.ArgumentParser(prog="python -m specdecode_ref.grading handout",
                                 description="Copy what students get (notebook without outputs, student.py, "
                                             "reference.py, visible tests) into OUT/<lab>/.")
    hp.add_argument("labs", nargs="+")
    hp.add_argument("--out", required=True)
    ha = hp.parse_args(argv)
    for d in ha.labs:
        print(f"handout: {handout(d, ha.out)}")
    return 0


def _gradescope_main(argv: list) -> int:
    import json
    import zipfile

    from .autograder import build_autograder

    gp = argparse.ArgumentParser(prog="python -m specdecode_ref.grading gradescope",
                                 description="Build each lab's Gradescope autograder zip (setup.sh, run_autograder, "
                                             "the grader and the lab's tests).")
    gp.add_argument("labs", nargs="+")
    gp.add_argument("--out", required=True, help="the zip (one lab), or a folder for labNN_autograder.zip files")
    gp.add_argument("--test-timeout", type=float, default=DEFAULT_TEST_TIMEOUT, help="CPU seconds per test")
    gp.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="CPU seconds per submission")
    gp.add_argument("--wall-timeout", type=float, default=DEFAULT_WALL_TIMEOUT,
                    help="wall-clock seconds for one upload, below Gradescope's run limit (default %(default)s)")
    gp.add_argument("--allow-dirty", action="store_true",
                    help="build from the working tree's files where they differ from the commit (HEAD), untracked "
                         "grading files of the lab included; the zip names each difference (course/DIRTY.txt, "
                         "autograder.json's dirty, built_from ending in -dirty)")
    ga = gp.parse_args(argv)
    if len(ga.labs) > 1 and ga.out.endswith(".zip"):
        raise SystemExit("several labs: give --out a folder (each lab gets its labNN_autograder.zip)")
    for d in ga.labs:
        path = build_autograder(d, ga.out, test_timeout=ga.test_timeout, timeout=ga.timeout,
                                wall_timeout=ga.wall_timeout, allow_dirty=ga.allow_dirty)
        with zipfile.ZipFile(path) as zf:
            config = json.loads(zf.read("course/autograder.json"))
        print(f"autograder: {path} ({path.stat().st_size / 1e6:.1f} MB; {config['lab']}, "
              f"{config['max_score']:g} points: set the Gradescope assignment to this total; "
              f"{config['gradescope_timeout_hint']})")
    return 0


def _upload_name(path: Path) -> str:
    """A student's name from their file or folder, as --submission names it."""
    return path.parent.name if path.name == "student.py" else path.stem if path.is_file() else path.name


def _gradescope_try_main(argv: list) -> int:
    import json

    from .autograder import try_autograder
    from .report import table

    tp = argparse.ArgumentParser(prog="python -m specdecode_ref.grading gradescope-try",
                                 description="Run an autograder zip as Gradescope does, in a fresh folder laid out "
                                             "like /autograder: setup.sh once, then run_autograder per submission.")
    tp.add_argument("zip")
    tp.add_argument("--submission", action="append", required=True, metavar="FILE",
                    help="a student's file (uploaded as student.py) or folder (repeatable)")
    tp.add_argument("--root", help="the folder that plays /autograder (default: a new temporary folder)")
    tp.add_argument("--compare", metavar="REPORT",
                    help="the local grader's report.json for the same students: print its points beside "
                         "Gradescope's and fail unless every student's points and status agree")
    ta = tp.parse_args(argv)
    uploads = [Path(f).resolve() for f in ta.submission]
    local = {}
    if ta.compare:
        local = {r["student"]: r for r in json.loads(Path(ta.compare).read_text())["submissions"]}
    root, results = try_autograder(ta.zip, uploads, root=ta.root)
    rows, disagree = [], []
    for up, r in zip(uploads, results):
        extra = r.get("extra_data", {})
        name = _upload_name(up)
        row = [name, f"{r['score']:g}", f"{extra.get('max_score', 0):g}", extra.get("status", ""),
               f"{sum(t['visibility'] == 'visible' for t in r['tests'])} visible, "
               f"{sum(t['visibility'] != 'visible' for t in r['tests'])} hidden"]
        if ta.compare:
            loc = local.get(name)
            same = loc is not None and loc["score"] == r["score"] and loc["status"] == extra.get("status")
            row += [f"{loc['score']:g} ({loc['status']})" if loc else "not in the report", "yes" if same else "NO"]
            if not same:
                disagree.append(name)
        rows.append(row)
    header = ["submission", "score", "max", "status", "tests"] + (["local grader", "same"] if ta.compare else [])
    print(table(rows, header, "lrrll" + ("ll" if ta.compare else "")))
    print(f"\nresults: {root}/results/results.json (the last submission's); setup log: {root}/setup.log")
    if disagree:
        print(f"Gradescope and the local grader disagree on: {', '.join(disagree)}")
    return 1 if disagree else 0


def _gradebook_main(argv: list) -> int:
    from .gradebook import write_gradebook

    bp = argparse.ArgumentParser(prog="python -m specdecode_ref.grading gradebook",
                                 description="One CSV for the class: a row per student, a column per lab (percent).")
    bp.add_argument("reports", nargs="+", help="report folders (what --out wrote) or report.json files")
    bp.add_argument("--out", required=True, help="the CSV file")
    ba = bp.parse_args(argv)
    print(f"gradebook: {write_gradebook(ba.reports, ba.out)}")
    return 0


def _autograde_main(argv: list) -> int:
    from .gradescope import autograde

    ap = argparse.ArgumentParser(prog="python -m specdecode_ref.grading autograde",
                                 description="Inside Gradescope's container (run_autograder calls it).")
    ap.add_argument("--config", required=True)
    ap.add_argument("--submission-dir", required=True)
    ap.add_argument("--results", required=True)
    aa = ap.parse_args(argv)
    autograde(aa.config, aa.submission_dir, aa.results)  # writes results.json whatever fails
    return 0


def _samples_main(argv: list) -> int:
    from .selftest import sample_submissions

    sp = argparse.ArgumentParser(prog="python -m specdecode_ref.grading samples",
                                 description="Three students' files with known grades (correct.py, buggy.py, "
                                             "tampering.py) per lab, in OUT/<student>/<lab>/student.py, to try the "
                                             "grading path on before the class hands in.")
    sp.add_argument("labs", nargs="+")
    sp.add_argument("--out", required=True)
    sa = sp.parse_args(argv)
    for d in sa.labs:
        lab = Lab.open(d)
        with tempfile.TemporaryDirectory() as tmp:
            for name, path in sample_submissions(lab.dir, tmp).items():
                dest = Path(sa.out) / Path(name).stem / lab.name / "student.py"
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, dest)
                print(f"samples: {dest}")
    return 0


SUBCOMMANDS = {"handout": _handout_main, "samples": _samples_main, "gradescope": _gradescope_main, "gradescope-try": _gradescope_try_main,
               "gradebook": _gradebook_main, "autograde": _autograde_main}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in SUBCOMMANDS:
        return SUBCOMMANDS[argv[0]](argv[1:])
    args = _parser().parse_args(argv)
    out_root = Path(args.out or "grading_reports")
    status = 0
    kw = dict(test_timeout=args.test_timeout, timeout=args.timeout, jobs=args.jobs, threads=args.threads,
              visible_only=args.visible_only, wall_timeout=args.wall_timeout, isolation=args.isolation)
    labs = [Lab.open(d) for d in args.labs]
    for lab in labs:
        out = out_root / lab.name
        if args.self_test:
            problems, report = self_test(lab.dir, out=out, quiet=False, **kw)
            print(format_report(report, details=args.details))
            print(f"\nself-test {lab.name}: " + ("PASSED" if not problems else "FAILED\n  " + "\n  ".join(problems)))
            status |= bool(problems)
        else:
            subs = []
            if args.reference:
                subs.append(Submission("reference", lab.dir / "reference.py", role="reference"))
            if args.solution:
                subs.append(Submission("solution", lab.dir / "solution.py", role="solution"))
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
            report = grade(lab.dir, subs, out=out, isolate=not args.no_isolate,
                           other_labs=[o for o in labs if o is not lab], **kw)
            print(format_report(report, details=True if args.details else None))
        print(f"\nreport: {out / 'report.json'}  {out / 'scores.csv'}  (elapsed {report['elapsed_s']} s)\n")
    if len(labs) > 1 and not args.self_test and not args.visible_only:
        from .gradebook import write_gradebook

        try:
            print(f"class gradebook (a column per lab graded into {out_root}): "
                  f"{write_gradebook([out_root], out_root / 'gradebook.csv')}")
        except SystemExit as e:  # e.g. an older report in the same folder: the labs' reports stand
            print(f"no class gradebook: {e}")
    return status
