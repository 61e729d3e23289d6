"""The student side of grading: the only process that imports and runs a submission.

It is started by the judging side (:mod:`.judge`) through :mod:`.sandbox` (an unprivileged user,
a private copy of the one file, no network, where the machine allows) and answers requests on a
data-only channel (:mod:`.wire`): look a name up in the student's module, call it, read an
attribute of an object it returned. Nothing it sends back is trusted: the judging side decides
every verdict from the data alone, so code here that patches, forges or lies changes what the
tests see, never how they judge it.

The tests build models, caches and random generators on their side; they arrive here as
descriptions (a config and weights, the cache's tensors, the generator's state) and are built
by this module, not by the submission. What a call changed in place (a list the student
appended to, a cache it cropped, a generator it drew from) is sent back, so a test sees the
same side effects as if it had called the function itself.

Run as ``python -m specdecode_ref.grading.student_side FILE`` (the package imports its names
when first used, so a lab that needs only numpy never loads torch here).
"""
from __future__ import annotations

import builtins
import importlib.util
import os
import sys

# Exceptions the judging side re-raises as themselves, so ``pytest.raises(ValueError)`` works;
# any other type arrives as the first of these in its method resolution order.
BUILTIN_ERRORS = ("NotImplementedError", "AssertionError", "ValueError", "TypeError", "IndexError", "KeyError",
                  "LookupError", "ZeroDivisionError", "OverflowError", "ArithmeticError", "AttributeError",
                  "RecursionError", "RuntimeError", "StopIteration", "MemoryError", "OSError", "Exception")
SPECIAL = ("__len__", "__getitem__", "__iter__", "__contains__", "__eq__", "__repr__", "__str__", "__bool__",
           "__int__", "__float__", "__index__", "__next__")


class TrackedList(list):
    """A list sent by the judging side: it notes whether the call changed it, without slowing
    down reads (only the mutating methods are wrapped)."""

    changed = False


def _mutator(name):
    base = getattr(list, name)

    def method(self, *args, **kwargs):
        self.changed = True
        return base(self, *args, **kwargs)

    method.__name__ = name
    return method


for _name in ("append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", "__setitem__",
              "__delitem__", "__iadd__", "__imul__"):
    setattr(TrackedList, _name, _mutator(_name))


class CountingList(TrackedList):
    """A tracked list that also counts the elements read through indexing and iteration: how a
    test measures that an incremental method reads only the new tokens."""

    reads = 0

    def __getitem__(self, i):
        out = list.__getitem__(self, i)
        self.reads += len(out) if isinstance(i, slice) else 1
        return out

    def __iter__(self):
        self.reads += len(self)
        return list.__iter__(self)


class Server:
    def __init__(self, fd_in: int, fd_out: int, path: str):
        from specdecode_ref.grading import wire

        self.wire = wire
        self.fd_in, self.fd_out, self.path = fd_in, fd_out, path
        self.module = None
        self.objects: dict = {}  # handle id -> object
        self.ids: dict = {}  # id(object) -> handle id, so one object keeps one handle
        self.next_id = 1
        self.models: dict = {}  # the judging side's key -> (model, counters)
        self.lists: dict = {}  # the judging side's key -> list (one object across calls)

    # --- values ------------------------------------------------------------------------------
    def handle(self, obj):
        key = id(obj)
        hid = self.ids.get(key)
        if hid is None or self.objects.get(hid) is not obj:
            hid = self.next_id
            self.next_id += 1
            self.objects[hid], self.ids[key] = obj, hid
        return self.wire.Handle(hid, type(obj).__name__, callable(obj))

    def encode(self, value):
        return self.wire.encode(value, extra=lambda v: self.wire.encode(self.handle(v)))

    def decode(self, obj, sent: list):
        wire = self.wire

        def extra(o):
            kind = o["$"]
            if kind == "handle":
                return self.objects[int(o["id"])]
            if kind == "callback":
                return self.callback(int(o["id"]))
            if kind == "model":
                return self.model(o, decode_plain)
            if kind == "cache":
                cache = self.cache(o, decode_plain)
                sent.append((o["ref"], cache, "cache"))
                return cache
            if kind == "generator":
                import torch

                g = torch.Generator()
                g.set_state(decode_plain(o["state"]))
                sent.append((o["ref"], g, "generator"))
                return g
            if kind == "mtensor":
                t = decode_plain(o["tensor"])
                sent.append((o["ref"], (t, t.clone()), "tensor"))
                return t
            if kind == "list":
                lst = self.mirror(o, decode_plain)
                lst.changed = False
                sent.append((o["ref"], lst, "list"))
                return lst
            return wire.UNKNOWN

        def decode_plain(x):
            return wire.decode(x, extra)

        return decode_plain(obj)

    def mirror(self, o, decode_plain):
        """One list object per judging-side list, brought up to date with what changed there."""
        key = int(o["key"])
        lst = self.lists.get(key)
        if lst is None or int(o.get("keep", 0)) > len(lst):
            lst = (CountingList if o.get("counting") else TrackedList)()
            self.lists[key] = lst
        keep = int(o.get("keep", 0))
        tail = decode_plain(o["items"])
        list.__delitem__(lst, slice(keep, None))
        list.extend(lst, tail)
        return lst

    def model(self, o, decode_plain):
        key = int(o["key"])
        if key in self.models:
            return self.models[key][0]
        import torch
        import transformers

        cls = getattr(transformers, str(o["class"]), None)
        if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
            raise ValueError(f"not a transformers model class: {o['class']!r}")
        config_cls = cls.config_class
        config = config_cls.from_dict(decode_plain(o["config"]))
        with torch.device("cpu"):
            model = cls._from_config(config, attn_implementation=str(o.get("attn") or "sdpa"), torch_dtype=None)
        state = decode_plain(o["weights"])
        model.load_state_dict(state, strict=True)
        script = decode_plain(o.get("script"))
        if script is not None:
            from specdecode_ref.grading.instruments import script_draft

            script_draft(model, script["full"], script["wrong"])
        model.eval().requires_grad_(False)
        gen = decode_plain(o.get("generation") or {})
        for k, v in gen.items():
            setattr(model.generation_config, str(k), v)
        counters = {"forwards": 0, "positions": 0}

        def count(module, args, kwargs):
            counters["forwards"] += 1
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is not None:
                counters["positions"] += int(torch.as_tensor(ids).shape[-1])
            elif kwargs.get("inputs_embeds") is not None:
                counters["positions"] += int(kwargs["inputs_embeds"].shape[-2])

        model.register_forward_pre_hook(count, with_kwargs=True)
        self.models[key] = (model, counters)
        return model

    def cache(self, o, decode_plain):
        from transformers import DynamicCache

        cache = DynamicCache()
        for i, (k, v) in enumerate(decode_plain(o["layers"])):
            cache.update(k, v, i)
        return cache

    def callback(self, cid: int):
        def call_judge(*args, **kwargs):
            self.wire.send(self.fd_out, {"callback": cid, "args": self.encode(list(args)),
                                         "kwargs": self.encode(dict(kwargs))})
            return self.serve(until_return=True)

        return call_judge

    def sent_back(self, sent: list) -> list:
        """What the call changed in the judging side's own objects, to be copied there."""
        out = []
        for ref, obj, kind in sent:
            if kind == "list":
                if obj.changed:
                    out.append([ref, self.encode(list(list.__iter__(obj)))])
            elif kind == "tensor":
                import torch

                t, before = obj
                if t.shape != before.shape or not torch.equal(t, before):
                    out.append([ref, self.encode(t)])
            elif kind == "generator":
                out.append([ref, self.encode(obj.get_state())])
            elif kind == "cache":
                layers = [[layer.keys, layer.values] for layer in getattr(obj, "layers", [])
                          if getattr(layer, "keys", None) is not None]
                out.append([ref, self.encode(layers)])
        return out

    # --- requests ------------------------------------------------------------------------------
    def load(self):
        from specdecode_ref.grading.api import IMPL_ENV

        os.environ[IMPL_ENV] = self.path
        spec = importlib.util.spec_from_file_location("student", self.path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["student"] = module  # dataclasses look their module up here
        spec.loader.exec_module(module)
        self.module = module
        return None

    def do(self, req: dict):
        op = req.get("op")
        sent: list = []
        if op == "load":
            return self.load(), sent
        if op == "get":
            target = self.module if req.get("handle") is None else self.objects[int(req["handle"])]
            return getattr(target, str(req["name"])), sent
        if op == "set":
            setattr(self.objects[int(req["handle"])], str(req["name"]), self.decode(req["args"], sent)[0])
            return None, sent
        if op == "call":
            fn = self.objects[int(req["handle"])]
            args = self.decode(req.get("args", []), sent)
            kwargs = self.decode(req.get("kwargs", {"$": "dict", "items": []}), sent)
            return fn(*args, **{str(k): v for k, v in kwargs.items()}), sent
        if op == "special":
            name = str(req["name"])
            if name not in SPECIAL:
                raise AttributeError(f"{name} is not available")
            obj = self.objects[int(req["handle"])]
            args = self.decode(req.get("args", []), sent)
            if name == "__iter__":
                return list(iter(obj)), sent
            builtin = {"__len__": len, "__repr__": repr, "__str__": str, "__bool__": bool, "__int__": int,
                       "__float__": float, "__next__": next}.get(name)
            return (builtin(obj, *args) if builtin else getattr(obj, name)(*args)), sent
        if op == "release":
            for hid in req.get("ids", []):
                obj = self.objects.pop(int(hid), None)
                if obj is not None:
                    self.ids.pop(id(obj), None)
            return None, sent
        if op == "counts":
            entry = self.models.get(int(req["key"]))
            return (dict(entry[1]) if entry else {"forwards": 0, "positions": 0}), sent
        if op == "list_reads":
            lst = self.lists.get(int(req["key"]))
            reads = int(getattr(lst, "reads", 0))
            if req.get("reset") and lst is not None:
                lst.reads = 0
            return reads, sent
        raise ValueError(f"unknown request {op!r}")

    def error(self, exc: BaseException) -> dict:
        text = self.wire.safe_text
        types = [k.__name__ for k in type(exc).__mro__ if k.__name__ in BUILTIN_ERRORS and getattr(builtins, k.__name__,
                                                                                                    None) is k]
        return {"error": {"types": types, "type": text(lambda: type(exc).__name__, 200),
                          "message": text(lambda: str(exc), 2000)}}

    def serve(self, until_return: bool = False):
        """Answer requests; inside a callback, until the judging side sends its value back."""
        wire = self.wire
        while True:
            try:
                req = wire.receive(self.fd_in)
            except wire.ChannelClosed:
                os._exit(0)
            if until_return and req.get("op") == "return":
                return self.decode(req.get("value"), [])
            if until_return and req.get("op") == "raise":
                raise RuntimeError(f"the grader's callback failed: {req.get('message', '')}")
            try:
                import warnings

                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")  # every warning reaches the test, which filters as it likes
                    value, sent = self.do(req)
                reply = {"ok": self.encode(value), "changed": self.sent_back(sent),
                         "warnings": [[w.category.__name__, wire.safe_text(lambda w=w: str(w.message), 500)]
                                      for w in caught[:20]]}
            except BaseException as exc:  # noqa: BLE001 - anything the submission raises is its answer
                if isinstance(exc, SystemExit):
                    reply = {"error": {"types": [], "type": "SystemExit",
                                       "message": "the submission called exit() (or raised SystemExit)"}}
                else:
                    reply = self.error(exc)
            try:
                wire.send(self.fd_out, reply)
            except TypeError as exc:  # an unencodable value after all: say so instead of hanging
                wire.send(self.fd_out, {"error": {"types": ["TypeError"], "type": "TypeError", "message": str(exc)}})


def main(path: str) -> None:
    # The channel is the pipes the judging side handed over as stdin and stdout; the submission's
    # own prints go to the log (stderr), so they cannot be mistaken for the channel.
    fd_in, fd_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    sys.stdin = open(os.devnull)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    Server(fd_in, fd_out, path).serve()


if __name__ == "__main__":
    main(sys.argv[1])
