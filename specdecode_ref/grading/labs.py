"""Labs and submissions on disk: what a lab folder holds, where a class's files are, and which
lab a file belongs to."""
from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

# The environment variable that names the implementation a lab's grading tests load (api.load_lab);
# the runner sets it for each submission's process.
IMPL_ENV = "SPECDECODE_LAB_IMPL"
ROLES = ("reference", "solution", "stubs", "planted bug", "mutant", "tamper attempt")


@dataclass
class Lab:
    dir: Path
    visible_files: list
    hidden_files: list
    planted_bugs: list
    mutants: list = field(default_factory=list)
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

    def api_names(self) -> set:
        """The public functions and classes of the lab's ``student.py``: what a submission defines."""
        return _public_names(self.dir / "student.py", definitions_only=True) or set()

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
        mutants = sorted((d / "mutants").glob("*.py")) if (d / "mutants").is_dir() else []
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
        return Lab(d, visible, hidden, bugs, mutants, patterns)


@dataclass
class Submission:
    name: str
    path: Path | None  # None: nothing found for this student
    note: str = ""
    role: str = "student"  # or one of ROLES (the self-test's own files)
    status: str = ""  # set when the submission is not graded at all: "missing", "wrong lab", "ambiguous"


def _public_names(path: Path, definitions_only: bool = False) -> set | None:
    """Top-level functions, classes, assigned and imported names of a Python file that do not
    start with an underscore (only functions and classes with ``definitions_only``); None if the
    file does not parse (it is graded anyway, and gets a load error)."""
    try:
        tree = ast.parse(Path(path).read_text(errors="replace"))
    except (SyntaxError, ValueError, OSError):
        return None
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif definitions_only:
            continue
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return {n for n in names if not n.startswith("_")}


def sibling_labs(lab: Lab, others=()) -> list:
    """Every lab a submission could be meant for: ``lab``, the labs graded with it and the lab
    folders next to it."""
    dirs = {lab.dir} | {o.dir for o in others}
    dirs |= {p.resolve() for p in lab.dir.parent.glob("lab[0-9]*") if p.is_dir() and any(p.glob("grading_*.py"))}
    return [lab] + [Lab.open(d) for d in sorted(dirs) if d != lab.dir]


def which_lab(path: Path, lab_name: str, apis: dict) -> tuple[str, str]:
    """Decide whether the file at ``path`` is a submission for the lab ``lab_name``: ("", "") if
    so, else a status ("wrong lab" or "ambiguous") and a message. ``apis`` maps every candidate
    lab to the names its ``student.py`` defines (the same table locally and on Gradescope).

    A file belongs to the lab whose ``student.py`` names it defines the largest share of. A file
    that does not parse is graded (it gets a load error, which says more than "wrong lab").
    """
    defined = _public_names(path)
    if defined is None:
        return "", ""
    shares = {}
    for name, want in apis.items():
        want = set(want)
        if want:
            shares[name] = len(defined & want) / len(want)
    mine = shares.get(lab_name, 0.0)
    best = max(shares.values(), default=0.0)
    if best == 0.0:
        names = ", ".join(sorted(apis.get(lab_name, [])))
        return "wrong lab", f"{path.name} defines none of {lab_name}'s functions ({names})"
    top = sorted(n for n, s in shares.items() if s == best)
    if mine < best:
        return "wrong lab", f"{path.name} is a submission for {' or '.join(top)}, not {lab_name}"
    if len(top) > 1:
        return "ambiguous", f"{path.name} defines the functions of {' and '.join(top)} alike: hand in one file per lab"
    return "", ""


IGNORED_UPLOAD_PARTS = ("__MACOSX", ".ipynb_checkpoints", "__pycache__")


def _inside(path: Path, folder: Path) -> bool:
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except OSError:
        return False


def find_upload(folder: Path, lab: Lab) -> tuple:
    """The one file a student handed in for ``lab`` somewhere inside ``folder`` (an upload or a
    student's folder in a class), and a note: ``(path, "")``, or ``(None, why)``.

    The file is the only ``student.py`` anywhere in the folder (nested folders such as
    ``Archive/student.py`` included; among several, the one in a folder named after the lab, or
    several copies of the same bytes), else ``labNN_topic.py``, else the only ``.py`` file. A link
    is followed only when it stays inside the folder: a ``student.py`` that points into the course
    (at the answer key) is not a submission. A notebook alone is answered with what to upload.
    """
    folder = Path(folder)
    files, links_out = [], []
    for root, dirs, names in os.walk(folder):  # never follows links to folders
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in IGNORED_UPLOAD_PARTS)
        for name in sorted(names):
            p = Path(root) / name
            if name.startswith("."):
                continue
            if p.is_symlink() and not _inside(p, folder):
                links_out.append(p)
                continue
            if p.is_file():
                files.append(p)
    rel = lambda p: p.relative_to(folder).as_posix()  # noqa: E731
    students = [p for p in files if p.name == "student.py"]
    if len(students) > 1:
        named = [p for p in students if any(part.startswith(lab.number) for part in p.relative_to(folder).parts[:-1])]
        if len(named) == 1:
            students = named
        elif len({p.read_bytes() for p in students}) == 1:
            students = students[:1]
        else:
            return None, (f"several different student.py files ({', '.join(rel(p) for p in students[:5])}): "
                          "upload only the one for this lab")
    if students:
        return students[0].resolve(), ""
    for p in files:
        if p.name == f"{lab.name}.py":
            return p.resolve(), ""
    pys = [p for p in files if p.suffix == ".py"]
    if len(pys) == 1:
        return pys[0].resolve(), ""
    linked = [rel(p) for p in links_out if p.suffix == ".py"]
    if linked:
        return None, (f"{', '.join(linked)} is a link to a file outside the upload: hand in the file itself, "
                      "not a link")
    notebooks = [rel(p) for p in files if p.suffix == ".ipynb"]
    if notebooks and not pys:
        return None, (f"only a notebook was uploaded ({', '.join(notebooks[:3])}): the grader grades student.py, "
                      f"the file next to {lab.name}.ipynb where you wrote your functions. Upload that file")
    if len(pys) > 1:
        return None, f"several .py files and no student.py ({', '.join(rel(p) for p in pys[:5])}): upload student.py"
    found = ", ".join(rel(p) for p in files[:10]) or "nothing"
    return None, f"no student.py in the upload (found: {found})"


def submission_in(folder: Path, lab: Lab) -> Path | None:
    """The file one student handed in for ``lab`` inside their ``folder`` (see :func:`find_upload`)."""
    return find_upload(folder, lab)[0]


def find_submissions(folder, lab: Lab) -> list:
    """One submission per entry of ``folder``: ``NAME.py``, or a folder ``NAME/`` holding the
    student's file (see :func:`find_upload`). A ``NAME.py`` that is a link out of the class
    folder is not a submission (it could point at the answer key)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SystemExit(f"--submissions {folder}: not a folder")
    subs = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith((".", "_")):
            continue
        if entry.suffix == ".py" and (entry.is_file() or entry.is_symlink()):
            if entry.is_symlink() and not _inside(entry, folder):
                subs.append(Submission(entry.stem, None, f"{entry.name} is a link to a file outside the class folder: "
                                                         "hand in the file itself"))
            else:
                subs.append(Submission(entry.stem, entry.resolve()))
        elif entry.is_dir() and not entry.is_symlink():
            found, note = find_upload(entry, lab)
            subs.append(Submission(entry.name, found, note))
    return subs


def expectations(path: Path) -> tuple[list, float | None]:
    """A planted bug's or mutant's docstring lines ``caught by: test_a, test_b`` (tests that must
    fail) and ``at most: 60 %`` (the highest score it may keep; None if not given)."""
    text = path.read_text()
    m = re.search(r"^\s*caught by:\s*(.+)$", text, flags=re.MULTILINE)
    tests = [t.strip() for t in m.group(1).split(",") if t.strip()] if m else []
    m = re.search(r"^\s*at most:\s*([0-9.]+)\s*%", text, flags=re.MULTILINE)
    return tests, (float(m.group(1)) if m else None)
