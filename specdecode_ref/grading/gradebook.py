"""The class's grade book: one CSV with a row per student and a column per lab (percent), from
the reports of several labs (each lab's ``report.json``, as ``python -m specdecode_ref.grading``
writes them), ready to import into a spreadsheet or a learning platform's grade book.

A cell is the lab's percent as the report gives it (0 for a missing or wrong-lab
submission), or empty when the student is not in that lab's report at all. The last column,
``notes``, says why a cell is 0 or empty, lab by lab, so nothing needs looking up in the reports.
The reference, the worked solution and the self-test's own files are not students: left out.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path


def find_reports(paths) -> list:
    """The report.json files under ``paths`` (a report, a lab's report folder, or a folder of
    them, as written by ``--out``), in lab order."""
    found = []
    for p in map(Path, paths):
        if p.is_file():
            found.append(p)
        elif (p / "report.json").is_file():
            found.append(p / "report.json")
        elif p.is_dir():
            found += sorted(p.glob("*/report.json"))
        else:
            raise SystemExit(f"{p}: no such file or folder")
    if not found:
        raise SystemExit(f"no report.json under {', '.join(map(str, paths))}: grade the labs with --out first")
    return found


def gradebook(paths) -> tuple:
    """(header, rows) of the class's grade book from the reports under ``paths``."""
    labs, by_student = [], {}
    for path in find_reports(paths):
        report = json.loads(path.read_text())
        lab = report.get("lab")
        if not lab or "submissions" not in report:
            raise SystemExit(f"{path}: not a grading report (no 'lab' or 'submissions')")
        if lab in labs:
            raise SystemExit(f"two reports for {lab} (the second is {path}): give one report per lab")
        if report.get("visible_only"):
            raise SystemExit(f"{path}: graded with --visible-only, so its percents leave out the hidden tests")
        labs.append(lab)
        for rec in report["submissions"]:
            if rec.get("role", "student") != "student":
                continue
            row = by_student.setdefault(rec["student"], {"notes": []})
            if lab in row:
                raise SystemExit(f"{path}: {rec['student']} appears twice")
            row[lab] = rec["percent"]
            if rec["status"] != "ok":
                row["notes"].append(f"{lab}: {rec['status']}")
    labs.sort()
    header = ["student", *labs, "notes"]
    rows = []
    for student in sorted(by_student):
        row = by_student[student]
        notes = list(row["notes"]) + [f"{lab}: not graded" for lab in labs if lab not in row]
        rows.append([student, *[row.get(lab, "") for lab in labs], "; ".join(sorted(notes))])
    return header, rows


def write_gradebook(paths, out) -> Path:
    """Write the grade book of the reports under ``paths`` to the CSV file ``out``."""
    header, rows = gradebook(paths)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return out
