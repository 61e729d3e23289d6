"""A lab as a Gradescope autograder zip, and the zip tried locally the way Gradescope runs it.

The zip holds, at its root, ``setup.sh`` and ``run_autograder`` (autograder_scripts/), and in
``course/`` what grading needs: ``requirements.txt``, the ``specdecode_ref`` package (without
the trained drafters' weights and the training corpus, which no lab's grading uses), the lab's
grading files and ``student.py`` (never ``reference.py``, the worked solution, the planted bugs or
the mutants: :func:`check_zip_contents` checks every zip), and ``autograder.json`` with the lab's
time limits and every lab's function names (which lab an upload is meant for).

Every file of the zip is a file git tracks, with its bytes as the commit (HEAD) holds them, never
the working tree's: a lab folder, package or requirements.txt that differs from HEAD, or an
untracked grading file in the lab folder, stops the build, unless the instructor allows it
(``allow_dirty``, ``--allow-dirty``): the zip then holds the working tree's files and names each
difference in ``course/DIRTY.txt``, in autograder.json's ``dirty`` and with ``-dirty`` after the
commit in ``built_from``. A course copied without its ``.git`` is built from the files on disk
(``"built_from": "no git repository"``). The same commit always gives the same bytes (sorted
entries, fixed timestamps).

:func:`try_autograder` lays out a root as Gradescope lays out ``/autograder`` (``source/``,
``submission/``, ``results/``), unpacks the zip into ``source/``, runs ``setup.sh`` once and
``run_autograder`` once per submission, and returns each ``results.json``.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import stat
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable

from .labs import Lab
from .runner import DEFAULT_TEST_TIMEOUT, DEFAULT_TIMEOUT, lab_apis

SCRIPTS = Path(__file__).resolve().parent / "autograder_scripts"
COURSE_ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "specdecode_ref"
# Left out of the zip: no lab's grading reads them (the autograder tests prove it on every lab).
LEFT_OUT = ("weights/*.safetensors", "weights/*.png", "data/distill_ids.npz")
LAB_FILES = ("student.py",)  # with the grading files; never reference.py, solution.py, planted bugs, mutants
NEVER_FILES = ("reference.py", "solution.py")  # no zip holds a file of these names,
NEVER_DIRS = ("planted_bugs", "mutants")  # or anything in a folder of these names
GRADESCOPE_LIMIT = 600.0  # seconds: Gradescope's default limit on one run of run_autograder
WALL_TIMEOUT = 480.0  # seconds the grader may spend on one upload, well inside that limit
TIMEOUT_MARGIN = 60  # seconds on top of wall_timeout for the assignment's setting (start-up, results)
_EPOCH = (1980, 1, 1, 0, 0, 0)  # zip's earliest date: the same commit gives the same bytes
_GRADING_FILE = re.compile(r"grading_[^/]*\.py")  # Lab.open's grading_*.py, at the top of the lab folder
_SIBLING_FILE = re.compile(r"lab[0-9][^/]*/(student\.py|grading_[^/]*\.py)")  # what decides lab_apis


# --- the files, from the commit -----------------------------------------------------------------

@dataclass
class _Part:
    """One folder's share of the zip: ``base`` on disk, ``prefix`` its path in ``course/``,
    ``specs`` what to look at under it, ``ships`` the base-relative paths that go into the zip,
    ``watched`` those whose difference from HEAD stops a build (tracked files), and
    ``watched_untracked`` the untracked ones that do."""
    base: Path
    prefix: str
    specs: tuple
    ships: Callable[[str], bool]
    watched: Callable[[str], bool]
    watched_untracked: Callable[[str], bool]
    walk: bool = True  # without git: read the files on disk (False: the part only decides, ships nothing)


@dataclass
class _Scan:
    repo: Path | None  # the git work tree the part lies in (None: no repository)
    commit: str  # `git describe` of HEAD, or "no git repository"
    entries: dict = field(default_factory=dict)  # course path -> bytes
    dirty: list = field(default_factory=list)  # "course path (change)"


def _git_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}  # no caller's GIT_DIR, GIT_INDEX_FILE
    env.update(GIT_OPTIONAL_LOCKS="0", LC_ALL="C")  # status must not take the index lock of a tree in use
    return env


def _git(cwd: Path, *args: str, stdin: bytes | None = None) -> bytes:
    return subprocess.run(["git", "--literal-pathspecs", *args], cwd=cwd, input=stdin, capture_output=True,
                          check=True, env=_git_env()).stdout


def _repo_of(folder: Path) -> tuple | None:
    """(work tree, folder's prefix in it) of the git repository ``folder`` lies in, else None. A
    repository git cannot read (git missing, a dubious owner) stops the build rather than let it
    take the files on disk unchecked."""
    try:
        top, prefix = _git(folder, "rev-parse", "--show-toplevel", "--show-prefix").decode().split("\n")[:2]
    except subprocess.CalledProcessError as exc:
        why = exc.stderr.decode(errors="replace").strip()
        if "not a git repository" in why:
            return None
        raise SystemExit(f"{folder}: git cannot read its repository: {why}") from None
    except OSError as exc:
        if any((d / ".git").exists() for d in (folder, *folder.parents)):
            raise SystemExit(f"{folder} lies in a git repository, and git does not run here ({exc})") from None
        return None
    return Path(top).resolve(), prefix


def _read_blobs(repo: Path, oids: list) -> list:
    """The bytes of each blob, with one ``git cat-file --batch``."""
    if not oids:
        return []
    out = _git(repo, "cat-file", "--batch", stdin="".join(f"{o}\n" for o in oids).encode())
    blobs, pos = [], 0
    for oid in oids:
        end = out.index(b"\n", pos)
        header = out[pos:end].split()
        if len(header) != 3 or header[0].decode() != oid:
            raise RuntimeError(f"git cat-file: unexpected answer {out[pos:end][:200]!r} for {oid}")
        size = int(header[2])
        blobs.append(out[end + 1:end + 1 + size])
        pos = end + 1 + size + 1
    return blobs


def _change(xy: str) -> str:
    if xy == "??":
        return "untracked"
    if "U" in xy or xy in ("AA", "DD"):
        return "unmerged"
    if "D" in xy:
        return "deleted"
    return "added" if xy[0] == "A" else "modified"


def _scan(part: _Part, from_head: bool) -> _Scan:
    """The part's files that go into the zip (HEAD's bytes, or the working tree's when not
    ``from_head``) and every watched difference between the working tree and HEAD."""
    found = _repo_of(part.base)
    if found is None:  # a course copied without .git: the files on disk
        scan = _Scan(None, "no git repository")
        for spec in part.specs if part.walk else ():
            p = part.base / spec
            for f in sorted([p] if p.is_file() else p.rglob("*") if p.is_dir() else []):
                rel = f.relative_to(part.base).as_posix()
                if f.is_file() and part.ships(rel):
                    scan.entries[part.prefix + rel] = f.read_bytes()
        return scan
    repo, prefix = found
    try:
        _git(repo, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
        commit = _git(repo, "describe", "--always", "HEAD").decode().strip()
    except subprocess.CalledProcessError:
        raise SystemExit(f"{part.base}: the git repository {repo} has no commit yet: commit the course, "
                         f"whose files the autograder is built from") from None
    scan = _Scan(repo, commit)

    def rel(full: str) -> str | None:
        return full[len(prefix):] if full.startswith(prefix) else None

    changes = {}
    status = _git(part.base, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames",
                  "--", *part.specs).decode(errors="surrogateescape")
    for item in status.split("\0"):
        if len(item) < 4:
            continue
        xy, r = item[:2], rel(item[3:])
        if r is None:
            continue
        if (part.watched_untracked if xy == "??" else part.watched)(r):
            changes[r] = _change(xy)
    scan.dirty = [f"{part.prefix}{r} ({c})" for r, c in sorted(changes.items())]

    if from_head:
        listing = _git(part.base, "ls-tree", "-r", "-z", "--full-name", "HEAD", "--", *part.specs).decode(
            errors="surrogateescape")
        wanted = {}
        for item in listing.split("\0"):
            if not item:
                continue
            meta, full = item.split("\t", 1)
            mode, kind, oid = meta.split()
            r = rel(full)
            if kind == "blob" and mode in ("100644", "100755") and r is not None and part.ships(r):
                wanted[r] = oid
        for r, data in zip(wanted, _read_blobs(repo, list(wanted.values()))):
            scan.entries[part.prefix + r] = data
    else:
        tracked = _git(part.base, "ls-files", "-z", "--full-name", "--cached", "--", *part.specs).decode(
            errors="surrogateescape")
        paths = {rel(full) for full in tracked.split("\0") if full}
        paths |= {r for r, c in changes.items() if c == "untracked"}
        for r in sorted(p for p in paths if p is not None and part.ships(p)):
            f = part.base / r
            if f.is_file():
                scan.entries[part.prefix + r] = f.read_bytes()
    return scan


def _ships_course(rel: str) -> bool:
    """requirements.txt and the package's files, but caches, local builds and LEFT_OUT."""
    if rel == "requirements.txt":
        return True
    if not rel.startswith(PACKAGE + "/"):
        return False
    path = PurePosixPath(rel)
    if "__pycache__" in path.parts or path.suffix in (".pyc", ".so"):
        return False
    inside = PurePosixPath(rel[len(PACKAGE) + 1:])
    return not any(inside.match(pattern) for pattern in LEFT_OUT)


def _parts(lab: Lab, course_root: Path) -> list:
    """Where the zip's files come from: the course (requirements.txt, the package), the lab
    folder (its grading files and student.py; any other change in it is watched too), and the
    lab folders next to it (their student.py and grading files decide autograder.json's lab_apis)."""
    every = lambda rel: True  # noqa: E731
    ships_lab = lambda rel: rel in LAB_FILES or bool(_GRADING_FILE.fullmatch(rel))  # noqa: E731
    sibling = lambda rel: bool(_SIBLING_FILE.fullmatch(rel))  # noqa: E731
    return [_Part(course_root, "", ("requirements.txt", PACKAGE), _ships_course, every, _ships_course),
            _Part(lab.dir, f"labs/{lab.name}/", (".",), ships_lab, every, ships_lab),
            _Part(lab.dir.parent, "labs/", (".",), lambda rel: False, sibling, sibling, walk=False)]


def _built_from(scans: list, lab_rel: str) -> str:
    """The commit the zip's files come from (``-dirty`` where the working tree's files differ from
    it), and the lab's own where the lab lies in another repository or in none."""
    dirty = {s.repo for s in scans if s.dirty and s.repo is not None}
    course, lab = scans[0], scans[1]
    text = course.commit + ("-dirty" if course.repo in dirty else "")
    if lab.repo != course.repo:
        text += f"; {lab_rel}: " + lab.commit + ("-dirty" if lab.repo in dirty else "")
    return text


def _embedded_pin(entries: dict) -> str:
    """models.EMBEDDED_PIN as the zip's own models.py says it (the running package's otherwise)."""
    source = entries.get(f"{PACKAGE}/models.py", b"").decode(errors="replace")
    m = re.search(r"^EMBEDDED_PIN\s*=\s*[\"']([^\"']+)[\"']", source, flags=re.MULTILINE)
    if m:
        return m.group(1)
    from ..models import EMBEDDED_PIN

    return EMBEDDED_PIN


def _script(name: str, lab: Lab, entries: dict | None = None) -> bytes:
    """A script of autograder_scripts/ for the zip's root, from the zip's own copy where it has one."""
    entries = entries or {}
    shipped = entries.get(f"{PACKAGE}/grading/autograder_scripts/{name}")
    text = shipped.decode() if shipped is not None else (SCRIPTS / name).read_text()
    return text.replace("@LAB@", lab.name).replace("@EMBEDDED_PIN@", _embedded_pin(entries)).encode()


def _add(zf: zipfile.ZipFile, name: str, data: bytes, executable: bool = False) -> None:
    info = zipfile.ZipInfo(name, date_time=_EPOCH)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = ((0o755 if executable else 0o644) | stat.S_IFREG) << 16
    zf.writestr(info, data)


def build_autograder(lab_dir, out, test_timeout: float = DEFAULT_TEST_TIMEOUT, timeout: float = DEFAULT_TIMEOUT,
                     count_points: bool = True, allow_dirty: bool = False, wall_timeout: float = WALL_TIMEOUT,
                     gradescope_limit: float = GRADESCOPE_LIMIT, course_root=None) -> Path:
    """Write the Gradescope autograder zip of one lab to ``out`` (a .zip path, or a folder that
    gets ``labNN_autograder.zip``); returns its path.

    count_points: record the lab's total in autograder.json (one grading of the stubs), for the
    Gradescope assignment's settings. allow_dirty: build from the working tree's files where they
    differ from HEAD (each difference is named in the zip) instead of stopping. wall_timeout: the
    wall-clock seconds the grader may spend on one upload; it must stay below ``gradescope_limit``,
    the assignment's autograder timeout (Gradescope's default, 600 s, unless raised there too).
    course_root: the course folder whose requirements.txt and package go into the zip (this
    package's own by default).
    """
    if not (0 < wall_timeout < gradescope_limit):
        raise ValueError(f"wall_timeout={wall_timeout:g} s: the grader must finish within the assignment's autograder "
                         f"timeout ({gradescope_limit:g} s, Gradescope's default is {GRADESCOPE_LIMIT:g} s); raise "
                         f"gradescope_limit only with the assignment's timeout")
    lab = Lab.open(lab_dir)
    course_root = Path(course_root).resolve() if course_root is not None else COURSE_ROOT
    out = Path(out)
    if out.suffix != ".zip":
        out = out / f"{lab.number}_autograder.zip"
    lab_rel = f"labs/{lab.name}"

    scans = [_scan(part, from_head=not allow_dirty) for part in _parts(lab, course_root)]
    dirty = sorted({d for s in scans for d in s.dirty})
    if dirty and not allow_dirty:
        raise SystemExit(f"{lab.name}: the autograder is built from the commit ({scans[0].commit}), and these files "
                         "differ from it:\n  " + "\n  ".join(dirty) + "\nCommit them (or move the untracked ones "
                         "away), or build with --allow-dirty to take the working tree's files (the zip then names "
                         "each of them).")
    entries = {}
    for s in scans:
        entries.update(s.entries)
    if "requirements.txt" not in entries:
        raise SystemExit(f"{course_root}/requirements.txt: not in the commit ({scans[0].commit})")
    if not any(n.startswith(f"{lab_rel}/grading_") for n in entries):
        raise SystemExit(f"{lab.dir}: no grading_*.py file in the commit ({scans[1].commit}): commit the lab, "
                         f"or build with --allow-dirty")

    built_from = _built_from(scans, lab_rel)
    config = {"lab": lab.name, "lab_dir": lab_rel, "test_timeout": test_timeout, "timeout": timeout,
              "wall_timeout": float(wall_timeout),
              "gradescope_timeout_hint": "set the assignment's autograder timeout to at least "
                                         f"{math.ceil(wall_timeout + TIMEOUT_MARGIN)} seconds",
              "threads": 1, "built_from": built_from, "dirty": dirty, "max_score": None, "tests": [],
              "lab_apis": lab_apis(lab)}
    if count_points:
        config["tests"] = _tests(lab)
        config["max_score"] = sum(t["points"] for t in config["tests"])
    entries["autograder.json"] = (json.dumps(config, indent=1) + "\n").encode()
    if dirty:
        entries["DIRTY.txt"] = (f"Built with --allow-dirty from {built_from}: these files of the zip, or of the "
                                f"folders it was built from, differ from that commit (the zip holds the working "
                                f"tree's files):\n" + "".join(f"{d}\n" for d in dirty)).encode()

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    with zipfile.ZipFile(tmp, "w") as zf:
        _add(zf, "setup.sh", _script("setup.sh", lab, entries), executable=True)
        _add(zf, "run_autograder", _script("run_autograder", lab, entries), executable=True)
        for name in sorted(entries):
            _add(zf, f"course/{name}", entries[name])
    try:
        check_zip_contents(tmp, lab)
    except SystemExit:
        tmp.unlink()
        raise
    tmp.replace(out)
    return out


def zip_problems(zip_path, lab) -> list:
    """What the zip must not hold and does: a reference, solution, planted bug or mutant by name,
    or a file with the bytes of the lab's reference.py, solution.py, planted bugs or mutants (or
    of another lab's reference.py or solution.py next to it)."""
    lab = lab if isinstance(lab, Lab) else Lab.open(lab)
    secrets = [lab.dir / f for f in NEVER_FILES] + list(lab.planted_bugs) + list(lab.mutants)
    secrets += [d / f for d in sorted(lab.dir.parent.glob("lab[0-9]*")) if d.is_dir() for f in NEVER_FILES]
    forbidden = {}
    for p in secrets:
        data = p.read_bytes() if p.is_file() else b""
        if data.strip():
            forbidden.setdefault(hashlib.sha256(data).digest(), p)
    problems = []
    with zipfile.ZipFile(zip_path) as zf:
        for info in zf.infolist():
            parts = PurePosixPath(info.filename).parts
            if parts and (parts[-1] in NEVER_FILES or any(d in NEVER_DIRS for d in parts[:-1])):
                problems.append(f"{info.filename}: no autograder zip may hold it")
            p = forbidden.get(hashlib.sha256(zf.read(info)).digest())
            if p is not None:
                problems.append(f"{info.filename}: the bytes of {p}")
    return problems


def check_zip_contents(zip_path, lab) -> None:
    """Stop (SystemExit) if the zip holds an answer key of the lab: see :func:`zip_problems`."""
    problems = zip_problems(zip_path, lab)
    if problems:
        raise SystemExit(f"{zip_path}: the autograder zip holds what students must never get:\n  "
                         + "\n  ".join(problems))


def _tests(lab: Lab) -> list:
    """The lab's tests with their points, from a grading of the untouched stubs (every test is
    collected, none can pass): the total for Gradescope's assignment settings, and the list a
    submission that cannot be graded (missing, wrong lab) is shown with 0 points each."""
    from .runner import grade

    report = grade(lab.dir, [("stubs", lab.dir / "student.py")], quiet=True)
    return [{k: t[k] for k in ("name", "points", "hidden", "doc", "chance")} for t in report["tests"]]


def unpack(zip_path, root) -> Path:
    """Lay out ``root`` as Gradescope lays out /autograder and unpack the zip into source/."""
    root = Path(root).resolve()
    source = root / "source"
    if source.exists() and any(source.iterdir()):
        raise SystemExit(f"{source} is not empty: give a fresh --root")
    for d in ("source", "submission", "results"):
        (root / d).mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(zip_path) as zf:
        names = zf.namelist()
        if "setup.sh" not in names or "run_autograder" not in names:
            raise SystemExit(f"{zip_path}: setup.sh and run_autograder must be at the zip's root")
        zf.extractall(source)
        for info in zf.infolist():  # extractall drops the modes: keep the scripts executable
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                os.chmod(source / info.filename, mode)
    shutil.copy2(source / "run_autograder", root / "run_autograder")  # as Gradescope's image build does
    return root


def _env(root: Path, extra: dict | None) -> dict:
    env = dict(os.environ)
    for var in ("PYTHONPATH", "VIRTUAL_ENV", "SPECDECODE_LAB_IMPL"):  # nothing of the caller's environment
        env.pop(var, None)
    env["AUTOGRADER_ROOT"] = str(root)
    env.update(extra or {})
    return env


def run_setup(root, env: dict | None = None, log=None) -> None:
    """setup.sh, as Gradescope runs it when it builds the image (its output in ``log``)."""
    root = Path(root).resolve()
    proc = subprocess.run(["bash", str(root / "source" / "setup.sh")], cwd=root / "source", env=_env(root, env),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if log is not None:
        Path(log).write_text(proc.stdout)
    if proc.returncode != 0:
        raise RuntimeError(f"setup.sh failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")


def run_submission(root, upload, env: dict | None = None) -> dict:
    """One Gradescope run: ``upload`` (a file, handed in as student.py, or a folder of files) in
    submission/, run_autograder, and the results.json it wrote (with its stdout as ``_stdout``)."""
    root = Path(root).resolve()
    for d in ("submission", "results"):
        shutil.rmtree(root / d, ignore_errors=True)
        (root / d).mkdir()
    upload = Path(upload)
    if upload.is_dir():
        shutil.copytree(upload, root / "submission", dirs_exist_ok=True)
    else:
        shutil.copy(upload, root / "submission" / "student.py")
    proc = subprocess.run([str(root / "run_autograder")], cwd=root, env=_env(root, env),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    (root / "results" / "stdout").write_text(proc.stdout)
    path = root / "results" / "results.json"
    if proc.returncode != 0 or not path.is_file():
        raise RuntimeError(f"run_autograder failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    results = json.loads(path.read_text())
    results["_stdout"] = proc.stdout
    return results


def try_autograder(zip_path, uploads: list, root=None, env: dict | None = None) -> tuple:
    """Unpack the zip into a fresh root (a temporary one by default), run setup.sh once and
    run_autograder on each upload; returns (root, [results.json, ...])."""
    root = Path(root).resolve() if root is not None else Path(tempfile.mkdtemp(prefix="autograder-"))
    unpack(zip_path, root)
    run_setup(root, env, log=root / "setup.log")
    return root, [run_submission(root, u, env) for u in uploads]
