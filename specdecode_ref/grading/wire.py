"""The data-only channel between the judging side and the student side of grading.

Every message is one JSON document behind an 8-byte length. Values are plain JSON or tagged
objects (``{"$": kind, ...}``) for what JSON lacks: tuples, dicts with any keys, bytes, tensors
and arrays (dtype, shape and raw bytes), torch dtypes and generators. Decoding builds nothing but
those data types: no pickle, no import by name, no code object, so whatever the student side
sends, the judging side gets data and nothing that can run.

Objects that are not data travel as references: a *handle* names an object that lives on the
student side (a proposer the student's class built), a *callback* names a function of the
judging side that the student side may call back with data. Models and caches the tests build
are sent as descriptions (config and weights), see :mod:`.student_side`.
"""
from __future__ import annotations

import base64
import json
import math
import os
import struct

MAX_MESSAGE = 1 << 28  # bytes; a larger length prefix is refused (a garbled or hostile stream)
_HEADER = struct.Struct(">Q")
TENSOR_DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")
NUMPY_DTYPES = ("float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool")


class WireError(Exception):
    """A message that is not what the protocol allows (malformed, oversized, an unknown tag)."""


class ChannelClosed(WireError):
    """The other side closed the channel (it exited or was stopped)."""


# --- framing ---------------------------------------------------------------------------------------

def send(fd: int, message) -> None:
    payload = json.dumps(message, allow_nan=True, separators=(",", ":")).encode()
    data = _HEADER.pack(len(payload)) + payload
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exactly(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise ChannelClosed("the channel closed in the middle of a message" if chunks or left != n
                                else "the channel closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(fd: int):
    (size,) = _HEADER.unpack(_read_exactly(fd, _HEADER.size))
    if size > MAX_MESSAGE:
        raise WireError(f"a message of {size} bytes announced (at most {MAX_MESSAGE})")
    try:
        return json.loads(_read_exactly(fd, size))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nested past Python's stack
        raise WireError(f"a message that is not JSON the grader can read ({type(exc).__name__})") from None


# --- values ----------------------------------------------------------------------------------------

class Handle:
    """An object that lives on the student side, named by its number there."""

    __slots__ = ("id", "type", "callable")

    def __init__(self, id: int, type: str = "", callable: bool = False):
        self.id, self.type, self.callable = int(id), str(type), bool(callable)


class Callback:
    """A judging-side function the student side may call (with data only)."""

    __slots__ = ("id",)

    def __init__(self, id: int):
        self.id = int(id)


def _torch():
    import sys

    return sys.modules.get("torch")


def encode(value, extra=None, depth: int = 0):
    """``value`` as JSON-able data. ``extra(value)`` may encode what the plain rules do not (it
    returns the encoding or None); anything left raises TypeError."""
    if depth > 64:
        raise TypeError("a value nested more than 64 levels deep")
    if value is None or isinstance(value, (bool, str)):
        return str(value) if isinstance(value, str) else value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, Handle):
        return {"$": "handle", "id": value.id, "type": value.type, "callable": value.callable}
    if isinstance(value, Callback):
        return {"$": "callback", "id": value.id}
    # Subclasses of the plain containers (a namedtuple, an OrderedDict, a list subclass) and other
    # numbers (Fraction, Decimal) travel as the plain value they stand for: data, as a test compares it.
    if isinstance(value, list):
        return [encode(v, extra, depth + 1) for v in list.__iter__(value)]
    if isinstance(value, tuple):
        return {"$": "tuple", "items": [encode(v, extra, depth + 1) for v in tuple.__iter__(value)]}
    if isinstance(value, dict):
        return {"$": "dict", "items": [[encode(k, extra, depth + 1), encode(v, extra, depth + 1)]
                                       for k, v in dict.items(value)]}
    if isinstance(value, (set, frozenset)):
        return {"$": "set", "items": [encode(v, extra, depth + 1) for v in value]}
    if isinstance(value, (bytes, bytearray)):
        return {"$": "bytes", "data": base64.b64encode(bytes(value)).decode()}
    torch = _torch()
    if torch is not None:
        if isinstance(value, torch.Tensor) and type(value) in (torch.Tensor, torch.nn.Parameter):
            return encode_tensor(value)
        if isinstance(value, torch.dtype):
            return {"$": "dtype", "name": str(value).replace("torch.", "")}
        if isinstance(value, torch.Size):
            return {"$": "tuple", "items": [int(v) for v in value]}
    np = __import__("sys").modules.get("numpy")
    if np is not None:
        if isinstance(value, np.ndarray) and value.dtype.name in NUMPY_DTYPES:
            data = np.ascontiguousarray(value)
            return {"$": "ndarray", "dtype": value.dtype.name, "shape": list(value.shape),
                    "data": base64.b64encode(data.tobytes()).decode()}
        if isinstance(value, np.generic) and value.dtype.name in NUMPY_DTYPES:
            return {"$": "npscalar", "dtype": value.dtype.name, "value": value.item()}
    import numbers

    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) or type(value).__name__ == "Decimal":
        return float(value)
    if extra is not None:
        out = extra(value)
        if out is not None:
            return out
    raise TypeError(f"a {type(value).__name__} cannot be sent between the grader and the student's code")


def encode_tensor(t) -> dict:
    torch = _torch()
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    name = str(t.dtype).replace("torch.", "")
    if name not in TENSOR_DTYPES:
        raise TypeError(f"a tensor of dtype {t.dtype} cannot be sent")
    flat = t.contiguous().reshape(-1)
    raw = flat.view(torch.int16) if t.dtype == torch.bfloat16 else flat
    return {"$": "tensor", "dtype": name, "shape": list(t.shape),
            "data": base64.b64encode(raw.numpy().tobytes()).decode()}


def _tensor(obj):
    import numpy as np
    import torch

    name, shape = obj.get("dtype"), obj.get("shape")
    if name not in TENSOR_DTYPES or not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise WireError("a malformed tensor")
    raw = base64.b64decode(obj.get("data", ""), validate=True)
    numel = math.prod(shape)
    np_name = "int16" if name == "bfloat16" else name
    arr = np.frombuffer(raw, dtype=np.dtype(np_name)).copy()
    if arr.size != numel:
        raise WireError(f"a tensor whose {arr.size} values do not fill its shape {shape}")
    t = torch.from_numpy(arr).reshape(shape)
    return t.view(torch.bfloat16) if name == "bfloat16" else t


def decode(obj, extra=None, depth: int = 0):
    """The value an :func:`encode` output stands for. ``extra(obj)`` decodes tags the plain rules
    do not know (handles, callbacks, models); an unknown tag raises :class:`WireError`."""
    if depth > 64:
        raise WireError("a value nested more than 64 levels deep")
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, list):
        return [decode(v, extra, depth + 1) for v in obj]
    if not isinstance(obj, dict) or not isinstance(obj.get("$"), str):
        raise WireError("a value that is neither JSON data nor a tagged object")
    kind = obj["$"]
    try:
        if kind == "tuple":
            return tuple(decode(v, extra, depth + 1) for v in obj["items"])
        if kind == "dict":
            return {_hashable(decode(k, extra, depth + 1)): decode(v, extra, depth + 1) for k, v in obj["items"]}
        if kind == "set":
            return {_hashable(decode(v, extra, depth + 1)) for v in obj["items"]}
        if kind == "bytes":
            return base64.b64decode(obj["data"], validate=True)
        if kind == "tensor":
            return _tensor(obj)
        if kind == "dtype":
            import torch

            if obj["name"] not in TENSOR_DTYPES:
                raise WireError(f"an unknown dtype {obj['name']!r}")
            return getattr(torch, obj["name"])
        if kind == "ndarray":
            import numpy as np

            if obj["dtype"] not in NUMPY_DTYPES:
                raise WireError("an unknown array dtype")
            arr = np.frombuffer(base64.b64decode(obj["data"], validate=True), dtype=np.dtype(obj["dtype"])).copy()
            return arr.reshape([int(s) for s in obj["shape"]])
        if kind == "npscalar":
            import numpy as np

            if obj["dtype"] not in NUMPY_DTYPES or not isinstance(obj["value"], (bool, int, float)):
                raise WireError("a malformed numpy scalar")
            return np.dtype(obj["dtype"]).type(obj["value"])
    except WireError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise WireError(f"a malformed {kind!r} ({type(exc).__name__})") from None
    if extra is not None:
        out = extra(obj)
        if out is not _UNKNOWN:
            return out
    raise WireError(f"an unknown tag {kind!r}")


_UNKNOWN = object()
UNKNOWN = _UNKNOWN  # what an ``extra`` decoder returns for a tag it does not know


def _hashable(v):
    if isinstance(v, (list, dict)):
        raise WireError("an unhashable key")
    return v


def safe_text(fn, limit: int = 2000) -> str:
    """``fn()`` as text, whatever it raises (a submission's exception whose ``__str__`` is broken
    is still an honest failure, not a grader error)."""
    try:
        text = fn()
        if not isinstance(text, str):
            text = object.__repr__(text)
    except BaseException as exc:  # noqa: BLE001
        try:
            text = f"<its message could not be printed: {type(exc).__name__}>"
        except BaseException:  # noqa: BLE001
            text = "<its message could not be printed>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
