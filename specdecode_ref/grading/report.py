"""The report an instructor collects: ``report.json``, ``scores.csv`` and the printed tables."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

CHECK_ROLES = ("reference", "solution", "stubs")  # the self-test's own files: not part of a class
MISTAKE_ROLES = ("planted bug", "mutant", "tamper attempt")
PLAUSIBLE_CHANCE = 1e-6  # failures less likely than this for a correct submission are not flagged as chance


def chance_of_failing(tests: list) -> float:
    """The probability that a correct submission fails at least one of ``tests`` by chance
    (their ``chance`` fields, taken as independent)."""
    keep = 1.0
    for t in tests:
        keep *= 1.0 - float(t.get("chance", 0.0))
    return 1.0 - keep


def _chance_note(rec: dict) -> None:
    """Per submission: how likely a correct submission loses points by chance in the tests it
    ran, and a flag when every test it failed is a statistical one."""
    rec["chance"] = chance_of_failing([t for t in rec["tests"] if t["outcome"] not in ("not run",)])
    failed = [t for t in rec["tests"] if t["outcome"] != "passed"]
    if rec["status"] == "ok" and failed and all(t.get("chance", 0.0) > 0 for t in failed):
        p = math.prod(t["chance"] for t in failed)
        if p >= PLAUSIBLE_CHANCE:  # one statistical test, typically: worth a second look
            rec["flags"].append(f"could be chance: a correct submission fails "
                                f"{'this test' if len(failed) == 1 else 'these tests'} with probability {_prob(p)}; "
                                "regrade it with other seeds before deducting")


def finish_report(lab, records: list, files: list, visible_only: bool, started: str, elapsed: float) -> dict:
    template = next(([{k: t[k] for k in ("name", "file", "points", "hidden", "doc", "chance")} for t in r["tests"]]
                     for r in records if r["tests"] and r["status"] in ("ok", "load error")), None)
    if template:  # submissions that produced no results still list every test, with 0 points
        for r in records:
            if not r["tests"]:
                r["tests"] = [dict(t, outcome=r["status"], earned=0.0, message="") for t in template]
                r["max_score"] = sum(t["points"] for t in r["tests"])
                r["total"] = len(r["tests"])
    for r in records:
        _chance_note(r)
    tests = template or []
    return {
        "lab": lab.name, "lab_dir": str(lab.dir), "generated_at": started,
        "grading_files": [f.name for f in files], "visible_only": visible_only,
        "max_score": sum(t["points"] for t in tests),
        "chance": chance_of_failing(tests),
        "tests": tests, "submissions": records, "elapsed_s": round(elapsed, 1),
    }


def write_report(report: dict, out) -> tuple:
    """Write ``report.json`` and ``scores.csv`` into ``out``; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    jpath, cpath = out / "report.json", out / "scores.csv"
    jpath.write_text(json.dumps(report, indent=1))
    names = [t["name"] for t in report["tests"]]
    with open(cpath, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "status", "score", "max_score", "percent", "passed", "total", "chance", "flags",
                    "submission", *names])
        for r in report["submissions"]:
            earned = {t["name"]: t["earned"] for t in r["tests"]}
            w.writerow([r["student"], r["status"], _num(r["score"]), _num(r["max_score"]), r["percent"], r["passed"],
                        r["total"], f"{r['chance']:.2g}", "; ".join(r["flags"]), r["submission"],
                        *[_num(earned.get(n, 0.0)) for n in names]])
    return jpath, cpath


def _num(x: float):
    return int(x) if float(x).is_integer() else round(x, 2)


def _prob(p: float) -> str:
    return "0" if p == 0 else f"{p:.1g}" if p < 0.01 else f"{100 * p:.1f} %"


def _first_line(text: str, limit: int) -> str:
    text = " ".join(str(text).strip().split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _relative(path: str) -> str:
    try:
        return str(Path(path).relative_to(Path.cwd())) if path else path
    except ValueError:
        return path


def table(rows: list, header: list, align: str) -> str:
    """A plain-text table; align has one letter per column, l(eft) or r(ight)."""
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(r):
        return "  ".join(c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(r, widths, align)).rstrip()

    return "\n".join([line(cells[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in cells[1:]])


def _who(subs: list) -> str:
    students = [r for r in subs if r.get("role", "student") == "student"]
    parts = [f"{len(students)} submission(s)"] if students or len(subs) == len(students) else []
    for role in CHECK_ROLES:
        if any(r.get("role") == role for r in subs):
            parts.append(role)
    for role in MISTAKE_ROLES:
        n = sum(r.get("role") == role for r in subs)
        if n:
            parts.append(f"{n} {role}{'s' if n > 1 else ''}")
    return ", ".join(parts)


def format_report(report: dict, details: bool | None = None) -> str:
    """The score table (and, for a single submission or with details=True, a per-test table)."""
    subs = report["submissions"]
    out = [f"{report['lab']}: {_who(subs)}; {_num(report['max_score'])} points"
           + (" (visible tests only)" if report.get("visible_only") else "")]
    if report.get("chance"):
        out.append(f"statistical tests: a correct submission fails one of them by chance with probability "
                   f"{_prob(report['chance'])} (P(chance): over the tests each submission ran)")
    if details is None:
        details = len(subs) == 1
    if details:
        for r in subs:
            out.append("")
            out.append(f"{r['student']}  ({_relative(r['submission']) or 'no file'})")
            rows = [[t["name"], f"{_num(t['earned'])}/{_num(t['points'])}", t["outcome"],
                     ("hidden" if t["hidden"] else ""), _first_line(t["message"], 90)] for t in r["tests"]]
            if rows:
                out.append(table(rows, ["test", "points", "result", "", "message"], "lrlll"))
            if r["message"] and r["status"] != "ok":
                out.append(f"  {r['status']}: {_first_line(r['message'], 300)}")
    out.append("")
    show_role = any(r.get("role", "student") != "student" for r in subs)
    show_chance = bool(report.get("chance"))
    rows = []
    for r in subs:
        row = [r["student"]] + ([r.get("role", "student")] if show_role else [])
        row += [_num(r["score"]), _num(r["max_score"]), f"{r['percent']:.1f}%", f"{r['passed']}/{r['total']}",
                r["status"]] + ([_prob(r.get("chance", 0.0))] if show_chance else []) + ["; ".join(r["flags"])]
        rows.append(row)
    header = (["submission"] + (["role"] if show_role else []) + ["score", "max", "percent", "passed", "status"]
              + (["P(chance)"] if show_chance else []) + ["flags"])
    out.append(table(rows, header, "l" + ("l" if show_role else "") + "rrrrl" + ("r" if show_chance else "") + "l"))
    students = [r for r in subs if r.get("role", "student") == "student" and r["status"] not in ("missing",)]
    if len(students) > 1 and report["tests"]:
        rates = []
        for t in report["tests"]:
            n = sum(any(x["name"] == t["name"] and x["outcome"] == "passed" for x in r["tests"]) for r in students)
            rates.append((n / len(students), t["name"]))
        hardest = sorted(rates)[:5]
        out.append("")
        out.append("hardest tests: " + ", ".join(f"{name} ({100 * rate:.0f}% passed)" for rate, name in hardest))
    return "\n".join(out)
