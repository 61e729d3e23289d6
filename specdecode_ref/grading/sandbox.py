"""Where the student side runs: the strongest isolation this machine offers, and a measurement
of what it actually hides.

Modes, strongest first (the report names the one that graded each submission):

* ``namespace``: the grader is root. The student side runs as a numeric user id of its own (no
  other process has it), in a mount namespace with a root of its own that holds only the system's
  programs and libraries, the Python it runs, its environment, the course's package and its
  private folder (as bubblewrap builds one): not the labs with their hidden tests and answer
  keys, not ``.git``, the class's submissions, the grader's files or a copy of the course
  anywhere else on the disk. It has a network namespace of its own (no network). Every process
  of that user id is killed before a verdict is written.
* ``user``: root, but the kernel refuses namespaces (a container without that privilege, as
  Gradescope's may be). The own user id, the kill and file permissions remain: what the course
  leaves world-readable stays readable, so the autograder's setup.sh closes the lab folder.
* ``userns``: not root, but unprivileged user namespaces work: the same root of its own and no
  network, under the instructor's own user id (it can still signal the instructor's processes).
* ``process``: none of the above. A separate process is all: the submission can read what the
  instructor can read and can outlive its process group. Grade untrusted code another way.

Before the first submission, a probe runs in the chosen sandbox and tries to read the answer
key, the hidden tests and the class's folder; what it reached is recorded with the mode, so a
report never promises more than was measured.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # specdecode_ref/
COURSE_ROOT = PACKAGE_DIR.parent
UID_RANGE = (61000, 64999)  # numeric user ids for student sides (no account needed)
FILE_LIMIT = 64 << 20  # bytes: the largest file (its log included) a student side may write
PRIVATE_SIZE = "256m"  # its private folder, in memory, in the namespace modes
MODES = ("namespace", "user", "userns", "process")

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWIPC = 0x00020000, 0x10000000, 0x40000000, 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
PR_SET_DUMPABLE = 4

GUARANTEES = {
    "namespace": "a user id of its own; a root of its own with the system, Python, the environment and the "
                 "course's package only (no labs, no class folder, no grader files); no network; every process "
                 "killed before the verdict",
    "user": "a user id of its own and every process killed before the verdict; files are hidden only where their "
            "permissions close them to other users",
    "userns": "a root of its own with the system, Python, the environment and the course's package only; no "
              "network; the instructor's own user id, so its processes may outlive the grading",
    "process": "a separate process only: the submission can read whatever the instructor can, and can outlive "
               "the grading; do not grade untrusted code in this mode",
}


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def no_core_dumps_of_me() -> None:
    """Make this (the judging) process undumpable: its /proc files then belong to root, so a
    student side under the same user id cannot open its pipes or read its memory."""
    try:
        _libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


@dataclass
class Sandbox:
    mode: str
    _cgroup = None  # the cgroup of the student side being started (root modes, where cgroups can be made)
    extra_visible: list = field(default_factory=list)  # more paths its root holds (read-only)
    uid: int | None = None
    probe: dict = field(default_factory=dict)

    def for_one_judge(self) -> "Sandbox":
        """The same mode with a user id of its own (the probe's findings hold for it too)."""
        import dataclasses

        if self.uid is None:
            return self
        return dataclasses.replace(self, uid=_free_uid())

    # --- starting ------------------------------------------------------------------------------
    def _preexec(self, private: Path | None = None):
        """The function the student side's process runs between fork and exec: a session of its
        own, no core dumps and, in the namespace modes, a root of its own that holds only what
        Python needs (see :func:`visible_paths`) plus its private folder; then its own user id."""
        mode, uid = self.mode, self.uid
        root = tempfile.mkdtemp(prefix="specdecode-root-") if mode in ("namespace", "userns") else None
        self._stage_root = root
        binds = [(p, os.path.isdir(p)) for p in visible_paths(self.extra_visible)]
        source = Path(private) / "student.py" if private is not None else None
        student_bytes = source.read_bytes() if source is not None and source.is_file() else b""
        cgroup = self._cgroup
        links = [(p, os.readlink(p)) for p in SYSTEM_PATHS if os.path.islink(p)]  # /lib -> usr/lib, ...
        writable = [str(private)] if private is not None else []
        outer_uid, outer_gid = os.getuid(), os.getgid()

        def setup():
            import resource

            os.setsid()
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))  # no file (or log) fills the disk
            if cgroup:  # its CPU, its children's included, is then counted where it cannot hide it
                try:
                    with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                        f.write(str(os.getpid()))
                except OSError:
                    pass
            libc = _libc()
            if root is not None:
                flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | (CLONE_NEWUSER if mode == "userns" else 0)
                _check(libc.unshare(flags), "unshare")
                if mode == "userns":
                    for name, text in (("setgroups", "deny"), ("uid_map", f"{outer_uid} {outer_uid} 1"),
                                       ("gid_map", f"{outer_gid} {outer_gid} 1")):
                        with open(f"/proc/self/{name}", "w") as f:
                            f.write(text)
                _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
                _check(libc.mount(b"tmpfs", root.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=16m,mode=755"),
                       "a root of its own")
                for path, is_dir in binds:
                    target = root + path
                    if is_dir:
                        os.makedirs(target, exist_ok=True)
                    else:
                        os.makedirs(os.path.dirname(target), exist_ok=True)
                        open(target, "a").close()
                    _check(libc.mount(path.encode(), target.encode(), None, MS_BIND | MS_REC, None), f"bind {path}")
                    if path not in writable and path not in ("/dev", "/proc"):
                        libc.mount(None, target.encode(), None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID, None)
                for path, target in links:
                    if not os.path.lexists(root + path):
                        os.symlink(target, root + path)
                if os.path.isdir(root + "/dev/shm"):  # the host's shared memory is not shared with it
                    libc.mount(b"tmpfs", (root + "/dev/shm").encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                               b"size=64m,mode=1777")
                os.makedirs(root + "/tmp", mode=0o755, exist_ok=True)
                for w in writable:  # its private folder: a small memory file system with its one file
                    os.makedirs(root + w, exist_ok=True)
                    _check(libc.mount(b"tmpfs", (root + w).encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                                      f"size={PRIVATE_SIZE},mode=700".encode()), "private folder")
                    with open(root + w + "/student.py", "wb") as f:
                        f.write(student_bytes)
                    os.mkdir(root + w + "/cache")
                    if uid is not None:
                        for q in (w, w + "/student.py", w + "/cache"):
                            os.chown(root + q, uid, uid)
                os.chdir(root)
                _check(libc.chroot(b"."), "chroot")
                os.chdir(str(private) if private is not None else "/")
            if uid is not None:
                resource.setrlimit(resource.RLIMIT_NPROC, (512, 512))  # per user id: this one alone
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)

        return setup

    def private_dir(self, source: Path) -> Path:
        """A fresh folder holding a copy of the submission's bytes as ``student.py`` (never a
        link), readable by the student side's user alone."""
        d = Path(tempfile.mkdtemp(prefix="specdecode-student-"))
        target = d / "student.py"
        target.write_bytes(Path(source).read_bytes())
        (d / "cache").mkdir()
        if self.uid is not None:
            for p in (d, target, d / "cache"):
                os.chown(p, self.uid, self.uid)
        os.chmod(d, 0o700)
        return d

    def env(self, private: Path, threads: int) -> dict:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(private), "TMPDIR": str(private),
               "PYTHONPATH": str(COURSE_ROOT), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
               "PYTHONHASHSEED": "0", "MPLBACKEND": "Agg", "SPECDECODE_CACHE": str(private / "cache"),
               "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "NO_COLOR": "1",
               "LANG": os.environ.get("LANG", "C.UTF-8")}
        for var in ("SPECDECODE_BACKEND", "SPECDECODE_DTYPE"):
            if var in os.environ:
                env[var] = os.environ[var]
        return env

    def start(self, submission: Path, log, threads: int = 1) -> "StudentProcess":
        private = self.private_dir(submission)
        self._cgroup = new_cgroup(self.uid) if self.uid is not None else None
        cmd = [sys.executable, "-B", "-m", "specdecode_ref.grading.student_side", str(private / "student.py")]
        try:
            proc = subprocess.Popen(cmd, cwd=private, env=self.env(private, threads), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=log, preexec_fn=self._preexec(private),
                                    close_fds=True)
        finally:
            self._remove_stages()
        return StudentProcess(self, proc, private, self._cgroup)

    def _remove_stages(self):
        """The empty folder the child's own root was mounted on (it matters only inside the child)."""
        root = getattr(self, "_stage_root", None)
        if root:
            shutil.rmtree(root, ignore_errors=True)
            self._stage_root = None

    # --- stopping ------------------------------------------------------------------------------
    def kill_all(self, proc: subprocess.Popen | None = None) -> None:
        """Stop the student side and everything it started: every process of its user id where it
        has one of its own (a detached process cannot escape), else its session."""
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.uid is not None:
            for _ in range(50):
                pids = processes_of(self.uid)
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                time.sleep(0.02)
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


class StudentProcess:
    def __init__(self, sandbox: Sandbox, proc: subprocess.Popen, private: Path, cgroup: str | None = None):
        self.sandbox, self.proc, self.private, self.cgroup = sandbox, proc, private, cgroup
        self.fd_out = proc.stdin.fileno()  # our requests
        self.fd_in = proc.stdout.fileno()  # its replies
        self.seen: dict = {}  # (pid, start time) -> CPU seconds last read, for processes of its user id

    def cpu_seconds(self) -> float:
        """CPU time of the student side and everything it started, read by the grader (the
        submission cannot change it): its cgroup's count where the grader made one (exact, exited
        processes included); else the sum over every process of its user id as last seen; else
        its own process and the children it reaped."""
        if self.cgroup:
            try:
                with open(os.path.join(self.cgroup, "cpu.stat")) as f:
                    for line in f:
                        if line.startswith("usage_usec"):
                            return int(line.split()[1]) / 1e6
            except (OSError, ValueError, IndexError):
                pass
        pids = processes_of(self.sandbox.uid) if self.sandbox.uid is not None else [self.proc.pid]
        for pid in pids:
            cpu, start = _proc_cpu(pid)
            if cpu is not None:
                self.seen[(pid, start)] = max(cpu, self.seen.get((pid, start), 0.0))
        return sum(self.seen.values())

    def stop(self) -> None:
        self.sandbox.kill_all(self.proc)
        remove_cgroup(self.cgroup)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        shutil.rmtree(self.private, ignore_errors=True)


def _proc_cpu(pid: int) -> tuple:
    """(CPU seconds of a process and of the children it reaped, its start time), or (None, None)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return sum(int(fields[i]) for i in (11, 12, 13, 14)) / os.sysconf("SC_CLK_TCK"), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None, None


def _cgroup2_root() -> str | None:
    """A cgroup version 2 hierarchy this (root) process may create groups in, or None."""
    if os.geteuid() != 0:
        return None
    try:
        with open("/proc/self/mounts") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    for m in mounts:
        if len(m) > 2 and m[2] == "cgroup2" and os.access(m[1], os.W_OK):
            return m[1]
    return None


def new_cgroup(uid: int) -> str | None:
    root = _cgroup2_root()
    if root is None:
        return None
    path = os.path.join(root, f"specdecode-student-{uid}-{os.getpid()}-{time.time_ns()}")
    try:
        os.mkdir(path)
        return path
    except OSError:
        return None


def remove_cgroup(path: str | None) -> None:
    """Kill whatever is left in the group (cgroup.kill, where the kernel has it) and remove it."""
    if not path:
        return
    for _ in range(100):
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                pids = [int(x) for x in f.read().split()]
        except OSError:
            break
        if not pids:
            break
        try:
            with open(os.path.join(path, "cgroup.kill"), "w") as f:
                f.write("1")
        except OSError:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        time.sleep(0.02)
    try:
        os.rmdir(path)
    except OSError:
        pass


def processes_of(uid: int) -> list:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as f:
                    for line in f:
                        if line.startswith("Uid:"):
                            if int(line.split()[1]) == uid:
                                pids.append(int(entry))
                            break
            except (OSError, ValueError, IndexError):
                continue
    return pids


_RESERVED: set = set()  # user ids handed out by this process and not yet released


def _free_uid() -> int:
    """A numeric user id that no process uses now and that this process has not handed out: one
    per judging process, so two submissions graded at once never share a user."""
    import random
    import threading

    with _LOCK.setdefault("lock", threading.Lock()):
        uid = _pick_uid(random)
        _RESERVED.add(uid)
        return uid


_LOCK: dict = {}


def release_uid(uid: int | None) -> None:
    _RESERVED.discard(uid)


def _pick_uid(random) -> int:
    rng = random.Random(os.getpid() ^ time.time_ns())
    used = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                used.add(os.stat(f"/proc/{entry}").st_uid)
            except OSError:
                pass
    for _ in range(1000):
        uid = rng.randint(*UID_RANGE)
        if uid not in used and uid not in _RESERVED:
            return uid
    raise RuntimeError("no free user id for the student side")


SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/dev", "/proc")


def visible_paths(extra=()) -> list:
    """Everything the student side's root holds besides its private folder: the system's programs
    and libraries, the Python it runs (wherever it lives: a pyenv under a closed /root included),
    its environment and the course's package. Not the rest of the course (labs, .git), not /home,
    /root, /tmp or /work: a copy of the course anywhere else on the disk stays out of reach too."""
    wanted = [*SYSTEM_PATHS, sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable)),
              str(PACKAGE_DIR), *map(str, extra)]
    out: list = []
    for p in sorted({os.path.realpath(p) for p in wanted if p and os.path.exists(p)}, key=len):
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            out.append(p)
    return out


PROBE = r"""
import json, os, sys, socket
secrets = json.loads(sys.argv[1])
reached = []
for path in secrets:
    try:
        with open(path, "rb") as f:
            f.read(1)
        reached.append(path)
    except OSError:
        pass
net = True
try:
    socket.create_connection(("1.1.1.1", 53), timeout=0.5).close()
except OSError:
    net = False
sys.stdout.write(json.dumps({"reached": reached, "uid": os.getuid(), "network": net}))
"""


def _run_probe(box: Sandbox, secrets: list) -> dict:
    """Run the probe from a helper process of its own: starting a sandbox forks with a function to
    run before exec, which is safe only in a process without other threads (a grader grading
    several labs at once has them)."""
    import json

    job = json.dumps({"mode": box.mode, "extra_visible": box.extra_visible, "uid": box.uid, "secrets": secrets})
    try:
        out = subprocess.run([sys.executable, "-B", str(Path(__file__).resolve()), job], capture_output=True, text=True,
                             timeout=60, env={**os.environ, "PYTHONPATH": str(COURSE_ROOT)})
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        return {"ok": False, "why": f"the probe could not run: {type(exc).__name__}: {exc}"}


def _probe_here(box: Sandbox, secrets: list) -> dict:
    import json

    with tempfile.TemporaryDirectory() as tmp:
        if box.uid is not None:
            os.chown(tmp, box.uid, box.uid)
        try:
            out = subprocess.run([sys.executable, "-c", PROBE, json.dumps([str(s) for s in secrets])], cwd=tmp,
                                 env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp},
                                 capture_output=True, text=True, timeout=30, preexec_fn=box._preexec(Path(tmp)))
        except (OSError, subprocess.SubprocessError) as exc:
            return {"ok": False, "why": f"{type(exc).__name__}: {exc}"}
        finally:
            box._remove_stages()
        box.kill_all()
        if out.returncode != 0:
            return {"ok": False, "why": (out.stderr.strip().splitlines() or ["exit %d" % out.returncode])[-1]}
        try:
            return dict(json.loads(out.stdout), ok=True)
        except ValueError:
            return {"ok": False, "why": "the probe printed no verdict"}


def choose(secrets: list, want: str | None = None) -> Sandbox:
    """The strongest mode that works here (or ``want``), with its probe: which of ``secrets``
    (answer keys, hidden tests, other students' files) the student side could still read."""
    is_root = os.geteuid() == 0
    order = [m for m in MODES if (m in ("namespace", "user")) == is_root or m == "process"]
    if want:
        if want not in MODES:
            raise ValueError(f"isolation must be one of {', '.join(MODES)}, not {want!r}")
        order = [want]
    why = []
    for mode in order:
        box = Sandbox(mode, uid=_free_uid() if mode in ("namespace", "user") else None)
        probe = _run_probe(box, secrets)
        if probe.get("ok"):
            box.probe = dict(probe, refused=why)
            return box
        why.append(f"{mode}: {probe.get('why')}")
    raise RuntimeError("no way to start the student side: " + "; ".join(why))


if __name__ == "__main__":  # the probe's helper process (see _run_probe)
    import json

    _job = json.loads(sys.argv[1])
    _secrets = _job.pop("secrets")
    print(json.dumps(_probe_here(Sandbox(**_job), _secrets)))
