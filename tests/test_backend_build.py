"""Building, caching and loading the fast backend's kernel (backend.py): every failure is a clear
message and a fallback, never an exception out of the "auto" backend, and nothing is loaded that
another user could have written.

Each test builds into a temporary cache ($SPECDECODE_CACHE); failures are simulated with fake
compilers (shell scripts that misbehave, or pass the arguments on to the real one) and monkeypatching.
"""
from __future__ import annotations

import errno
import os
import re
import stat
import tempfile
import time
import warnings
from pathlib import Path

import pytest
import torch

from specdecode_ref import backend
from specdecode_ref.backend import BackendUnavailable, resolve_backend

pytestmark = pytest.mark.skipif(not backend.fast_available()[0], reason="the fast backend cannot run here: "
                                + backend.fast_available()[1])

REAL_CC = backend._compiler()
CPU = torch.device("cpu")


def _fresh_cache(monkeypatch, tmp_path) -> Path:
    """A process that has loaded nothing yet, with an empty cache of its own (undone after the test)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECDECODE_CACHE", str(cache))
    monkeypatch.setattr(backend, "_lib", None)
    monkeypatch.setattr(backend, "_lib_error", None)
    backend._warned.clear()
    return cache


def _fake_cc(tmp_path, monkeypatch, body: str) -> str:
    """$CC pointed at a shell script: ``body`` runs with the compiler's arguments; ``--version`` answers."""
    script = tmp_path / "fake-cc"
    script.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then echo "fake cc 1.0"; exit 0; fi\n{body}\n')
    script.chmod(0o755)
    monkeypatch.setenv("CC", str(script))
    return str(script)


def _products():
    """A product and an attention with the shapes of the tiny model, bf16 included."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 40, generator=g), torch.randn(24, 40, generator=g)
    q, k, v = torch.randn(1, 4, 3, 12, generator=g), torch.randn(1, 2, 9, 12, generator=g), torch.randn(1, 2, 9, 12, generator=g)
    return (backend.linear(x, w), backend.linear(x, w.to(torch.bfloat16)), backend.attention(q, k, v),
            backend.attention(q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16)))


def _works():
    lib = backend.kernel_library()
    x, w = torch.randn(2, 16), torch.randn(8, 16)
    assert torch.allclose(backend.linear(x, w), x @ w.T, atol=1e-5)
    return lib


def _leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.rglob("*") if p.is_file())


def test_cache_key_covers_the_flags_the_compilers_version_and_the_variant(monkeypatch, tmp_path):
    _fresh_cache(monkeypatch, tmp_path)
    path = backend.kernel_path()
    assert path.is_relative_to(tmp_path) and "native-openmp" in path.name
    variants = {backend.kernel_path(v) for v in backend.VARIANTS}
    assert len(variants) == len(backend.VARIANTS)   # -march=native or not, OpenMP or not: four files
    monkeypatch.setattr(backend, "_compiler_version", lambda cc: "cc (Debian 99.0.0) 99.0.0")
    assert backend.kernel_path() != path            # an upgraded compiler at the same path
    monkeypatch.undo()
    _fresh_cache(monkeypatch, tmp_path)
    assert backend.kernel_path() == path
    monkeypatch.setattr(backend, "_BASE_FLAGS", (*backend._BASE_FLAGS, "-fno-tree-vectorize"))
    assert backend.kernel_path() != path
    monkeypatch.setattr(backend, "_BASE_FLAGS", backend._BASE_FLAGS[:-1])
    monkeypatch.setitem(backend.VARIANTS, "native-openmp", ("-march=x86-64-v2", "-fopenmp"))
    assert backend.kernel_path() != path


def test_kernel_is_built_under_a_temporary_name_and_only_its_file_is_left(monkeypatch, tmp_path):
    cache = _fresh_cache(monkeypatch, tmp_path)
    _works()
    assert _leftovers(cache) == [backend.kernel_path().name]
    mode = backend.kernel_path().stat().st_mode
    assert not mode & (stat.S_IWGRP | stat.S_IWOTH)   # whatever the umask: a file we would trust again


def test_corrupt_cached_library_is_rebuilt_once_with_its_path_said(monkeypatch, tmp_path):
    _fresh_cache(monkeypatch, tmp_path)
    path = backend.kernel_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 40)   # a truncated library
    with pytest.warns(UserWarning, match=re.escape(str(path)) + ".*rebuilding"):
        lib = _works()
    assert Path(lib._name) == path and path.stat().st_size > 1000


def test_library_that_fails_again_after_its_rebuild_names_its_path_and_auto_falls_back(monkeypatch, tmp_path):
    _fresh_cache(monkeypatch, tmp_path)
    _fake_cc(tmp_path, monkeypatch, 'while [ "$1" != -o ]; do shift; done; echo "not a library" > "$2"')
    path = backend.kernel_path()
    with pytest.raises(BackendUnavailable, match=re.escape(str(path)) + " could not be loaded"):
        backend.kernel_library()
    with pytest.warns(UserWarning, match="eager"):
        assert resolve_backend("auto", CPU, torch.float32) == "eager"


def test_missing_symbol_falls_back_like_any_other_failure(monkeypatch, tmp_path):
    """A library without one of the symbols (here: built from linear.c alone) is a BackendUnavailable,
    so "auto" takes the eager forward; it never escapes as ctypes' AttributeError."""
    _fresh_cache(monkeypatch, tmp_path)
    _fake_cc(tmp_path, monkeypatch, 'for a in "$@"; do shift; case "$a" in *attention.c) ;; *) set -- "$@" "$a";; esac; done\n'
             f'exec {REAL_CC} "$@"')
    ok, why = backend.fast_available()
    assert not ok and "sd_attention_f32" in why and str(backend.kernel_path()) in why
    with pytest.warns(UserWarning, match="sd_attention_f32"):
        assert resolve_backend("auto", CPU, torch.float32) == "eager"


def _running(pid: int) -> bool:
    """Whether process ``pid`` still runs (a killed one may linger as a zombie until it is reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_compiler_that_hangs_is_stopped_with_its_children_and_leaves_no_temporary_file(monkeypatch, tmp_path):
    """Past the time limit the compiler is killed with the processes it started (as a driver's cc1)."""
    cache = _fresh_cache(monkeypatch, tmp_path)
    monkeypatch.setattr(backend, "COMPILE_TIMEOUT_S", 1)
    pidfile = tmp_path / "helper.pid"
    _fake_cc(tmp_path, monkeypatch, f'sleep 60 >/dev/null 2>&1 & echo $! > "{pidfile}"; wait')
    start = time.monotonic()
    with pytest.raises(BackendUnavailable, match="longer than 1 s"):
        backend.kernel_library()
    assert time.monotonic() - start < 30
    assert _leftovers(cache) == []
    helper = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _running(helper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(helper)


def test_failed_build_leaves_no_temporary_file(monkeypatch, tmp_path):
    cache = _fresh_cache(monkeypatch, tmp_path)
    _fake_cc(tmp_path, monkeypatch, 'while [ "$1" != -o ]; do shift; done; echo half > "$2"; echo "error: no" >&2; exit 1')
    with pytest.raises(BackendUnavailable, match="could not build the kernel(.|\n)*error: no"):
        backend.kernel_library()
    assert _leftovers(cache) == []


def _refuse_writes_under(monkeypatch, root: Path | None):
    """mkstemp fails with EACCES under ``root`` (everywhere if None), as in a read-only directory (a
    chmod would not do: this test may run as root, whom permission bits do not stop)."""
    real = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):
        if root is None or Path(dir).is_relative_to(root):
            raise PermissionError(errno.EACCES, "Permission denied", str(dir))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


def test_read_only_cache_says_so_and_a_private_copy_runs(monkeypatch, tmp_path):
    cache = _fresh_cache(monkeypatch, tmp_path)
    _refuse_writes_under(monkeypatch, cache)
    with pytest.warns(UserWarning, match=f"{re.escape(str(backend.kernel_path().parent))} cannot be written"
                                         ".*Permission denied.*private copy.*SPECDECODE_CACHE"):
        lib = _works()
    assert not Path(lib._name).exists() and not Path(lib._name).is_relative_to(cache)   # built aside, removed


def test_read_only_cache_and_no_private_copy_is_one_clear_message(monkeypatch, tmp_path):
    cache = _fresh_cache(monkeypatch, tmp_path)
    _refuse_writes_under(monkeypatch, None)
    with pytest.raises(BackendUnavailable, match=f"{re.escape(str(cache))}.* cannot be written.*SPECDECODE_CACHE"):
        backend.kernel_library()


@pytest.mark.parametrize("how", ["another user's", "group-writable"])
def test_library_another_user_could_have_written_is_not_loaded(monkeypatch, tmp_path, how):
    """A shared cache: the file (or its directory) of another user, or one others may write, is not
    loaded (it would run their code as us); a private copy is built instead, the cached file untouched."""
    _fresh_cache(monkeypatch, tmp_path)
    path = Path(_works()._name)
    before = path.read_bytes()
    monkeypatch.setattr(backend, "_lib", None)
    if how == "another user's":
        uid = os.geteuid()
        monkeypatch.setattr(os, "geteuid", lambda: uid + 1)
        why = "belongs to another user"
    else:
        path.chmod(0o775)
        why = "is writable by other users"
    with pytest.warns(UserWarning, match=f"{re.escape(str(path))} {why}.*private copy"):
        lib = _works()
    assert Path(lib._name) != path and path.read_bytes() == before


def test_kernel_built_into_a_shared_directory_is_not_loaded_from_it(monkeypatch, tmp_path):
    """A cache directory others may write (here mode 777): they could swap the file between its build and
    its loading, so a private copy is loaded instead."""
    _fresh_cache(monkeypatch, tmp_path)
    shared = backend.kernel_path().parent
    shared.mkdir(parents=True)
    shared.chmod(0o777)
    with pytest.warns(UserWarning, match=f"{re.escape(str(shared))} is writable by other users.*private copy"):
        lib = _works()
    assert not Path(lib._name).is_relative_to(shared)


def test_compiler_without_openmp_builds_a_single_threaded_kernel_with_the_same_results(monkeypatch, tmp_path):
    want = _products()
    _fresh_cache(monkeypatch, tmp_path)
    # no OpenMP at all: -fopenmp refused, and no OpenMP runtime to resolve an omp_* call against (in this
    # process torch's would, so the link must refuse undefined symbols)
    _fake_cc(tmp_path, monkeypatch,
             "for a in \"$@\"; do if [ \"$a\" = -fopenmp ]; then echo \"clang: error: unsupported option '-fopenmp'\" >&2;"
             f" exit 1; fi; done\nexec {REAL_CC} \"$@\" -Wl,--no-undefined")
    with pytest.warns(UserWarning, match="no OpenMP"):
        lib = backend.kernel_library()
    assert backend.kernel_variant() == "native-serial" and lib.sd_has_openmp() == 0
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = _products()
        x, w = torch.randn(4, 512), torch.randn(512, 512)   # large enough to be split with OpenMP
        backend.linear(x, w)
        assert lib.sd_last_team() == 1
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_no_variant_builds_lists_every_attempt(monkeypatch, tmp_path):
    _fresh_cache(monkeypatch, tmp_path)
    _fake_cc(tmp_path, monkeypatch, 'echo "cc: fatal error" >&2; exit 1')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ok, why = backend.fast_available()
    assert not ok and why.count("fatal error") == len(backend.VARIANTS)
