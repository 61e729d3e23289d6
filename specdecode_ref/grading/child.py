"""Inside a grading process: pytest runs a lab's grading tests against one submission (or, for
trusted code, several in turn) and the recorder reports each verdict to the grader.

The runner starts this file as a script (``python .../grading/child.py JOB``), not with ``-m``:
importing the package would load torch and transformers into every grading process, even for
labs that need only numpy.

How a verdict reaches the grader, and why the submission cannot rewrite it:

* every verdict is written, the moment a test ends, to a pipe the grader reads while the
  process runs (no file on disk that a hook at exit could rewrite later);
* the recorder notes the identity of pytest's machinery (how a test is called and reported),
  of the hooks registered with pytest, of every test function's code and of the grading
  modules' globals before the submission is imported, and reports any change;
* the grader adds a canary test that fails on purpose; it must be reported failed, and pytest's
  exit status must say "some tests failed";
* the grader compares the verdicts with pytest's own summary (one line per test) and with the
  process's exit status. Any disagreement marks the submission "tampered".
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

_write = os.write  # kept before any submission is imported: patching os.write does not reach us
_dumps = json.dumps
_perf_counter = time.perf_counter

WATCHED_HOOKS = ("pytest_runtest_protocol", "pytest_runtest_setup", "pytest_runtest_call", "pytest_runtest_teardown",
                 "pytest_runtest_makereport", "pytest_runtest_logreport", "pytest_runtest_logfinish", "pytest_pyfunc_call",
                 "pytest_runtestloop", "pytest_report_teststatus", "pytest_terminal_summary", "pytest_sessionfinish")


def _register_package() -> None:
    """Make ``specdecode_ref.grading`` importable without importing ``specdecode_ref`` itself
    (whose ``__init__`` imports torch and transformers)."""
    pkg_dir = Path(__file__).resolve().parent
    if "specdecode_ref.grading" in sys.modules:
        return
    spec = importlib.util.spec_from_file_location("specdecode_ref.grading", pkg_dir / "__init__.py",
                                                  submodule_search_locations=[str(pkg_dir)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["specdecode_ref.grading"] = module
    spec.loader.exec_module(module)


def _first_line(text, limit: int = 300) -> str:
    text = " ".join(str(text).strip().split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Channel:
    """JSON lines on the pipe the grader reads."""

    def __init__(self, fd: int, sub: int):
        self.fd, self.sub = fd, sub

    def send(self, event: str, **data) -> None:
        line = _dumps({"sub": self.sub, "ev": event, **data}) + "\n"
        payload = line.encode()
        while payload:
            n = _write(self.fd, payload)
            payload = payload[n:]


def _static(obj, name):
    """An attribute as stored in a class or module dict (classmethods as the descriptor)."""
    for klass in (obj.__mro__ if isinstance(obj, type) else (obj,)):
        d = vars(klass)
        if name in d:
            return d[name]
    return getattr(obj, name, None)


def _machinery() -> dict:
    """What decides whether a test passed, by name: pytest's runner, reports and test calls."""
    import _pytest.main
    import _pytest.python
    import _pytest.reports
    import _pytest.runner

    watched = {
        "runner.call_and_report": _static(_pytest.runner, "call_and_report"),
        "runner.runtestprotocol": _static(_pytest.runner, "runtestprotocol"),
        "runner.call_runtest_hook": _static(_pytest.runner, "call_runtest_hook"),
        "runner.pytest_runtest_makereport": _static(_pytest.runner, "pytest_runtest_makereport"),
        "runner.CallInfo.from_call": _static(_pytest.runner.CallInfo, "from_call"),
        "reports.TestReport.from_item_and_call": _static(_pytest.reports.TestReport, "from_item_and_call"),
        "reports.TestReport.__init__": _static(_pytest.reports.TestReport, "__init__"),
        "python.Function.runtest": _static(_pytest.python.Function, "runtest"),
        "python.pytest_pyfunc_call": _static(_pytest.python, "pytest_pyfunc_call"),
        "main.pytest_runtestloop": _static(_pytest.main, "pytest_runtestloop"),
    }
    for name, value in vars(Recorder).items():
        if callable(value):
            watched[f"Recorder.{name}"] = value
    for name in ("send", "__init__"):
        watched[f"Channel.{name}"] = vars(Channel)[name]
    return watched


class Recorder:
    """pytest plugin: the points and outcome of every test, sent to the grader as they happen."""

    def __init__(self, channel: Channel, test_timeout: float, hidden_files: set, canary: str, watched_modules: list):
        from specdecode_ref.grading.api import GradingTimeout, LabLoadError

        self.GradingTimeout, self.LabLoadError = GradingTimeout, LabLoadError
        self.channel = channel
        self.test_timeout = test_timeout
        self.hidden_files = hidden_files
        self.canary = canary
        self.watched_modules = watched_modules
        self.tests: dict = {}
        self.tampered: set = set()
        self.t0 = _perf_counter()
        self.machinery = _machinery()
        self.hooks = None
        self.codes: dict = {}
        self.globals: dict = {}
        self.in_phase = False

    # --- integrity ---------------------------------------------------------------------------
    def _hook_snapshot(self, config) -> dict:
        snap = {}
        for name in WATCHED_HOOKS:
            caller = getattr(config.hook, name, None)
            if caller is not None:
                snap[name] = tuple((impl.plugin_name, id(impl.function)) for impl in caller.get_hookimpls())
        return snap

    def _module_snapshot(self, modules) -> None:
        for mod in modules:
            if mod is not None and mod.__name__ not in self.globals:
                self.globals[mod.__name__] = (mod, {k: v for k, v in vars(mod).items() if not k.startswith("__")})

    def _check(self, item=None) -> None:
        problems = []
        now = _machinery()
        problems += [f"pytest's {name} was replaced" for name, fn in self.machinery.items() if now.get(name) is not fn]
        if self.hooks is not None and self._hook_snapshot(item.config if item else self.config) != self.hooks:
            problems.append("pytest's hooks were changed (a plugin registered or removed while testing)")
        for nodeid, (fn, code) in self.codes.items():
            if getattr(fn, "__code__", None) is not code:
                problems.append(f"the code of test {nodeid.split('::', 1)[-1]} was replaced")
        for name, (mod, snap) in self.globals.items():
            d = vars(mod)
            changed = [k for k, v in snap.items() if d.get(k, snap) is not v]
            if changed:
                problems.append(f"{name}.{changed[0]} was replaced")
        for p in problems:
            if p not in self.tampered:
                self.tampered.add(p)
                self.channel.send("tampered", why=p)

    # --- pytest hooks --------------------------------------------------------------------------
    def pytest_configure(self, config):
        self.config = config

    def pytest_collectreport(self, report):
        if report.failed:
            self.channel.send("collect_error", message=_first_line(report.longreprtext, 2000))

    def pytest_collection_modifyitems(self, session, config, items):
        names, tests = {}, []
        for item in items:
            fn = getattr(item, "function", None)
            file = Path(str(item.path)).name
            name = item.nodeid.split("::", 1)[-1]
            canary = name == self.canary
            if name in names:
                name = f"{file}::{name}"
            names[name] = True
            doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
            rec = {"key": [file, item.nodeid.split("::", 1)[-1]], "name": name, "file": file,
                   "points": float(getattr(fn, "__grading_points__", 1.0)),
                   "chance": float(getattr(fn, "__grading_chance__", 0.0)),
                   "hidden": file in self.hidden_files, "doc": doc[0] if doc else "", "canary": canary}
            self.tests[item.nodeid] = dict(rec, outcome="not run", message="", earned=0.0)
            tests.append(rec)
            if fn is not None:
                self.codes[item.nodeid] = (fn, fn.__code__)
        self._module_snapshot([getattr(item, "module", None) for item in items])
        self._module_snapshot([sys.modules.get(m) for m in self.watched_modules])
        self.hooks = self._hook_snapshot(config)
        self.channel.send("collected", tests=tests)

    # --- the per-test time limit ---------------------------------------------------------------
    # The limit counts the grading process's own CPU time (ITIMER_PROF), not the wall clock: on a
    # busy machine (a class graded with --jobs, a test suite beside it) a test waits longer for the
    # CPU but does not use more of it, so an honest submission is not cut short by someone else's
    # load, while an endless loop still burns CPU and is stopped. Code that blocks without using the
    # CPU (a sleep, a deadlock) is stopped by the runner's limit on the whole submission.
    #
    # The timeout is raised only inside a test's setup, call or teardown, never inside pytest's own
    # reporting or the recorder: raised there it would break pytest itself (an INTERNALERROR, no
    # summary, no canary verdict), which the grader cannot tell from tampering.
    def _alarm(self, signum, frame):
        if self.in_phase:
            raise self.GradingTimeout(f"test used more than {self.test_timeout:g} s of CPU time")

    def _arm(self):
        if self.test_timeout and hasattr(signal, "SIGPROF"):
            signal.signal(signal.SIGPROF, self._alarm)
            # Re-fires every CPU second in case the first one is swallowed by a bare `except:`.
            signal.setitimer(signal.ITIMER_PROF, self.test_timeout, 1.0)

    def _disarm(self):
        if self.test_timeout and hasattr(signal, "SIGPROF"):
            signal.setitimer(signal.ITIMER_PROF, 0)
            signal.signal(signal.SIGPROF, signal.SIG_IGN)

    def _phase(self):
        self.in_phase = True
        try:
            return (yield)
        finally:
            self.in_phase = False

    # Innermost wrappers (trylast): the limit applies to the fixtures and the test, not to the
    # other plugins' wrappers around them.
    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_setup(self, item):
        return (yield from self._phase())

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_call(self, item):
        return (yield from self._phase())

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_teardown(self, item, nextitem):
        return (yield from self._phase())

    def pytest_runtest_protocol(self, item, nextitem):
        self._arm()  # covers fixture setup (importing the submission), the test and teardown

    def pytest_runtest_makereport(self, item, call):
        self._check(item)
        rec = self.tests.get(item.nodeid)
        if rec is None:
            return
        if call.excinfo is None:
            if call.when == "call" and rec["outcome"] == "not run":
                rec["outcome"], rec["earned"] = "passed", rec["points"]
        elif rec["outcome"] in ("not run", "passed"):  # the first failure wins
            exc = call.excinfo.value
            if call.excinfo.errisinstance(NotImplementedError):
                outcome, msg = "not implemented", _first_line(exc) or "NotImplementedError"
            elif call.excinfo.errisinstance(self.GradingTimeout):
                outcome, msg = "timeout", str(exc)
            elif call.excinfo.typename == "Skipped":
                outcome, msg = "skipped", _first_line(exc)
            elif call.excinfo.errisinstance(AssertionError):
                outcome, msg = "failed", _first_line(exc) or "assertion failed"
            else:
                outcome = "error" if call.when == "call" else f"error in {call.when}"
                msg = f"{call.excinfo.typename}: {_first_line(exc)}"
            if isinstance(exc, self.LabLoadError) or "LabLoadError" in call.excinfo.typename:
                outcome = "load error"
            rec["outcome"], rec["message"], rec["earned"] = outcome, msg, 0.0

    def pytest_runtest_logfinish(self, nodeid, location):
        self._disarm()
        rec = self.tests.get(nodeid)
        if rec is not None:
            self.channel.send("test", key=rec["key"], outcome=rec["outcome"], message=rec["message"],
                              earned=rec["earned"])

    def pytest_sessionfinish(self, session, exitstatus):
        self._check()
        self.channel.send("finished", exitstatus=int(exitstatus), duration_s=round(_perf_counter() - self.t0, 2))


def child_main(job_path: str) -> int:
    """Grade the submissions listed in a job file; the exit status is pytest's for the last one."""
    job = json.loads(Path(job_path).read_text())
    ini = Path(job["workdir"]) / "pytest.ini"
    ini.write_text("[pytest]\n")
    hidden = {Path(f).name for f in job["hidden_files"]}
    fd = job["verdict_fd"]
    watched = ["specdecode_ref.grading.api", "specdecode_ref.grading"]
    if any("chi2_pvalue" in Path(f).read_text() for f in job["files"]):
        import specdecode_ref.measure.stats  # noqa: F401  (loaded before any submission, so that it is watched)
        watched.append("specdecode_ref.measure.stats")
    status = 0
    for i, sub in enumerate(job["submissions"]):
        os.environ[job["impl_env"]] = sub["path"]
        print(f"===== grading {sub['name']}: {sub['path']}", flush=True)
        channel = Channel(fd, i)
        channel.send("start")
        recorder = Recorder(channel, job["test_timeout"], hidden, job["canary"], watched)
        args = [*job["files"], job["canary_file"], "-v", "-p", "no:cacheprovider", "--noconftest",
                "-c", str(ini), "--rootdir", job["lab_dir"], "-o", "addopts=", "-o", "python_files=grading_*.py",
                "-W", "ignore::DeprecationWarning", "--tb=short", "-r", "fEsxXp", "--color=no"]
        try:
            status = int(pytest.main(args, plugins=[recorder]))
        except BaseException as exc:  # noqa: BLE001 - keep grading the next submission
            print(f"grader: pytest stopped with {type(exc).__name__}: {exc}", flush=True)
            status = 3
        recorder._disarm()  # a pytest that stopped early never reached the last test's end
        print(f"===== done {sub['name']}", flush=True)
        sys.stdout.flush()
    return status


if __name__ == "__main__":
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        sys.path.pop(0)  # run as a script: do not expose the package's modules as top-level ones
    _register_package()
    sys.exit(child_main(sys.argv[1]))
