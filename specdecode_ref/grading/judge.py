"""The judging side of grading: the lab's tests run here, against a submission that runs in a
process of its own (:mod:`.student_side`), and every verdict is decided here.

Nothing of the submission is imported into this process. A test's ``lab`` is a :class:`RemoteLab`:
``lab.f(x)`` sends ``x`` as data to the student side, which calls the student's ``f`` and sends
the result back as data (or as a handle, for an object such as a proposer, whose methods are
called the same way). So a grading file reads as before, ``assert lab.f(x) == want``, and a
submission cannot reach pytest, the tests, the answer key or the verdicts: it only ever sees
the arguments of its own calls.

Limits: a test may use ``test_timeout`` CPU seconds of the student side (read from /proc, which
the submission cannot change) and as many of this process; a test that blocks is stopped at
``WALL_FACTOR`` times that on the wall clock. The student side is then killed, and the next test
starts a fresh one.

Run by the runner as ``python -m specdecode_ref.grading.judge JOB.json``; verdicts go as JSON
lines to the pipe the job names (this process is trusted, so the runner believes them).
"""
from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from pathlib import Path

import pytest

WALL_FACTOR = 4.0


class ProtocolError(Exception):
    """The student side answered with something the protocol does not allow."""


class StudentSide:
    """One running student side for one submission, and the limits of the test in progress."""

    def __init__(self, sandbox, submission: Path, log_path: Path, threads: int = 1, test_timeout: float = 20.0):
        self.sandbox, self.submission, self.log_path = sandbox, Path(submission), Path(log_path)
        self.threads, self.test_timeout = threads, test_timeout
        self.proc = None
        self.generation = 0  # bumped at every restart: handles of a killed student side are void
        self.callbacks: dict = {}
        self.models: dict = {}  # id(model) -> (key, model): sent once per student side
        self.lists: dict = {}  # id(list) -> (key, list, snapshot)
        self.next_key = 1
        self.cpu0 = 0.0
        self.cpu_spent = 0.0  # CPU of student sides already stopped during this test
        self.waited = 0.0  # seconds this test has waited for the student side's replies
        self.wait0 = time.perf_counter()
        self.pending_models: list = []
        self.load_error = None
        self.broken = None
        self.remotes: dict = {}  # handle id -> its one proxy, so ``a is b`` holds for one student object

    # --- life cycle ----------------------------------------------------------------------------
    def ensure(self):
        from .api import LabLoadError

        if self.broken is not None:  # once the protocol is broken, nothing more is asked of this submission
            raise ProtocolError(self.broken)
        if self.load_error is not None:  # a file that does not import is not imported again for every test
            raise LabLoadError(self.load_error)
        if self.proc is not None and self.proc.proc.poll() is None:
            return
        if self.proc is not None:  # it died (or was stopped): a fresh one, with fresh state
            self.stop()
        with open(self.log_path, "ab") as log:
            self.proc = self.sandbox.start(self.submission, log, self.threads)
        self.generation += 1
        self.models.clear()
        self.lists.clear()
        self.remotes.clear()
        try:
            reply = self._exchange({"op": "load"})
        except RuntimeError as exc:  # the process ended while importing the file
            self.load_error = f"could not import your file: {exc}"
            raise LabLoadError(self.load_error) from None
        if "error" in reply:
            err = reply["error"]
            self.load_error = f"could not import your file: {err.get('type')}: {err.get('message')}"
            raise LabLoadError(self.load_error)

    def stop(self):
        if self.proc is not None:
            self.cpu_spent += max(0.0, self.proc.cpu_seconds() - self.cpu0)
            self.proc.stop()
            self.proc = None
            self.cpu0 = 0.0

    def begin_test(self):
        self.waited = 0.0
        self.cpu_spent = 0.0
        self.cpu0 = self.proc.cpu_seconds() if self.proc is not None else 0.0

    # --- the channel ---------------------------------------------------------------------------
    def _limits(self):
        from .api import GradingTimeout

        if not self.test_timeout:
            return
        cpu = self.cpu_spent + (self.proc.cpu_seconds() - self.cpu0 if self.proc is not None else 0.0)
        wall = self.waited + (time.perf_counter() - self.wait0)  # time spent waiting for the student side
        if cpu > self.test_timeout:
            self.stop()
            raise GradingTimeout(f"test used more than {self.test_timeout:g} s of CPU time")
        if wall > WALL_FACTOR * self.test_timeout:
            self.stop()
            raise GradingTimeout(f"test ran {wall:.0f} s on the wall clock ({WALL_FACTOR:g} times its "
                                 f"{self.test_timeout:g} s of CPU time) while using {cpu:.0f} s of CPU: blocked")

    def _exchange(self, request: dict) -> dict:
        """Send one request; answer the callbacks it makes; return its reply."""
        from . import wire

        proc = self.proc
        try:
            wire.send(proc.fd_out, request)
        except OSError:
            return self._died()
        while True:
            self.wait0 = time.perf_counter()
            try:
                while True:
                    ready, _, _ = select.select([proc.fd_in], [], [], 0.05)
                    if ready:
                        break
                    self._limits()
            finally:
                self.waited += time.perf_counter() - self.wait0
                self.wait0 = time.perf_counter()
            try:
                reply = wire.receive(proc.fd_in)
            except wire.ChannelClosed:
                return self._died()
            except wire.WireError as exc:
                self._break(f"the student side sent an unreadable reply ({exc})")
            if not isinstance(reply, dict):
                self._break("the student side sent a reply that is not an object")
            if "callback" in reply:
                self._answer_callback(reply)
                continue
            return reply

    def _break(self, why: str):
        self.stop()
        self.broken = why
        raise ProtocolError(why)

    def _died(self):
        rc = self.proc.proc.poll() if self.proc is not None else None
        self.stop()
        raise RuntimeError(f"the process running your code ended (exit status {rc}): a crash, exit() or "
                           "os._exit() in your code")

    def _answer_callback(self, reply: dict):
        from . import wire

        fn = self.callbacks.get(reply.get("callback"))
        try:
            if fn is None:
                raise ProtocolError("a callback the test never sent")
            args = self.decode(reply.get("args", []))
            kwargs = self.decode(reply.get("kwargs", {"$": "dict", "items": []}))
            value = fn(*args, **{str(k): v for k, v in kwargs.items()})
            message = {"op": "return", "value": self.encode(value)}
        except BaseException as exc:  # noqa: BLE001 - the test's own callback failed: the student side is told
            if isinstance(exc, (KeyboardInterrupt,)):
                raise
            failed = exc
            message = {"op": "raise", "message": wire.safe_text(lambda: f"{type(failed).__name__}: {failed}", 500)}
            self._callback_error = exc
        wire.send(self.proc.fd_out, message)

    def request(self, request: dict):
        """One request with its reply decoded; the student's exception raised as such."""
        self.ensure()
        sent: dict = {}
        self.pending_models = []
        if "args" in request:
            try:
                request["args"] = self.encode(list(request["args"]), sent, top=True)
                request["kwargs"] = self.encode(dict(request["kwargs"]), sent, top=True)
            except BaseException:
                for key in self.pending_models:  # never sent: describe them in full next time
                    self.models.pop(key, None)
                raise
        self._callback_error = None
        try:
            reply = self._exchange(request)
            if self._callback_error is not None and isinstance(self._callback_error, AssertionError):
                raise self._callback_error  # a check the test ran inside a callback failed
            if "error" in reply:
                raise student_error(reply["error"])
            if "ok" not in reply:
                raise ProtocolError("a reply with neither a value nor an error")
            self.apply_changes(reply.get("changed", []), sent)
            value = self.decode(reply["ok"])
        except ProtocolError as exc:
            if self.broken is None:
                self._break(str(exc))
            raise
        _warn_again(reply.get("warnings"))
        return value

    # --- values --------------------------------------------------------------------------------
    def encode(self, value, sent: dict | None = None, top: bool = False):
        from . import wire

        sent = {} if sent is None else sent

        def extra(v):
            return self._describe(v, sent)

        if top:  # a list argument keeps its identity across calls, and what the call changes in it
            items = value if isinstance(value, list) else list(value.values())
            out = []
            torch = sys.modules.get("torch")
            for v in items:
                if isinstance(v, list):
                    out.append(self._list(v, sent))
                elif torch is not None and type(v) is torch.Tensor:  # what the call changes in place comes back
                    out.append({"$": "mtensor", "ref": self._ref(v, sent), "tensor": wire.encode_tensor(v)})
                else:
                    out.append(wire.encode(v, extra))
            if isinstance(value, dict):
                return {"$": "dict", "items": [[k, o] for k, o in zip(value.keys(), out)]}
            return out
        return wire.encode(value, extra)

    def _ref(self, obj, sent: dict) -> int:
        ref = len(sent) + 1
        sent[ref] = obj
        return ref

    def _list(self, lst: list, sent: dict) -> dict:
        from . import wire

        entry = self.lists.get(id(lst))
        if entry is None or entry[1] is not lst:
            entry = (self.next_key, lst, [])
            self.next_key += 1
        key, _, snapshot = entry
        keep = 0
        for a, b in zip(snapshot, lst):
            if a is not b and a != b:
                break
            keep += 1
        self.lists[id(lst)] = (key, lst, list(lst))
        return {"$": "list", "key": key, "keep": keep, "ref": self._ref(lst, sent),
                "counting": bool(getattr(lst, "count_reads", False)),
                "items": wire.encode(list(lst[keep:]), lambda v: self._describe(v, sent))}

    def _describe(self, v, sent: dict):
        """Objects the tests hand the student's code, as descriptions the student side rebuilds."""
        from . import wire

        if isinstance(v, Remote):
            if v._side is not self or v._generation != self.generation:
                raise RuntimeError("an object from an earlier run of your code (it was restarted after a "
                                   "time limit or a crash)")
            return wire.encode(wire.Handle(v._handle))
        if isinstance(v, list):
            return wire.encode(list(v), lambda x: self._describe(x, sent))
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(v, torch.Generator):
            return {"$": "generator", "state": wire.encode(v.get_state()), "ref": self._ref(v, sent)}
        if torch is not None and isinstance(v, torch.Tensor):
            return wire.encode_tensor(v)
        transformers = sys.modules.get("transformers")
        if transformers is not None:
            if isinstance(v, transformers.PreTrainedModel):
                return self._model(v)
            if isinstance(v, transformers.DynamicCache):
                layers = [[layer.keys, layer.values] for layer in v.layers if getattr(layer, "keys", None) is not None
                          and layer.keys.numel()]
                return {"$": "cache", "layers": wire.encode(layers), "ref": self._ref(v, sent)}
        if callable(v) and not isinstance(v, type):  # a function of the test (on_step, a cost curve)
            cid = len(self.callbacks) + 1
            self.callbacks[cid] = v
            return {"$": "callback", "id": cid}
        return None

    def _model(self, model) -> dict:
        from . import wire

        entry = self.models.get(id(model))
        if entry is not None and entry[1] is model:
            return {"$": "model", "key": entry[0]}
        key = self.next_key
        self.next_key += 1
        self.models[id(model)] = (key, model)
        self.pending_models.append(id(model))
        gen = {k: v for k, v in model.generation_config.to_diff_dict().items()
               if k in ("eos_token_id", "pad_token_id", "bos_token_id")}
        gen.setdefault("eos_token_id", model.generation_config.eos_token_id)
        config = {k: v for k, v in model.config.to_dict().items()}
        script = getattr(model, "grading_script", None)  # instruments.scripted_draft: built the same way there
        name = type(model).__mro__[1].__name__ if script is not None else type(model).__name__
        return {"$": "model", "key": key, "class": name, "config": wire.encode(config),
                "script": wire.encode(script),
                "attn": model.config._attn_implementation, "generation": wire.encode(gen),
                "weights": wire.encode({k: t.detach().clone() for k, t in model.state_dict().items()})}

    def model_key(self, model) -> int | None:
        entry = self.models.get(id(model))
        return entry[0] if entry is not None and entry[1] is model else None

    def decode(self, obj):
        from . import wire

        def extra(o):
            if o.get("$") == "handle":
                hid = int(o["id"])
                proxy = self.remotes.get(hid)
                if proxy is None:
                    proxy = self.remotes[hid] = Remote(self, hid, str(o.get("type", "")), bool(o.get("callable")))
                return proxy
            return wire.UNKNOWN

        try:
            return wire.decode(obj, extra)
        except wire.WireError as exc:
            raise ProtocolError(f"the student side sent malformed data ({exc})") from None

    def apply_changes(self, changes, sent: dict):
        """Copy what the call changed in place (lists, caches, generators) into the test's objects."""
        if not isinstance(changes, list):
            raise ProtocolError("a malformed list of changes")
        for item in changes:
            if not (isinstance(item, list) and len(item) == 2 and item[0] in sent):
                raise ProtocolError("a change to an object the test never sent")
            obj, value = sent[item[0]], self.decode(item[1])
            torch = sys.modules.get("torch")
            if isinstance(obj, list):
                if not isinstance(value, list):
                    raise ProtocolError("a list changed into something else")
                obj[:] = value
                key = self.lists.get(id(obj))
                if key is not None:
                    self.lists[id(obj)] = (key[0], obj, list(obj))
            elif torch is not None and isinstance(obj, torch.Generator):
                obj.set_state(value)
            elif torch is not None and isinstance(obj, torch.Tensor):
                if not isinstance(value, torch.Tensor):
                    raise ProtocolError("a tensor changed into something else")
                if value.shape == obj.shape and value.dtype == obj.dtype:
                    obj.copy_(value)
            else:  # a DynamicCache: the same object, with the student side's tensors
                from transformers import DynamicCache

                fresh = DynamicCache()
                for i, (k, v) in enumerate(value):
                    fresh.update(k, v, i)
                obj.__dict__.update(fresh.__dict__)


_BUILTINS = {name: getattr(__builtins__, name, None) if not isinstance(__builtins__, dict) else __builtins__.get(name)
             for name in ("NotImplementedError", "AssertionError", "ValueError", "TypeError", "IndexError", "KeyError",
                          "LookupError", "ZeroDivisionError", "OverflowError", "ArithmeticError", "AttributeError",
                          "RecursionError", "RuntimeError", "StopIteration", "MemoryError", "OSError")}


def _warn_again(caught) -> None:
    """The warnings the student's code raised during a call, raised again here, so a test that
    turns warnings into errors (or records them) sees them as if the call had run in-process."""
    import warnings

    for item in caught if isinstance(caught, list) else []:
        if isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item):
            category = _WARNINGS.get(item[0], UserWarning)
            warnings.warn(item[1], category, stacklevel=3)


_WARNINGS = {c.__name__: c for c in (UserWarning, RuntimeWarning, DeprecationWarning, FutureWarning,
                                     PendingDeprecationWarning, SyntaxWarning, ImportWarning, UnicodeWarning,
                                     BytesWarning, ResourceWarning)}


class StudentError(Exception):
    """An exception of a type that is not one of Python's own, raised by the student's code."""


def student_error(err) -> BaseException:
    """The student's exception, rebuilt here from its type names and text (never unpickled)."""
    from . import wire

    if not isinstance(err, dict):
        return ProtocolError("a malformed error")
    name = wire.safe_text(lambda: str(err.get("type", "Exception")), 200)
    message = wire.safe_text(lambda: str(err.get("message", "")), 2000)
    types = err.get("types") if isinstance(err.get("types"), list) else []
    cls = next((_BUILTINS[t] for t in types if isinstance(t, str) and _BUILTINS.get(t)), None)
    if name == "SystemExit":
        return RuntimeError(message)
    text = message if cls is not None and cls.__name__ == name else f"{name}: {message}"
    if cls is StopIteration:
        cls = RuntimeError
    return (cls or StudentError)(text)


class Remote:
    """An object of the student side (a function, a class, an instance), used as if it were here."""

    __slots__ = ("_side", "_handle", "_type", "_callable", "_generation")

    def __init__(self, side: StudentSide, handle: int, type_name: str, is_callable: bool):
        object.__setattr__(self, "_side", side)
        object.__setattr__(self, "_handle", handle)
        object.__setattr__(self, "_type", type_name)
        object.__setattr__(self, "_callable", is_callable)
        object.__setattr__(self, "_generation", side.generation)

    def _live(self):
        if self._generation != self._side.generation:
            raise RuntimeError(f"this {self._type} belonged to a run of your code that was stopped (time limit "
                               "or crash)")

    def __call__(self, *args, **kwargs):
        self._live()
        return self._side.request({"op": "call", "handle": self._handle, "args": args, "kwargs": kwargs})

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        self._live()
        return self._side.request({"op": "get", "handle": self._handle, "name": name})

    def __setattr__(self, name, value):
        self._live()
        self._side.request({"op": "set", "handle": self._handle, "name": name, "args": [value], "kwargs": {}})

    def _special(self, name, *args):
        self._live()
        return self._side.request({"op": "special", "handle": self._handle, "name": name, "args": args, "kwargs": {}})

    def __len__(self):
        return int(self._special("__len__"))

    def __getitem__(self, i):
        return self._special("__getitem__", i)

    def __iter__(self):
        return iter(self._special("__iter__"))

    def __contains__(self, x):
        return bool(self._special("__contains__", x))

    def __bool__(self):
        return bool(self._special("__bool__"))

    def __int__(self):
        return int(self._special("__int__"))

    def __index__(self):
        return int(self._special("__index__"))

    def __float__(self):
        return float(self._special("__float__"))

    def __repr__(self):
        return f"<{self._type} of your code>"


class RemoteLab:
    """What a grading test gets as ``lab``: the student's module, on the student side."""

    def __init__(self, side: StudentSide):
        self._side = side
        self._names: dict = {}

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        side = self._side
        side.ensure()
        cached = self._names.get(name)
        if cached is not None and cached._generation == side.generation:
            return cached
        value = side.request({"op": "get", "handle": None, "name": name})
        if isinstance(value, Remote):
            self._names[name] = value
        return value

    # Instruments the tests use; each is measured or kept by this side, or said to be the student side's.
    def cpu_seconds(self) -> float:
        """CPU time the student side has used so far (read from /proc: the submission cannot change it)."""
        self._side.ensure()
        return self._side.proc.cpu_seconds()

    def forward_counts(self, model) -> dict:
        """How many forwards the student side ran on its copy of ``model``, and the positions they
        read (counted by a hook in the student's process: a count, not a proof)."""
        key = self._side.model_key(model)
        if key is None:
            return {"forwards": 0, "positions": 0}
        self._side.ensure()
        return self._side.request({"op": "counts", "key": key})

    def list_reads(self, lst, reset: bool = False) -> int:
        """Elements of a counting list (``lst.count_reads = True``) read on the student side."""
        entry = self._side.lists.get(id(lst))
        if entry is None:
            return 0
        return int(self._side.request({"op": "list_reads", "key": entry[0], "reset": reset}))


# --------------------------------------------------------------------------------------------
# Running the tests: pytest in this process, a recorder that streams each verdict to the runner.
# --------------------------------------------------------------------------------------------

SESSION: dict = {}  # the submission being graded: its StudentSide factory (set by judge_main)


def new_student_side() -> StudentSide:
    """Called through ``lab_fixture`` in each grading file: the submission's student side, one for all
    its grading files. pytest runs the visible files before the hidden ones, so nothing the
    student side sees in a hidden test can reach a visible test's message (those have all ended)."""
    side = SESSION.get("side")
    if side is None:
        factory = SESSION.get("factory")
        if factory is None:
            raise RuntimeError("not grading: no student side to start")
        side = SESSION["side"] = factory()
        SESSION.setdefault("sides", []).append(side)
    return side


def _first_line(text, limit: int = 300) -> str:
    text = " ".join(str(text).strip().split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Recorder:
    """pytest plugin: each test's points and outcome, sent to the runner as it ends."""

    def __init__(self, send, test_timeout: float, hidden_files: set):
        from .api import GradingTimeout, LabLoadError

        self.GradingTimeout, self.LabLoadError = GradingTimeout, LabLoadError
        self.send, self.test_timeout, self.hidden_files = send, test_timeout, hidden_files
        self.tests: dict = {}
        self.in_phase = False

    def pytest_collectreport(self, report):
        if report.failed:
            self.send("collect_error", message=_first_line(report.longreprtext, 2000))

    def pytest_collection_modifyitems(self, session, config, items):
        names, tests = {}, []
        for item in items:
            fn = getattr(item, "function", None)
            file = Path(str(item.path)).name
            name = item.nodeid.split("::", 1)[-1]
            if name in names:
                name = f"{file}::{name}"
            names[name] = True
            doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
            rec = {"name": name, "file": file, "points": float(getattr(fn, "__grading_points__", 1.0)),
                   "chance": float(getattr(fn, "__grading_chance__", 0.0)), "hidden": file in self.hidden_files,
                   "doc": doc[0] if doc else ""}
            self.tests[item.nodeid] = dict(rec, outcome="not run", message="", earned=0.0)
            tests.append(rec)
        self.send("collected", tests=tests)

    # This process's own CPU per test (ITIMER_PROF); the student side's is watched by StudentSide.
    def _alarm(self, signum, frame):
        if self.in_phase:
            raise self.GradingTimeout(f"test used more than {self.test_timeout:g} s of CPU time")

    def _arm(self):
        if self.test_timeout and hasattr(signal, "SIGPROF"):
            signal.signal(signal.SIGPROF, self._alarm)
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

    # Innermost wrappers (trylast): the limit applies to the fixtures and the test, not to pytest's
    # own reporting, where a timeout would break pytest itself.
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
        self._arm()
        for side in SESSION.get("sides", []):
            side.begin_test()

    def pytest_runtest_makereport(self, item, call):
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
            elif call.excinfo.errisinstance(ProtocolError):
                outcome, msg = "error", _first_line(exc)
                self.send("protocol", test=rec["name"], message=_first_line(exc))
            else:
                outcome = "error" if call.when == "call" else f"error in {call.when}"
                msg = f"{call.excinfo.typename}: {_first_line(exc)}"
            if isinstance(exc, self.LabLoadError):
                outcome, msg = "load error", _first_line(exc)
            rec["outcome"], rec["message"], rec["earned"] = outcome, msg, 0.0

    def pytest_runtest_logfinish(self, nodeid, location):
        self._disarm()
        rec = self.tests.get(nodeid)
        if rec is not None:
            self.send("test", name=rec["name"], outcome=rec["outcome"], message=rec["message"], earned=rec["earned"])

    def pytest_sessionfinish(self, session, exitstatus):
        self.send("finished", exitstatus=int(exitstatus))


def _tail(path: Path, size: int = 4000) -> str:
    """The end of the student side's log (its prints and tracebacks), however long it grew."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def judge_main(job_path: str) -> int:
    """Grade the submissions a job file lists, one pytest session each, streaming verdicts."""
    from . import sandbox as sandbox_mod
    from .sandbox import Sandbox

    sandbox_mod.no_core_dumps_of_me()
    from . import api

    api.REMOTE_LAB[:] = [lambda: RemoteLab(new_student_side())]
    job = json.loads(Path(job_path).read_text())
    fd = int(job["verdict_fd"])
    box = Sandbox(**job["sandbox"])
    workdir = Path(job["workdir"])
    ini = workdir / "pytest.ini"
    ini.write_text("[pytest]\n")
    hidden = {Path(f).name for f in job["hidden_files"]}
    status = 0
    for i, sub in enumerate(job["submissions"]):
        def send(event, _i=i, **data):
            line = (json.dumps({"sub": _i, "ev": event, **data}) + "\n").encode()
            while line:
                line = line[os.write(fd, line):]

        send("start")
        log = workdir / f"student-{i}.log"
        SESSION.clear()
        SESSION["factory"] = lambda p=sub["path"], log=log: StudentSide(box, Path(p), log, job["threads"],
                                                                        job["test_timeout"])
        recorder = Recorder(send, job["test_timeout"], hidden)
        args = [*job["files"], "-q", "-p", "no:cacheprovider", "--noconftest", "-c", str(ini), "--rootdir",
                job["lab_dir"], "-o", "addopts=", "-o", "python_files=grading_*.py", "-W", "ignore::DeprecationWarning",
                "--tb=no", "--color=no", "-p", "no:warnings"]
        try:
            status = int(pytest.main(args, plugins=[recorder]))
        except BaseException as exc:  # noqa: BLE001 - keep grading the next submission
            send("internal", message=f"pytest stopped with {type(exc).__name__}: {exc}")
            status = 3
        recorder._disarm()
        for side in SESSION.get("sides", []):
            side.stop()
        box.kill_all()
        send("done", log=_tail(log))
    return status


if __name__ == "__main__":
    from specdecode_ref.grading.judge import judge_main as _main  # the package's copy, so SESSION is shared

    sys.exit(_main(sys.argv[1]))
