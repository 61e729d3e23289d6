"""A lab as a Gradescope autograder zip, and the zip tried locally the way Gradescope runs it.

The zip holds, at its root, ``setup.sh`` and ``run_autograder`` (autograder_scripts/), and in
``course/`` what grading needs: ``requirements.txt``, the ``specdecode_ref`` package (without
the trained drafters' weights and the training corpus, which no lab's grading uses),
the lab's grading files, ``student.py`` and ``reference.py`` (not the worked solution, the planted bugs
or the mutants), and ``autograder.json`` with the lab's time limits. The same commit always gives
the same bytes (sorted entries, fixed timestamps).

:func:`try_autograder` lays out a root as Gradescope lays out ``/autograder`` (``source/``,
``submission/``, ``results/``), unpacks the zip into ``source/``, runs ``setup.sh`` once and
``run_autograder`` once per submission, and returns each ``results.json``.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
import zipfile
from pathlib import Path

from .labs import Lab
from .runner import DEFAULT_TEST_TIMEOUT, DEFAULT_TIMEOUT

SCRIPTS = Path(__file__).resolve().parent / "autograder_scripts"
COURSE_ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "specdecode_ref"
# Left out of the zip: no lab's grading reads them (the autograder tests prove it on every lab).
LEFT_OUT = ("weights/*.safetensors", "weights/*.png", "data/distill_ids.npz")
LAB_FILES = ("student.py", "reference.py")  # with the grading files; not solution.py, planted bugs, mutants
_EPOCH = (1980, 1, 1, 0, 0, 0)  # zip's earliest date: the same commit gives the same bytes


def _package_files() -> list:
    """The package's files that go into the zip: those git tracks or would track (no caches, no
    local builds) where there is a repository, else every file but caches."""
    root = COURSE_ROOT / PACKAGE
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", PACKAGE],
                             cwd=COURSE_ROOT, capture_output=True, check=True)
        files = [COURSE_ROOT / p for p in out.stdout.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        files = [p for p in root.rglob("*") if p.is_file()]
    files = [p for p in files if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".so")]
    return sorted(p for p in files if not any(p.relative_to(root).match(pattern) for pattern in LEFT_OUT))


def _commit() -> str:
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=COURSE_ROOT, capture_output=True,
                             text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _script(name: str, lab: Lab) -> bytes:
    from ..models import EMBEDDED_PIN

    text = (SCRIPTS / name).read_text().replace("@LAB@", lab.name).replace("@EMBEDDED_PIN@", EMBEDDED_PIN)
    return text.encode()


def _add(zf: zipfile.ZipFile, name: str, data: bytes, executable: bool = False) -> None:
    info = zipfile.ZipInfo(name, date_time=_EPOCH)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = ((0o755 if executable else 0o644) | stat.S_IFREG) << 16
    zf.writestr(info, data)


def build_autograder(lab_dir, out, test_timeout: float = DEFAULT_TEST_TIMEOUT, timeout: float = DEFAULT_TIMEOUT,
                     count_points: bool = True) -> Path:
    """Write the Gradescope autograder zip of one lab to ``out`` (a .zip path, or a folder that
    gets ``labNN_autograder.zip``); returns its path. count_points: record the lab's total in
    autograder.json (one grading of the stubs), for the Gradescope assignment's settings."""
    lab = Lab.open(lab_dir)
    out = Path(out)
    if out.suffix != ".zip":
        out = out / f"{lab.number}_autograder.zip"
    out.parent.mkdir(parents=True, exist_ok=True)
    lab_rel = f"labs/{lab.name}"
    config = {"lab": lab.name, "lab_dir": lab_rel, "test_timeout": test_timeout, "timeout": timeout, "threads": 1,
              "built_from": _commit(), "max_score": None, "tests": []}
    entries = {"requirements.txt": (COURSE_ROOT / "requirements.txt").read_bytes()}
    for p in _package_files():
        entries[p.relative_to(COURSE_ROOT).as_posix()] = p.read_bytes()
    for p in [*lab.visible_files, *lab.hidden_files, *(lab.dir / f for f in LAB_FILES)]:
        if p.is_file():
            entries[f"{lab_rel}/{p.name}"] = p.read_bytes()
    if count_points:
        config["tests"] = _tests(lab)
        config["max_score"] = sum(t["points"] for t in config["tests"])
    entries["autograder.json"] = (json.dumps(config, indent=1) + "\n").encode()
    tmp = out.with_name(out.name + ".part")
    with zipfile.ZipFile(tmp, "w") as zf:
        _add(zf, "setup.sh", _script("setup.sh", lab), executable=True)
        _add(zf, "run_autograder", _script("run_autograder", lab), executable=True)
        for name in sorted(entries):
            _add(zf, f"course/{name}", entries[name])
    tmp.replace(out)
    return out


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
