"""The target's forward at the memory floor: which kernel multiplies the weights.

A decode step multiplies every weight matrix by a handful of token rows (1 for plain decoding,
k + 1 when verifying k drafted tokens). Such a product is bound by reading the weights from memory,
so scoring k + 1 tokens should cost about as much as scoring one: that is the premise of
speculative decoding. Whether it does depends on the matrix-product kernel, not on the model. The
general-purpose BLAS behind the eager transformers forward is tuned for large matrices; on many
CPUs it reads the weights well below the memory bandwidth for one row and takes a slower code path
for two or more (notebook 00 measures both).

Two backends, chosen by one switch (``load_model(..., backend=...)``):

- ``"eager"``: the transformers forward as it ships, the reference.
- ``"fast"``: the same modules, the same Python, but every ``nn.Linear`` of the model runs the
  batched matrix-vector kernel in ``kernels/linear.c`` and attention runs ``kernels/attention.c``
  (compiled once per machine with the system's C compiler and cached beside the model). The
  product reads each tile of weight rows once for all token rows. Both kernels sum in an order
  fixed per output, so a position's logits do not depend on how many tokens share the forward
  (batch invariance: greedy speculative output then equals plain decoding by construction, not
  by fp32's margin).

``"auto"`` (the default) takes ``"fast"`` where it can run (a CPU, fp32 or bf16 weights, a C
compiler) and says once why not elsewhere. ``$SPECDECODE_BACKEND`` overrides the default, so a
whole test suite or notebook can be run on either backend. Training is untouched: a product that
needs gradients falls back to ``F.linear``.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from .cache import cache_dir

BACKENDS = ("auto", "fast", "eager")
ENV_VAR = "SPECDECODE_BACKEND"
_SOURCES = [Path(__file__).with_name("kernels") / name for name in ("linear.c", "attention.c")]
ATTENTION = "specdecode"  # the name the kernel's attention is registered under in transformers


class BackendUnavailable(RuntimeError):
    """The fast backend cannot run here; the message says why and what to do."""


# ---------------------------------------------------------------------------------------------
# Building and loading the kernel
# ---------------------------------------------------------------------------------------------
_lib = None
_lib_error: str | None = None
_lock = threading.Lock()


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        path = shutil.which(name) if name else None
        if path:
            return path
    return None


def _cpu_fingerprint() -> str:
    """What the compiled code depends on: the machine's ISA extensions (``-march=native``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _build(cc: str, out: Path) -> None:
    """Compile the kernel into ``out`` (atomically, so parallel processes never load half a file)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    attempts = [
        ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp"],
        ["-O3", "-ffp-contract=off", "-fopenmp"],
    ]
    errors = []
    for flags in attempts:
        with tempfile.NamedTemporaryFile(dir=out.parent, suffix=".so", delete=False) as tmp:
            tmp_path = Path(tmp.name)
        cmd = [cc, *flags, "-fPIC", "-shared", "-o", str(tmp_path), *map(str, _SOURCES), "-lm"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode == 0:
            os.replace(tmp_path, out)
            return
        tmp_path.unlink(missing_ok=True)
        errors.append(" ".join(cmd) + "\n" + proc.stderr.strip()[-600:])
    raise BackendUnavailable("the C compiler could not build the kernel:\n" + "\n".join(errors))


def kernel_path() -> Path:
    """Where this machine's compiled kernel lives: keyed by the source, compiler and CPU features."""
    cc = _compiler() or "none"
    key = hashlib.sha256()
    for part in (*(src.read_bytes() for src in _SOURCES), cc.encode(), _cpu_fingerprint().encode(), platform.machine().encode(),
                 sys.platform.encode()):
        key.update(part)
        key.update(b"\0")
    return cache_dir() / "kernels" / key.hexdigest()[:16] / "specdecode_kernels.so"


def kernel_library():
    """The loaded kernel (a ctypes library), built on first use. Raises :class:`BackendUnavailable`."""
    global _lib, _lib_error
    with _lock:
        if _lib is not None:
            return _lib
        if _lib_error is not None:
            raise BackendUnavailable(_lib_error)
        try:
            if sys.platform != "linux":
                raise BackendUnavailable(f"the fast backend is built and tested on Linux only (this is {sys.platform})")
            cc = _compiler()
            if cc is None:
                raise BackendUnavailable("no C compiler was found (install gcc, or set $CC)")
            path = kernel_path()
            if not path.exists():
                _build(cc, path)
            lib = ctypes.CDLL(str(path))
            args = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 5 + [ctypes.c_int]
            for fn in (lib.sd_linear_f32, lib.sd_linear_bf16w):
                fn.argtypes = args
                fn.restype = None
            lib.sd_attention_f32.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 9 + [ctypes.c_float, ctypes.c_int]
            lib.sd_attention_f32.restype = None
            _lib = lib
            return lib
        except BackendUnavailable as err:
            _lib_error = str(err)
            raise
        except OSError as err:
            _lib_error = f"the compiled kernel could not be loaded: {err}"
            raise BackendUnavailable(_lib_error) from err


def fast_available() -> tuple[bool, str]:
    """``(True, "")`` when the fast backend runs here, else ``(False, reason)``."""
    try:
        kernel_library()
        return True, ""
    except BackendUnavailable as err:
        return False, str(err)


# ---------------------------------------------------------------------------------------------
# The product
# ---------------------------------------------------------------------------------------------
_KERNEL_DTYPES = (torch.float32, torch.bfloat16)


def _profiled(name: str):
    """Under ``torch.profiler`` the kernels appear as operators named ``specdecode::<name>`` (a
    ctypes call is invisible to it otherwise); outside it, nothing is added to the call."""
    def wrap(fn):
        def call(*args, **kwargs):
            if torch.autograd._profiler_enabled():
                with torch.profiler.record_function(f"specdecode::{name}"):
                    return fn(*args, **kwargs)
            return fn(*args, **kwargs)
        call.__doc__, call.__name__, call.__wrapped__ = fn.__doc__, fn.__name__, fn
        return call
    return wrap


@_profiled("linear")
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` [..., K] -> [..., N] on the kernel: fp32 activations and sums,
    fp32 or bf16 weights [N, K]; the result has ``x``'s dtype. Every output element is computed in
    the same order whatever the number of rows, so row i does not depend on the other rows."""
    lib = kernel_library()
    if weight.dtype not in _KERNEL_DTYPES or weight.device.type != "cpu" or weight.dim() != 2:
        raise ValueError(f"the kernel takes a 2-D fp32 or bf16 CPU weight, got {weight.dtype} {tuple(weight.shape)} "
                         f"on {weight.device}")
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} features, the weight expects {k}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.dtype != torch.float32:
        x2 = x2.float()
    x2 = x2.contiguous()
    w = weight.contiguous()
    b = None
    if bias is not None:
        b = bias.float().contiguous()
    m = x2.shape[0]
    y = torch.empty(m, n, dtype=torch.float32)
    if m:
        fn = lib.sd_linear_f32 if w.dtype == torch.float32 else lib.sd_linear_bf16w
        fn(x2.data_ptr(), w.data_ptr(), b.data_ptr() if b is not None else None, y.data_ptr(),
           m, n, k, k, n, torch.get_num_threads())
    if x.dtype != torch.float32:
        y = y.to(x.dtype)
    return y.reshape(*lead, n)


class FastLinear(torch.nn.Linear):
    """An ``nn.Linear`` whose inference products run on the kernel. The parameters (and their tying,
    names and state dict) are the module's own; only ``forward`` changes. A product that autograd
    must track, or one the kernel does not take (another device or dtype), runs ``F.linear``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if (x.device.type == "cpu" and w.device.type == "cpu" and w.dtype in _KERNEL_DTYPES
                and x.dtype in _KERNEL_DTYPES
                and not (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad))):
            return linear(x, w, self.bias)
        return F.linear(x, w, self.bias)


@_profiled("attention")
def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None = None,
              scale: float | None = None) -> torch.Tensor:
    """Softmax attention on the kernel, one query at a time: query [B, H, Q, D], key and value
    [B, KVH, S, D] (H a multiple of KVH), mask None (causal: query i sits at key position S - Q + i)
    or [B or 1, H or 1, Q, S], boolean (True = visible) or additive (<= -1e30 = not visible).
    Returns [B, Q, H, D] in ``query``'s dtype: transformers' layout before the output projection."""
    lib = kernel_library()
    b, h, q, d = query.shape
    if key.dim() != 4 or key.shape != value.shape or key.shape[0] != b or key.shape[3] != d or h % key.shape[1]:
        raise ValueError(f"attention: query {tuple(query.shape)} does not match key {tuple(key.shape)} "
                         f"and value {tuple(value.shape)}")
    kvh, s = key.shape[1], key.shape[2]
    qf, kf, vf = (t.float().contiguous() for t in (query, key, value))
    strides = (0, 0, 0)
    if mask is not None:
        if mask.dim() != 4 or mask.shape[2] != q or mask.shape[3] != s:
            raise ValueError(f"attention: mask {tuple(mask.shape)} does not cover {q} queries x {s} keys")
        if mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=torch.float32).masked_fill_(~mask, float("-inf"))
        mask = mask.float().contiguous()
        strides = tuple(mask.stride(i) if mask.shape[i] > 1 else 0 for i in range(3))
    out = torch.empty(b, q, h, d, dtype=torch.float32)
    scale = d ** -0.5 if scale is None else float(scale)
    lib.sd_attention_f32(qf.data_ptr(), kf.data_ptr(), vf.data_ptr(), mask.data_ptr() if mask is not None else None,
                         out.data_ptr(), b, h, kvh, q, s, d, *strides, scale, torch.get_num_threads())
    return out if query.dtype == torch.float32 else out.to(query.dtype)


def _transformers_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """The kernel's attention behind transformers' attention interface. Anything it does not cover
    (another device or dtype, gradients, dropout, sliding windows, soft-capping, sinks) runs SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    plain = (query.device.type == "cpu" and query.dtype in _KERNEL_DTYPES and not dropout
             and not (torch.is_grad_enabled() and (query.requires_grad or key.requires_grad))
             and kwargs.get("sliding_window") is None and kwargs.get("softcap") is None
             and kwargs.get("s_aux") is None and getattr(module, "is_causal", True))
    if not plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    return attention(query, key, value, attention_mask, scaling), None


_registered = False


def _register_attention() -> None:
    """Make ``attn_implementation="specdecode"`` known to transformers (its masks: SDPA's)."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ATTENTION, _transformers_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)
    _registered = True


def _set_attention(module: torch.nn.Module, backend: str) -> None:
    """Point every transformers model inside ``module`` at the kernel's attention, or back."""
    for sub in module.modules():
        config = getattr(sub, "config", None)
        if config is None or not hasattr(config, "_attn_implementation") or not hasattr(sub, "set_attn_implementation"):
            continue
        if backend == "fast":
            if config._attn_implementation != ATTENTION:
                sub._specdecode_attention = config._attn_implementation
                sub.set_attn_implementation(ATTENTION)
        elif config._attn_implementation == ATTENTION:
            sub.set_attn_implementation(getattr(sub, "_specdecode_attention", None) or "sdpa")


def apply_backend(module: torch.nn.Module, backend: str) -> torch.nn.Module:
    """Switch every ``nn.Linear`` inside ``module`` to ``backend`` ("fast" or "eager"), in place.

    The modules keep their parameters; only their class (hence ``forward``) changes, so tied weights
    stay tied and copies of layers (drafters built from the target) inherit the backend.
    """
    if backend not in ("fast", "eager"):
        raise ValueError(f"apply_backend takes 'fast' or 'eager', not {backend!r}")
    if backend == "fast":
        kernel_library()  # fail here, with the reason, rather than at the first forward
        _register_attention()
    _set_attention(module, backend)
    for sub in module.modules():
        if backend == "fast" and type(sub) is torch.nn.Linear:
            sub.__class__ = FastLinear
        elif backend == "eager" and type(sub) is FastLinear:
            sub.__class__ = torch.nn.Linear
    module._specdecode_backend = backend
    return module


def backend_of(module: torch.nn.Module) -> str:
    """The backend ``module``'s linear layers run on: "fast", "eager" or "mixed"."""
    kinds = {type(s) for s in module.modules() if isinstance(s, torch.nn.Linear)}
    if kinds == {FastLinear}:
        return "fast"
    if FastLinear not in kinds:
        return "eager"
    return "mixed"


_warned: set[str] = set()


def resolve_backend(backend: str | None, device: torch.device, dtype: torch.dtype) -> str:
    """The backend a model on ``device`` in ``dtype`` gets: "fast" or "eager".

    ``None`` reads ``$SPECDECODE_BACKEND`` (default "auto"). "auto" falls back to eager with one
    message per reason; an explicit "fast" that cannot run raises :class:`BackendUnavailable`.
    """
    if backend is None:
        backend = os.environ.get(ENV_VAR, "auto") or "auto"
    backend = backend.lower()
    if backend not in BACKENDS:
        raise ValueError(f"Unknown backend {backend!r}; use one of {BACKENDS} (or set ${ENV_VAR})")
    if backend == "eager":
        return "eager"
    reason = None
    if device.type != "cpu":
        reason = (f"the fast backend is for CPUs; on {device.type} the eager forward runs "
                  "(the GPU's own libraries already read the weights at its bandwidth)")
    elif dtype not in _KERNEL_DTYPES:
        reason = f"the fast backend takes fp32 or bf16 weights, not {dtype}"
    else:
        ok, why = fast_available()
        if not ok:
            reason = why
    if reason is None:
        return "fast"
    if backend == "fast":
        raise BackendUnavailable(reason)
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"specdecode: using the eager (transformers) forward: {reason}.", stacklevel=3)
    return "eager"


__all__ = ["ATTENTION", "BACKENDS", "ENV_VAR", "BackendUnavailable", "FastLinear", "apply_backend", "attention",
           "backend_of",
           "fast_available", "kernel_library", "kernel_path", "linear", "resolve_backend"]
