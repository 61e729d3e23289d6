"""The Gradescope autograder zip and its setup.sh, without grading anything (count_points=False)
and without loading a model.

The zip is built from the commit's tracked files: an untracked grading file or a changed file
stops the build, and with allow_dirty is shipped and named; the bytes come from HEAD, not from
the working tree. No lab's zip holds an answer key, the time limits stay inside Gradescope's,
and every lab's function names are recorded. setup.sh never replaces a folder it did not make
and rebuilds the environment when any pin changes (run here with a fake Python: nothing is
installed).

The course these tests build from is a git repository made in a temporary folder from this
checkout's working tree (committed there), so that they test the files as they are now.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import zipfile
from pathlib import Path, PurePosixPath

import pytest

from specdecode_ref.grading import autograder
from specdecode_ref.grading.labs import Lab

CHECKOUT = Path(__file__).resolve().parents[1]
LAB = "lab03_speedup_model"
LAB_NAMES = sorted(p.name for p in (CHECKOUT / "labs").glob("lab[0-9]*") if p.is_dir())


def git(cwd: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    out = subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@example.com",
                          "-c", "commit.gpgsign=false", *args], cwd=cwd, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def base_course(tmp_path_factory) -> Path:
    """A git repository with this checkout's requirements.txt, package and labs (tracked and
    untracked files as they are now, less the weights no zip holds), in one commit."""
    root = tmp_path_factory.mktemp("base") / "course"
    listed = git(CHECKOUT, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    for rel in listed:
        src = CHECKOUT / rel
        keep = rel in ("requirements.txt", ".gitignore") or rel.startswith(("specdecode_ref/", "labs/"))
        inside = PurePosixPath(rel).relative_to("specdecode_ref") if rel.startswith("specdecode_ref/") else None
        if not keep or not src.is_file() or (inside and any(inside.match(p) for p in autograder.LEFT_OUT)):
            continue
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, root / rel)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "course")
    return root


@pytest.fixture
def course(base_course, tmp_path) -> Path:
    """A fresh clone of the course for each test (which may change it)."""
    clone = tmp_path / "course"
    git(tmp_path, "clone", "-q", str(base_course), str(clone))
    return clone


def build(course: Path, out: Path, lab: str = LAB, **kw) -> Path:
    return autograder.build_autograder(course / "labs" / lab, out, count_points=False, course_root=course, **kw)


def contents(zip_path: Path) -> tuple[dict, dict]:
    with zipfile.ZipFile(zip_path) as zf:
        files = {n: zf.read(n) for n in zf.namelist()}
    return files, json.loads(files["course/autograder.json"])


# --- the files, from the commit -------------------------------------------------------------------

def test_an_untracked_grading_file_stops_the_build_or_is_named(course, tmp_path):
    lab = course / "labs" / LAB
    (lab / "grading_lab03_extra.py").write_text("def test_extra():\n    assert True\n")
    (lab / "notes.txt").write_text("an instructor's notes: not a grading file, not shipped\n")
    out = tmp_path / "zips" / "lab03.zip"
    with pytest.raises(SystemExit) as exc:
        build(course, out)
    assert "labs/lab03_speedup_model/grading_lab03_extra.py (untracked)" in str(exc.value)
    assert "--allow-dirty" in str(exc.value) and "notes.txt" not in str(exc.value)
    assert not out.exists() and not out.with_name(out.name + ".part").exists()

    files, config = contents(build(course, out, allow_dirty=True))
    head = git(course, "describe", "--always", "HEAD").strip()
    extra = "labs/lab03_speedup_model/grading_lab03_extra.py"
    assert files[f"course/{extra}"] == (course / extra).read_bytes()
    assert not any(n.endswith("notes.txt") for n in files)
    assert config["dirty"] == ["labs/lab03_speedup_model/grading_lab03_extra.py (untracked)"]
    assert config["built_from"] == f"{head}-dirty"
    dirty_txt = files["course/DIRTY.txt"].decode()
    assert "labs/lab03_speedup_model/grading_lab03_extra.py (untracked)" in dirty_txt and f"{head}-dirty" in dirty_txt

    # Untracked files of the package would be shipped by a dirty build: a clean one names them.
    (course / "specdecode_ref" / "grading" / "draft_module.py").write_text("X = 1\n")
    (lab / "grading_lab03_extra.py").unlink()
    with pytest.raises(SystemExit, match=r"specdecode_ref/grading/draft_module\.py \(untracked\)"):
        build(course, out)


def test_a_changed_tracked_file_stops_the_build_and_the_zip_holds_heads_bytes(course, tmp_path):
    lab = course / "labs" / LAB
    head_tests = git(course, "show", f"HEAD:labs/{LAB}/grading_lab03.py").encode()
    (lab / "grading_lab03.py").write_bytes(head_tests + b"\n# an edit not committed\n")
    with pytest.raises(SystemExit, match=r"labs/lab03_speedup_model/grading_lab03\.py \(modified\)"):
        build(course, tmp_path / "a.zip")
    files, config = contents(build(course, tmp_path / "a.zip", allow_dirty=True))
    assert files["course/labs/lab03_speedup_model/grading_lab03.py"].endswith(b"# an edit not committed\n")
    assert config["dirty"] == ["labs/lab03_speedup_model/grading_lab03.py (modified)"]
    git(course, "checkout", "--", f"labs/{LAB}/grading_lab03.py")

    # Staged, deleted, or anywhere in the package or requirements.txt: the same.
    (course / "requirements.txt").write_text((course / "requirements.txt").read_text() + "# local\n")
    git(course, "add", "requirements.txt")
    (course / "specdecode_ref" / "grading" / "labs.py").unlink()
    (lab / "solution.py").write_text("# the instructor's draft\n")
    other = next(p for p in sorted((course / "labs").glob("lab0*")) if p.name != LAB)  # decides lab_apis
    (other / "student.py").write_text((other / "student.py").read_text() + "\n\ndef extra():\n    pass\n")
    with pytest.raises(SystemExit) as exc:
        build(course, tmp_path / "b.zip")
    for line in ("requirements.txt (modified)", "specdecode_ref/grading/labs.py (deleted)",
                 "labs/lab03_speedup_model/solution.py (modified)", f"labs/{other.name}/student.py (modified)"):
        assert line in str(exc.value)
    git(course, "reset", "-q", "--hard")

    # A working-tree change git is told to overlook: the zip still holds the commit's bytes.
    for rel in (f"labs/{LAB}/student.py", "specdecode_ref/grading/labs.py"):
        git(course, "update-index", "--assume-unchanged", rel)
        (course / rel).write_text("raise SystemExit('the working tree, not the commit')\n")
    files, config = contents(build(course, tmp_path / "c.zip"))
    assert config["dirty"] == [] and config["built_from"] == git(course, "describe", "--always", "HEAD").strip()
    assert "course/DIRTY.txt" not in files
    for rel in (f"labs/{LAB}/student.py", "specdecode_ref/grading/labs.py"):
        assert files[f"course/{rel}"] == subprocess.run(["git", "show", f"HEAD:{rel}"], cwd=course,
                                                        capture_output=True, check=True).stdout


def test_a_course_without_git_is_built_from_disk(course, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(course, copy, ignore=shutil.ignore_patterns(".git"))
    (copy / "labs" / LAB / "grading_lab03_extra.py").write_text("def test_extra():\n    assert True\n")
    files, config = contents(build(copy, tmp_path / "z.zip"))
    assert config["built_from"] == "no git repository" and config["dirty"] == []
    assert "course/labs/lab03_speedup_model/grading_lab03_extra.py" in files
    assert files["course/specdecode_ref/grading/labs.py"] == (copy / "specdecode_ref/grading/labs.py").read_bytes()


# --- what the zip holds ---------------------------------------------------------------------------

def test_no_labs_zip_holds_an_answer_key(course, tmp_path):
    assert len(LAB_NAMES) == 8
    for name in LAB_NAMES:
        lab = Lab.open(course / "labs" / name)
        zip_path = build(course, tmp_path / f"{name}.zip", lab=name)
        autograder.check_zip_contents(zip_path, lab)
        files, config = contents(zip_path)
        lab_files = sorted(n.rsplit("/", 1)[1] for n in files if n.startswith(f"course/labs/{name}/"))
        assert lab_files == sorted([p.name for p in lab.files()] + ["student.py"]), name
        assert not any(n.startswith("course/labs/") and not n.startswith(f"course/labs/{name}/") for n in files)
        secrets = {(lab.dir / f).read_bytes() for f in ("reference.py", "solution.py")}
        secrets |= {p.read_bytes() for p in [*lab.planted_bugs, *lab.mutants]}
        assert not secrets & set(files.values()), name
        assert not any(n.endswith(("reference.py", "solution.py")) or "/planted_bugs/" in n or "/mutants/" in n
                       for n in files), name
        assert not any(n.endswith(".safetensors") for n in files)

    # The check catches each way an answer key could get in.
    lab = Lab.open(course / "labs" / LAB)
    good = build(course, tmp_path / "ok.zip")
    planted = {"course/labs/lab03_speedup_model/reference.py": b"anything\n",
               "course/labs/lab03_speedup_model/planted_bugs/off_by_one.py": b"anything\n",
               "course/labs/lab03_speedup_model/mutants/m1.py": b"anything\n",
               "course/specdecode_ref/answers.py": (lab.dir / "solution.py").read_bytes(),
               "course/labs/lab03_speedup_model/helper.py": (lab.dir / "reference.py").read_bytes(),
               "course/x.py": lab.planted_bugs[0].read_bytes()}
    for name, data in planted.items():
        bad = tmp_path / "bad.zip"
        shutil.copy(good, bad)
        with zipfile.ZipFile(bad, "a") as zf:
            zf.writestr(name, data)
        with pytest.raises(SystemExit, match="never get"):
            autograder.check_zip_contents(bad, lab)
        assert any(p.startswith(name) for p in autograder.zip_problems(bad, lab)), name


def test_time_limits_inside_gradescopes(course, tmp_path):
    zip_path = build(course, tmp_path / "a.zip")
    _, config = contents(zip_path)
    assert config["wall_timeout"] == 480
    assert config["gradescope_timeout_hint"] == "set the assignment's autograder timeout to at least 540 seconds"
    assert build(course, tmp_path / "again.zip").read_bytes() == zip_path.read_bytes()  # the same bytes
    for bad in (600, 900, 0, -1):
        with pytest.raises(ValueError, match="wall_timeout"):
            build(course, tmp_path / "b.zip", wall_timeout=bad)
    _, config = contents(build(course, tmp_path / "c.zip", wall_timeout=900, gradescope_limit=1200))
    assert config["wall_timeout"] == 900 and "at least 960 seconds" in config["gradescope_timeout_hint"]


def test_lab_apis_name_every_labs_functions(course, tmp_path):
    _, config = contents(build(course, tmp_path / "a.zip"))
    assert sorted(config["lab_apis"]) == LAB_NAMES
    for name, names in config["lab_apis"].items():
        assert names and names == sorted(Lab.open(course / "labs" / name).api_names()), name


# --- setup.sh and run_autograder ------------------------------------------------------------------

FAKE_PYTHON = r"""#!/usr/bin/env bash
# A Python that installs nothing: it logs each call and plays the parts setup.sh needs.
echo "python $*" >> "$FAKE_LOG"
if [ "${1:-}" = "-m" ] && [ "${2:-}" = "venv" ]; then
  mkdir -p "$3/bin" && cp "$0" "$3/bin/python"
  printf '#!/usr/bin/env bash\necho "uv $*" >> "$FAKE_LOG"\n' > "$3/bin/uv" && chmod +x "$3/bin/uv"
  exit 0
fi
if [ "${1:-}" = "-m" ] && [ "${2:-}" = "pip" ] && [ "${3:-}" = "config" ]; then exit 1; fi
if [ "${1:-}" = "--version" ]; then echo "Python $FAKE_VERSION"; exit 0; fi
if [ "${1:-}" = "-c" ]; then
  case "$2" in
    *"print(sys.version)"*) echo "$FAKE_VERSION (fake build)" ;;
    *prepare_embedded*) echo "embedded model: none (fake)" ;;
  esac
fi
exit 0
"""


@pytest.fixture
def unpacked(course, tmp_path) -> tuple[Path, Path, dict]:
    """The zip laid out as /autograder, a fake Python, and the environment to run setup.sh in."""
    root = autograder.unpack(build(course, tmp_path / "a.zip"), tmp_path / "autograder")
    fake = tmp_path / "fake" / "python3"
    fake.parent.mkdir()
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "SPECDECODE_CACHE")}
    env.update(AUTOGRADER_ROOT=str(root), SPECDECODE_PYTHON=str(fake), FAKE_LOG=str(tmp_path / "fake.log"),
               FAKE_VERSION="3.12.0", SPECDECODE_TORCH_INDEX="")
    env.pop("SPECDECODE_AUTOGRADER_VENV", None)
    return root, tmp_path / "fake.log", env


def setup_sh(root: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(root / "source" / "setup.sh")], cwd=root / "source", env=env,
                          capture_output=True, text=True, timeout=60)


def test_setup_never_replaces_a_folder_it_did_not_make(unpacked, tmp_path):
    root, log, env = unpacked
    theirs = tmp_path / "someone-elses-env"
    (theirs / "bin").mkdir(parents=True)
    (theirs / "bin" / "python").write_text(FAKE_PYTHON)
    (theirs / "bin" / "python").chmod(0o755)
    (theirs / "precious.txt").write_text("keep me\n")
    before = sorted(p.relative_to(theirs) for p in theirs.rglob("*"))
    proc = setup_sh(root, dict(env, SPECDECODE_AUTOGRADER_VENV=str(theirs)))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "was not made by this script" in proc.stderr and ".specdecode-autograder" in proc.stderr
    assert sorted(p.relative_to(theirs) for p in theirs.rglob("*")) == before
    assert (theirs / "precious.txt").read_text() == "keep me\n"
    assert not log.exists()  # it stopped before running any Python, let alone pip


def test_setup_stamp_covers_every_pin(unpacked):
    root, log, env = unpacked
    from specdecode_ref.models import EMBEDDED_PIN

    text = (root / "source" / "setup.sh").read_text()
    assert "import sys; print(sys.version)" in text and f'echo "embedded model: {EMBEDDED_PIN}"' in text
    assert "@EMBEDDED_PIN@" not in text and "@LAB@" not in text
    assert "PIP_VERSION=" in text and "UV_VERSION=" in text
    assert "DEBIAN_FRONTEND=noninteractive apt-get -y" in text and "Dpkg::Options::=--force-confdef" in text
    installs = [line for line in text.splitlines() if "install python3" in line or "update" in line and "apt" in line]
    assert installs and not any("/dev/null" in line for line in installs)  # apt's output is kept

    def run(**changes) -> str:
        log.unlink(missing_ok=True)
        proc = setup_sh(root, dict(env, **changes))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return log.read_text()

    venv = root / "source" / "venv"
    calls = run()
    pip_version = text.split("PIP_VERSION=")[1].split()[0]
    uv_version = text.split("UV_VERSION=")[1].split()[0]
    assert f"-m pip install --quiet pip=={pip_version} uv=={uv_version}" in calls
    assert f"uv pip install --quiet --python {venv}/bin/python --no-deps {EMBEDDED_PIN}" in calls.replace(
        " --find-links /opt/wheels", "")
    assert (venv / ".specdecode-autograder").is_file()
    sha = subprocess.run(["sha256sum", str(root / "source" / "course" / "requirements.txt")], capture_output=True,
                         text=True, check=True).stdout.split()[0]
    assert (venv / ".specdecode-stamp").read_text() == (
        f"requirements.txt sha256: {sha}\nembedded model: {EMBEDDED_PIN}\npip: {pip_version}\nuv: {uv_version}\n"
        f"torch index: \npython: 3.12.0 (fake build)\n")
    assert "pip install" not in run()  # the same pins: nothing installed again
    for change in ({"FAKE_VERSION": "3.12.1"}, {"SPECDECODE_TORCH_INDEX": "https://example.invalid/whl"}):
        assert "-m pip install" in run(**change), change  # another Python or torch index: rebuilt
        assert "-m pip install" not in run(**change), change
    requirements = root / "source" / "course" / "requirements.txt"
    requirements.write_text(requirements.read_text() + "# another pin\n")
    assert "-m pip install" in run(SPECDECODE_TORCH_INDEX="https://example.invalid/whl", FAKE_VERSION="3.12.1")

    if os.geteuid() == 0:  # root, as on Gradescope: the labs closed, the package and environment open
        subprocess.run(["chmod", "-R", "go-rwx", str(root)], check=True)  # even from a zip unpacked closed,
        env["SPECDECODE_TORCH_INDEX"] = "https://example.invalid/other"  # into an environment built
        proc = subprocess.run(["bash", "-c", 'umask 077 && exec bash "$0"', str(root / "source" / "setup.sh")],
                              cwd=root / "source", env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr  # with a umask that closes what it makes
        course_dir = root / "source" / "course"
        for p in (root, root / "source"):
            assert stat.S_IMODE(p.stat().st_mode) & 0o111 == 0o111, p
        assert stat.S_IMODE(course_dir.stat().st_mode) == 0o711
        for p in [course_dir / "labs", *(course_dir / "labs").rglob("*")]:
            assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, p
        for p in [course_dir / "requirements.txt", *(course_dir / "specdecode_ref").rglob("*"), *venv.rglob("*")]:
            mode = stat.S_IMODE(p.stat().st_mode)
            assert mode & 0o444 == 0o444 and (not p.is_dir() or mode & 0o111 == 0o111), p


def test_run_autograder_points_nothing_at_the_labs():
    text = (autograder.SCRIPTS / "run_autograder").read_text()
    exports = [line for line in text.splitlines() if line.strip().startswith("export")]
    assert exports and not any("labs" in line for line in exports)
    assert 'PYTHONPATH="$COURSE"' in text  # the course folder (the package), never $COURSE/labs
