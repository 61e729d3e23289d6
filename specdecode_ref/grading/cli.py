"""The command line: ``python -m specdecode_ref.grading --help`` (``__main__.py`` calls :func:`main`)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .handouts import handout
from .labs import Lab, Submission, find_submissions
from .report import format_report
from .runner import DEFAULT_TEST_TIMEOUT, DEFAULT_TIMEOUT, WALL_FACTOR, grade
from .selftest import self_test


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
                   help="grade reference, solution, stubs, planted bugs and mutants (in one process: trusted "
                        "code) and the tamper attempts (one process each); fail unless reference and solution "
                        "score 100%%, the stubs 0, every planted bug and mutant loses points (including on the "
                        "tests its 'caught by:' line names) and every tamper attempt is caught")
    p.add_argument("--out", metavar="DIR", help="report folder (default: grading_reports/)")
    p.add_argument("--visible-only", action="store_true", help="skip the hidden tests (a student's self-check)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help=f"CPU seconds per submission, all its tests (default %(default)s; a submission that blocks "
                        f"is stopped at {WALL_FACTOR:g} times this on the wall clock)")
    p.add_argument("--test-timeout", type=float, default=DEFAULT_TEST_TIMEOUT,
                   help="CPU seconds per test (default %(default)s)")
    p.add_argument("--jobs", type=int, default=1, help="submissions graded in parallel (default 1)")
    p.add_argument("--threads", type=int, default=1, help="torch/BLAS threads per submission (default 1)")
    p.add_argument("--no-isolate", action="store_true",
                   help="grade all submissions in one process (faster; only for trusted code)")
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


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["handout"]:
        return _handout_main(argv[1:])
    args = _parser().parse_args(argv)
    out_root = Path(args.out or "grading_reports")
    status = 0
    kw = dict(test_timeout=args.test_timeout, timeout=args.timeout, jobs=args.jobs, threads=args.threads,
              visible_only=args.visible_only)
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
    return status
