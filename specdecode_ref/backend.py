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
  by fp32's margin). They are torch operators (``specdecode::linear``, ``specdecode::attention``),
  so ``torch.compile`` traces them and ``torch.profiler`` names them, as it does aten's.

``"auto"`` (the default) takes ``"fast"`` where it can run (a CPU, fp32 or bf16 weights, a C
compiler) and says once why not elsewhere. ``$SPECDECODE_BACKEND`` overrides the default, so a
whole test suite or notebook can be run on either backend. Training is untouched: a product that
needs gradients falls back to ``F.linear``.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import warnings
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F

from .cache import cache_dir

BACKENDS = ("auto", "fast", "eager")
ENV_VAR = "SPECDECODE_BACKEND"
_SOURCES = [Path(__file__).with_name("kernels") / name for name in ("linear.c", "attention.c")]
_HEADERS = [Path(__file__).with_name("kernels") / name for name in ("lanes.h", "threads.h")]  # part of the cache key
ATTENTION = "specdecode"  # the name the kernel's attention is registered under in transformers


class BackendUnavailable(RuntimeError):
    """The fast backend cannot run here; the message says why and what to do."""


# ---------------------------------------------------------------------------------------------
# Building and loading the kernel
# ---------------------------------------------------------------------------------------------
_lib = None
_lib_error: str | None = None
_lock = threading.Lock()

COMPILE_TIMEOUT_S = 120  # a compiler that hangs (a wedged license server, a network home) must not hang the import
_BASE_FLAGS = ("-O3", "-ffp-contract=off", "-fPIC", "-shared")
# The builds tried, best first: this CPU's full ISA and OpenMP threads, then without -march=native
# (a compiler that cannot target the host), then single-threaded (no OpenMP: clang without libomp).
VARIANTS = {
    "native-openmp": ("-march=native", "-fopenmp"),
    "generic-openmp": ("-fopenmp",),
    "native-serial": ("-march=native",),
    "generic-serial": (),
}
_PTR, _I64 = ctypes.c_void_p, ctypes.c_int64
_LINEAR_ARGS = [_PTR] * 4 + [_I64] * 5 + [ctypes.c_int]
_ATTENTION_ARGS = [_PTR] * 5 + [_I64] * 10 + [ctypes.c_float, ctypes.c_int]
_SIGNATURES = {  # every symbol the Python side calls: (argument types, result type: 0 or -1 = out of memory)
    "sd_linear_f32": (_LINEAR_ARGS, ctypes.c_int), "sd_linear_bf16w": (_LINEAR_ARGS, ctypes.c_int),
    "sd_linear_reference_f32": (_LINEAR_ARGS[:-1], ctypes.c_int),
    "sd_linear_reference_bf16w": (_LINEAR_ARGS[:-1], ctypes.c_int),
    "sd_attention_f32": (_ATTENTION_ARGS, ctypes.c_int), "sd_attention_bf16kv": (_ATTENTION_ARGS, ctypes.c_int),
    "sd_last_team": ([], ctypes.c_int), "sd_has_openmp": ([], ctypes.c_int),
}


class _BadLibrary(Exception):
    """A library file that does not load (truncated, not a library, a symbol missing)."""


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        path = shutil.which(name) if name else None
        if path:
            return path
    return None


@functools.lru_cache(maxsize=None)
def _compiler_version(cc: str) -> str:
    """The first line of ``cc --version``: an upgraded compiler (same path) gets a build of its own."""
    try:
        proc = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
        return (proc.stdout.strip().splitlines() or ["unknown"])[0]
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _cpu_fingerprint() -> str:
    """What the compiled code depends on: the machine's ISA extensions (``-march=native``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def kernel_path(variant: str = next(iter(VARIANTS)), cc: str | None = None) -> Path:
    """Where this machine's build ``variant`` of the kernel lives: the directory is keyed by the sources,
    the compiler (path and version), the flags, the CPU's features and the platform; the file name says
    which variant (``-march=native`` or not, OpenMP or not) built it."""
    cc = cc or _compiler() or "none"
    key = hashlib.sha256()
    parts = (*(src.read_bytes() for src in (*_SOURCES, *_HEADERS)), cc, _compiler_version(cc) if cc != "none" else "",
             repr(_BASE_FLAGS), repr(VARIANTS), _cpu_fingerprint(), platform.machine(), sys.platform)
    for part in parts:
        key.update(part if isinstance(part, bytes) else part.encode())
        key.update(b"\0")
    return cache_dir() / "kernels" / key.hexdigest()[:16] / _file_name(variant)


def _file_name(variant: str) -> str:
    return f"specdecode_kernels-{variant}.so"


def _run_compiler(cmd: list[str]) -> tuple[int, str]:
    """Run ``cmd`` in a process group of its own, within COMPILE_TIMEOUT_S: past it (or on ^C) the whole
    group is killed, the driver's cc1, as and ld included. Returns (exit status, stderr)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=COMPILE_TIMEOUT_S)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, err


def _compile(cc: str, flags: tuple[str, ...], out: Path) -> str | None:
    """One compiler run into a temporary file beside ``out``, renamed onto it only once complete (so
    parallel processes never load half a file); the temporary file is gone whatever happens. Returns
    None, or the compiler's complaint. OSError: ``out``'s directory cannot be written."""
    fd, name = tempfile.mkstemp(dir=out.parent, prefix=".building-", suffix=".so")
    os.close(fd)
    tmp = Path(name)
    cmd = [cc, *_BASE_FLAGS, *flags, "-o", str(tmp), *map(str, _SOURCES), "-lm"]
    try:
        try:
            status, stderr = _run_compiler(cmd)
        except subprocess.TimeoutExpired:
            raise BackendUnavailable(f"the C compiler took longer than {COMPILE_TIMEOUT_S} s to build the "
                                     f"kernel and was stopped: {' '.join(cmd)}") from None
        except OSError as err:
            raise BackendUnavailable(f"the C compiler {cc} could not be run: {err}") from err
        if status != 0:
            return " ".join(cmd) + "\n" + stderr.strip()[-600:]
        os.chmod(tmp, 0o755)  # the linker's mode follows the umask; a group-writable file would not be trusted
        os.replace(tmp, out)
        return None
    finally:
        tmp.unlink(missing_ok=True)


def _build(cc: str, directory: Path) -> Path:
    """Build the first variant the compiler accepts into ``directory``; returns its file. Raises
    :class:`BackendUnavailable` when none builds, OSError when ``directory`` cannot be written."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o755)
    errors = []
    for variant, flags in VARIANTS.items():
        out = directory / _file_name(variant)
        error = _compile(cc, flags, out)
        if error is None:
            if "-fopenmp" not in flags:
                warnings.warn(f"specdecode: the C compiler {cc} has no OpenMP; the fast backend's kernels run on one "
                              "thread (install libomp, or set $CC to a compiler with OpenMP, for more)", stacklevel=4)
            return out
        errors.append(error)
    raise BackendUnavailable("the C compiler could not build the kernel:\n" + "\n".join(errors))


def _untrusted(path: Path) -> str | None:
    """Why the library at ``path`` must not be loaded (loading it runs its code as this user): it, or its
    directory (which could swap it), belongs to another user or is writable by others. None if fine."""
    for p in (path, path.parent):
        st = p.stat()
        if st.st_uid != os.geteuid():
            return f"{p} belongs to another user (uid {st.st_uid})"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return f"{p} is writable by other users (mode {stat.filemode(st.st_mode)})"
    return None


def _open(path: Path):
    """Load the library at ``path`` and type every symbol the Python side calls. Raises
    :class:`_BadLibrary` (with the reason) for a file that is not a complete build of the kernel."""
    try:
        lib = ctypes.CDLL(str(path))
        for name, (argtypes, restype) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, restype
    except (OSError, AttributeError) as err:
        raise _BadLibrary(str(err)) from err
    return lib


def _open_or_explain(path: Path):
    try:
        return _open(path)
    except _BadLibrary as err:
        raise BackendUnavailable(f"the compiled kernel {path} could not be loaded: {err}") from err


def _open_trusted(cc: str, path: Path):
    """The library at ``path`` if no other user could have written it, else a private build (saying why).
    Raises :class:`_BadLibrary` as :func:`_open` does."""
    problem = _untrusted(path)
    if problem:
        return _private_build(cc, f"the cached kernel is not loaded: {problem}")
    return _open(path)


def _private_build(cc: str, why: str):
    """A kernel for this process alone, where the cache cannot be used: built in a fresh directory of
    its own (mode 0700), loaded, and the directory removed (the loaded library stays mapped)."""
    with tempfile.TemporaryDirectory(prefix="specdecode-kernel-") as tmp:
        try:
            lib = _open_or_explain(_build(cc, Path(tmp)))
        except OSError as err:
            raise BackendUnavailable(f"{why}, and no private copy could be built either ({err}); set "
                                     "$SPECDECODE_CACHE to a directory of your own") from err
    warnings.warn(f"specdecode: {why}; built a private copy of the kernel for this process (set "
                  "$SPECDECODE_CACHE to a directory of your own to build it once)", stacklevel=4)
    return lib


def _load():
    """Find, check and load this machine's kernel, building it if need be. Every failure is a
    :class:`BackendUnavailable` saying why: the "auto" backend falls back to eager on any of them."""
    if sys.platform != "linux":
        raise BackendUnavailable(f"the fast backend is built and tested on Linux only (this is {sys.platform})")
    cc = _compiler()
    if cc is None:
        raise BackendUnavailable("no C compiler was found (install gcc, or set $CC)")
    cached = next((p for p in (kernel_path(v, cc) for v in VARIANTS) if p.exists()), None)
    if cached is not None:
        try:
            return _open_trusted(cc, cached)
        except _BadLibrary as err:
            warnings.warn(f"specdecode: the cached kernel {cached} could not be loaded ({err}); rebuilding it",
                          stacklevel=3)
            with contextlib.suppress(OSError):
                cached.unlink()
    directory = kernel_path(cc=cc).parent
    try:
        built = _build(cc, directory)
    except OSError as err:
        return _private_build(cc, f"the kernel cache {directory} cannot be written ({err})")
    try:
        return _open_trusted(cc, built)  # a directory shared with others could swap it before it is loaded
    except _BadLibrary as err:
        raise BackendUnavailable(f"the compiled kernel {built} could not be loaded: {err}") from err


def kernel_library():
    """The loaded kernel (a ctypes library), built on first use. Raises :class:`BackendUnavailable`.
    Once loaded it is returned without taking the lock: every product asks for it."""
    global _lib, _lib_error
    lib = _lib
    if lib is not None:
        return lib
    with _lock:
        if _lib is not None:
            return _lib
        if _lib_error is not None:
            raise BackendUnavailable(_lib_error)
        try:
            _lib = _load()
        except BackendUnavailable as err:
            _lib_error = str(err)
            raise
        except OSError as err:  # the cache changed under us (a file removed between two looks)
            _lib_error = f"the fast backend's kernel could not be set up: {err}"
            raise BackendUnavailable(_lib_error) from err
        return _lib


def kernel_variant() -> str:
    """Which build of the kernel runs here (a key of :data:`VARIANTS`)."""
    return Path(kernel_library()._name).name.removeprefix("specdecode_kernels-").removesuffix(".so")


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


def _check_cpu_tensor(name: str, t: torch.Tensor, dtypes=_KERNEL_DTYPES) -> None:
    """The kernels read raw CPU memory of one of ``dtypes``: anything else is refused, not misread."""
    if t.device.type != "cpu":
        raise ValueError(f"the kernel reads CPU tensors; {name} is on {t.device}")
    if t.dtype not in dtypes:
        names = " or ".join(str(dt).removeprefix("torch.") for dt in dtypes)
        raise ValueError(f"the kernel takes {name} of dtype {names}, not {t.dtype}")


def _check_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Every shape, device and dtype :func:`linear` reads, so that the kernel never reads past a tensor."""
    for name, t in (("x", x), ("the weight", weight), ("the bias", bias)):
        if t is not None:
            _check_cpu_tensor(name, t)
    if weight.dim() != 2:
        raise ValueError(f"the kernel takes a 2-D weight [N, K], got {tuple(weight.shape)}")
    n, k = weight.shape
    if x.dim() == 0 or x.shape[-1] != k:
        raise ValueError(f"x {tuple(x.shape)} has {x.shape[-1] if x.dim() else 0} features, the weight expects {k}")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"the bias has shape {tuple(bias.shape)}, the weight's {n} outputs need ({n},)")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` [..., K] -> [..., N] on the kernel: x (fp32 or bf16) widened
    exactly to fp32, fp32 or bf16 weights [N, K], fp32 sums; the result is rounded to ``x``'s dtype. Every output element is computed in
    the same order whatever the number of rows, so row i does not depend on the other rows."""
    _check_linear(x, weight, bias)
    return torch.ops.specdecode.linear(x, weight, bias)


def _linear_cpu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``specdecode::linear`` on CPU tensors (checked by :func:`linear`): the kernel's call."""
    lib = kernel_library()
    n, k = weight.shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k).float().contiguous()
    w = weight.contiguous()
    b = None if bias is None else bias.float().contiguous()
    m = x2.shape[0]
    y = torch.empty(m, n, dtype=torch.float32, device="cpu")
    if m:
        fn = lib.sd_linear_f32 if w.dtype == torch.float32 else lib.sd_linear_bf16w
        _kernel_ok(fn(x2.data_ptr(), w.data_ptr(), b.data_ptr() if b is not None else None, y.data_ptr(),
                      m, n, k, k, n, torch.get_num_threads()), "linear")
    if x.dtype != torch.float32:
        y = y.to(x.dtype)
    return y.reshape(*lead, n)


def linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The product by its definition: x [M, K] fp32 times weight [N, K] (fp32 or bf16), every output
    summed by the kernel's plain loop (``dot_row`` in kernels/linear.c), one after another, on one
    thread. Slow; the fast :func:`linear` must equal it bit for bit. Returns [M, N] fp32."""
    _check_linear(x, weight, bias)
    if x.dim() != 2 or x.dtype != torch.float32 or weight.dtype not in _KERNEL_DTYPES:
        raise ValueError(f"linear_reference takes x [M, K] fp32 and an fp32 or bf16 weight, got x "
                         f"{tuple(x.shape)} {x.dtype}, weight {weight.dtype}")
    lib = kernel_library()
    x2, w = x.contiguous(), weight.contiguous()
    b = None if bias is None else bias.float().contiguous()
    (m, k), n = x2.shape, w.shape[0]
    y = torch.empty(m, n, dtype=torch.float32, device="cpu")
    fn = lib.sd_linear_reference_f32 if w.dtype == torch.float32 else lib.sd_linear_reference_bf16w
    _kernel_ok(fn(x2.data_ptr(), w.data_ptr(), b.data_ptr() if b is not None else None, y.data_ptr(),
                  m, n, k, k, n), "linear_reference")
    return y


def _kernel_ok(status: int, name: str) -> None:
    """A kernel returns -1 when a buffer it needs cannot be allocated: raise, never return garbage."""
    if status != 0:
        raise MemoryError(f"the fast backend's {name} kernel could not allocate its scratch memory")


def _linear_fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """What ``specdecode::linear`` returns, for tracing (torch.compile) without running it."""
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


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


CAUSAL = ("last", "first", None)  # where attention() places Q queries among S keys when there is no mask


def _check_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, causal) -> None:
    """Every shape, device and dtype :func:`attention` reads, so that the kernel never reads past a tensor."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        _check_cpu_tensor(name, t)
    if query.dim() != 4 or key.dim() != 4:
        raise ValueError(f"attention takes 4-D query [B, H, Q, D] and key/value [B, KVH, S, D], got "
                         f"{tuple(query.shape)} and {tuple(key.shape)}")
    b, h, _, d = query.shape
    if (key.shape != value.shape or key.shape[0] != b or key.shape[3] != d or key.shape[1] == 0
            or h % key.shape[1] or not query.dtype == key.dtype == value.dtype):
        raise ValueError(f"attention: query {tuple(query.shape)} {query.dtype} does not match key "
                         f"{tuple(key.shape)} {key.dtype} and value {tuple(value.shape)} {value.dtype}")
    if causal not in CAUSAL:
        raise ValueError(f"attention: causal must be one of {CAUSAL}, not {causal!r}")


_MASK_DTYPES = (torch.bool, torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _check_mask(mask: torch.Tensor, b: int, h: int, q: int, s: int) -> None:
    """A mask must be 4-D [B or 1, H or 1, Q or 1, S or 1]: SDPA's broadcasting, minus a 2-D or 3-D
    mask's implicit leading dims (a [B, S] padding mask would otherwise be read as [Q, S])."""
    _check_cpu_tensor("the mask", mask, _MASK_DTYPES)
    if mask.dim() != 4 or any(n not in (1, want) for n, want in zip(mask.shape, (b, h, q, s))):
        raise ValueError(f"attention: a mask must be 4-D and broadcast to [B, H, Q, S] = {[b, h, q, s]}, "
                         f"got {tuple(mask.shape)}")


_mask_memo = None  # (weak reference to a mask, its version, the shape it was read for, the kernel's mask, strides)


def _forget_mask(ref: weakref.ref) -> None:
    """The mask is gone (its forward is over): so is its conversion, which may be large."""
    global _mask_memo
    memo = _mask_memo
    if memo is not None and memo[0] is ref:
        _mask_memo = None


def _kernel_mask(mask: torch.Tensor, b: int, h: int, q: int, s: int) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """``mask`` as the kernel reads it: additive fp32, keys contiguous, and the strides of its batch, head
    and query dims (0 where a dim of size 1 broadcasts). transformers hands every layer the same mask,
    so the last conversion is kept while that very tensor lives unchanged (its version counter: an
    in-place write, through any view, converts it again). An inference tensor keeps no version: it is
    converted every time."""
    global _mask_memo
    key = (b, h, q, s)
    memo = _mask_memo
    tracked = not mask.is_inference()
    if tracked and memo is not None and memo[0]() is mask and memo[1] == mask._version and memo[2] == key:
        return memo[3], memo[4]
    converted = mask
    if converted.dtype == torch.bool:
        converted = torch.zeros(mask.shape, dtype=torch.float32, device="cpu").masked_fill_(~mask, float("-inf"))
    converted = converted.float().expand(*mask.shape[:3], s).contiguous()
    strides = tuple(converted.stride(i) if converted.shape[i] > 1 else 0 for i in range(3))
    if tracked and converted is not mask:
        _mask_memo = (weakref.ref(mask, _forget_mask), mask._version, key, converted, strides)
    return converted, strides


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None = None,
              scale: float | None = None, causal: str | None = "last") -> torch.Tensor:
    """Softmax attention on the kernel, one query at a time: query [B, H, Q, D], key and value
    [B, KVH, S, D] (H a multiple of KVH), fp32 or bf16 CPU tensors of one dtype.

    With no mask, ``causal`` says which keys query i sees: "last" (it sits at key position S - Q + i:
    a cache, then the new tokens, as in decoding and verifying), "first" (at key position i: SDPA's
    ``is_causal``) or None (every key). A mask [B or 1, H or 1, Q or 1, S or 1], boolean (True =
    visible) or additive (<= -1e30 = not visible), replaces it: pass one or the other.
    Returns [B, Q, H, D] in ``query``'s dtype: transformers' layout before the output projection."""
    _check_attention(query, key, value, causal)
    if mask is not None:
        if causal != "last":
            raise ValueError(f"attention: pass a mask or causal={causal!r}, not both")
        _check_mask(mask, query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    scale = query.shape[-1] ** -0.5 if scale is None else float(scale)
    return torch.ops.specdecode.attention(query, key, value, mask, scale, causal)


def _attention_cpu(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                   scale: float, causal: str | None) -> torch.Tensor:
    """``specdecode::attention`` on CPU tensors (checked by :func:`attention`): the kernel's call. bf16
    keys and values are read as they are (the kernel widens them), not copied to fp32."""
    lib = kernel_library()
    b, h, q, d = query.shape
    kvh, s = key.shape[1], key.shape[2]
    qf, kc, vc = query.float().contiguous(), key.contiguous(), value.contiguous()
    strides = (0, 0, 0)
    if mask is not None:
        mask, strides = _kernel_mask(mask, b, h, q, s)
    diag = {"last": s - q, "first": 0, None: s}[causal]
    out = torch.empty(b, q, h, d, dtype=torch.float32, device="cpu")
    fn = lib.sd_attention_f32 if kc.dtype == torch.float32 else lib.sd_attention_bf16kv
    _kernel_ok(fn(qf.data_ptr(), kc.data_ptr(), vc.data_ptr(), mask.data_ptr() if mask is not None else None,
                  out.data_ptr(), b, h, kvh, q, s, d, *strides, diag, scale, torch.get_num_threads()), "attention")
    return out if query.dtype == torch.float32 else out.to(query.dtype)


def _attention_fake(query, key, value, mask, scale, causal) -> torch.Tensor:
    """What ``specdecode::attention`` returns, for tracing (torch.compile) without running it."""
    b, h, q, d = query.shape
    return query.new_empty((b, q, h, d))


# The kernels as torch operators, like aten's: torch.compile puts them in its graph (the fake
# functions give it their output shapes) and torch.profiler shows them as specdecode::linear and
# specdecode::attention. Defined with a CPU kernel and no autograd formula (the modules send products
# that need gradients to F.linear and SDPA): dispatching costs about 1 us a call, where
# torch.library.custom_op's Python autograd layer costs about 6.
_ops = torch.library.Library("specdecode", "DEF")
_ops.define("linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor")
_ops.define("attention(Tensor query, Tensor key, Tensor value, Tensor? mask, float scale, str? causal) -> Tensor")
_ops.impl("linear", _linear_cpu, "CPU")
_ops.impl("attention", _attention_cpu, "CPU")
torch.library.register_fake("specdecode::linear", _linear_fake, lib=_ops)
torch.library.register_fake("specdecode::attention", _attention_fake, lib=_ops)


_SDPA_EXTRAS = ("sliding_window", "softcap", "s_aux", "position_bias", "cache")  # what SDPA alone implements


def _kernel_takes(query, key, value, attention_mask, dropout, kwargs) -> bool:
    """Whether transformers' attention call is one the kernel computes: CPU, fp32 or bf16, no gradients,
    no dropout, values shaped like the keys, a 4-D mask or none (SDPA would broadcast a smaller one
    from the right), and none of the extras (sliding windows, soft-capping, sinks, position biases,
    paged caches)."""
    return (query.device.type == "cpu" and query.dtype in _KERNEL_DTYPES and not dropout
            and not (torch.is_grad_enabled() and (query.requires_grad or key.requires_grad))
            and key.shape == value.shape and (attention_mask is None or attention_mask.dim() == 4)
            and all(kwargs.get(extra) is None for extra in _SDPA_EXTRAS))


def _sdpa_without_mask(module, query, key, value, is_causal):
    """What transformers' ``sdpa_attention_forward`` computes when it is given no mask, as the kernel's
    arguments (key, value, causal). Causal only for more than one query and a causal module, and then
    SDPA's ``is_causal``: aligned with the *first* keys, the keys after the queries cut off (a
    StaticCache's prefill: the prompt, then empty slots). A single query, or a bidirectional module,
    sees every key."""
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    q = query.shape[2]
    if q > 1 and is_causal:
        return key[:, :, :q], value[:, :, :q], "first"
    return key, value, None


def _transformers_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                            **kwargs):
    """The kernel's attention behind transformers' attention interface, with SDPA's semantics for every
    mask transformers passes (none included). Anything it does not cover runs SDPA itself."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not _kernel_takes(query, key, value, attention_mask, dropout, kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    if attention_mask is not None:
        return attention(query, key, value, attention_mask, scaling), None
    key, value, causal = _sdpa_without_mask(module, query, key, value, is_causal)
    return attention(query, key, value, scale=scaling, causal=causal), None


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
           "fast_available", "kernel_library", "kernel_path", "kernel_variant", "linear", "resolve_backend"]
