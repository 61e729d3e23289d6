"""The fast backend's kernels as torch operators (backend.py): torch.compile traces through them,
torch.profiler names them, and the result of every product is bitwise the same on any number of
threads, with the small ones kept off the thread team. Also the per-call shortcuts: the loaded kernel
is returned without the lock, and a mask is converted once per tensor, again only when it changes.
"""
from __future__ import annotations

import ctypes
import weakref

import pytest
import torch
import torch.nn.functional as F

from specdecode_ref import backend
from specdecode_ref.backend import apply_backend

from support import make_tiny_llama

pytestmark = pytest.mark.skipif(not backend.fast_available()[0], reason="the fast backend cannot run here: "
                                + backend.fast_available()[1])


# --------------------------------------------------------------------------------------------
# torch.compile and torch.profiler
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16])
def test_compiled_fast_linear_equals_the_uncompiled_one_bitwise(wdtype):
    """fullgraph=True: the product must be an operator of the graph, not a call dynamo cannot trace."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.GELU(), torch.nn.Linear(24, 8)).to(wdtype)
    apply_backend(net, "fast")
    x = torch.randn(5, 16, dtype=wdtype)
    torch._dynamo.reset()
    compiled = torch.compile(net, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(x), net(x))
        assert torch.equal(compiled(x[:2]), net(x[:2]))


def _greedy(model, ids, steps=5):
    for _ in range(steps):
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        ids = torch.cat([ids, logits[:, -1:].argmax(-1)], 1)
    return ids[0, -steps:].tolist()


def test_compiled_tiny_llama_on_the_fast_backend_decodes_as_eager():
    fast = apply_backend(make_tiny_llama(vocab_size=96, init_range=0.3), "fast")
    eager = apply_backend(make_tiny_llama(vocab_size=96, init_range=0.3), "eager")
    ids = torch.randint(1, 96, (1, 9), generator=torch.Generator().manual_seed(100))
    torch._dynamo.reset()
    compiled = torch.compile(fast, backend="aot_eager", fullgraph=True)
    assert _greedy(compiled, ids) == _greedy(fast, ids) == _greedy(eager, ids)
    with torch.no_grad():
        assert torch.equal(compiled(input_ids=ids).logits, fast(input_ids=ids).logits)


def test_fake_implementations_give_the_output_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        y = torch.ops.specdecode.linear(torch.empty(2, 3, 16, dtype=torch.bfloat16), torch.empty(8, 16), None)
        o = torch.ops.specdecode.attention(torch.empty(2, 6, 3, 8), torch.empty(2, 2, 5, 8), torch.empty(2, 2, 5, 8),
                                           None, 0.5, "last")
    assert (y.shape, y.dtype) == ((2, 3, 8), torch.bfloat16)
    assert (o.shape, o.dtype) == ((2, 3, 6, 8), torch.float32)


def test_profiler_names_the_kernels_as_top_level_operators():
    """What engine_profile.py (notebook 00) counts: top-level events named specdecode::linear and
    specdecode::attention, the kernels' own tensor copies inside them."""
    model = apply_backend(make_tiny_llama(vocab_size=96), "fast")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof, torch.no_grad():
        model(input_ids=torch.tensor([[1, 2, 3]]))
    top = {e.name for e in prof.events() if e.cpu_parent is None}
    assert {"specdecode::linear", "specdecode::attention"} <= top


# --------------------------------------------------------------------------------------------
# Threads
# --------------------------------------------------------------------------------------------
def _serial_work() -> int:
    return ctypes.c_int64.in_dll(backend.kernel_library(), "sd_serial_work").value


def _cases():
    """Products and attentions just below, at and well above the size that wakes the thread team."""
    work, g = _serial_work(), torch.Generator().manual_seed(0)
    cases = []
    for m, n, k in ((1, 8, 8), (1, 64, work // 64 - 1), (1, 64, work // 64), (3, 200, 700)):
        x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
        cases.append(("linear", lambda x=x, w=w: backend.linear(x, w), m * n * k))
        cases.append(("linear bf16", lambda x=x, w=w: backend.linear(x, w.to(torch.bfloat16)), m * n * k))
    for b, h, q, s, d in ((1, 2, 1, 8, 8), (1, 8, 4, work // (8 * 4 * 32) + 1, 32)):
        qkv = [torch.randn(b, h, q, d, generator=g)] + [torch.randn(b, h // 2, s, d, generator=g) for _ in range(2)]
        cases.append(("attention", lambda qkv=qkv: backend.attention(*qkv), b * h * q * s * d))
        cases.append(("attention bf16", lambda qkv=qkv: backend.attention(*(t.to(torch.bfloat16) for t in qkv)),
                      b * h * q * s * d))
    return cases


def _on_threads(n, fn):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


def same_on_any_threads(fn) -> bool:
    """Whether ``fn()`` is bitwise the same on 1, 2 and 3 threads."""
    one = _on_threads(1, fn)
    return all(torch.equal(_on_threads(n, fn), one) for n in (2, 3))


def planted_thread_dependent():
    """A product whose rounding depends on the number of threads (as a split of the sum would)."""
    y = backend.linear(torch.ones(1, 64), torch.ones(8, 64))
    return y + y.abs() * (torch.get_num_threads() - 1) * 2.0 ** -23


def test_results_are_bitwise_the_same_on_any_number_of_threads():
    for name, fn, work in _cases():
        assert same_on_any_threads(fn), (name, work)
    assert not same_on_any_threads(planted_thread_dependent)


def test_small_products_run_on_the_calling_thread_and_large_ones_on_the_team():
    lib = backend.kernel_library()
    if not lib.sd_has_openmp():
        pytest.skip("the kernel was built without OpenMP: every product runs on the calling thread")
    work = _serial_work()
    for name, fn, size in _cases():
        _on_threads(2, fn)
        assert lib.sd_last_team() == (1 if size < work else 2), (name, size)
        _on_threads(1, fn)
        assert lib.sd_last_team() == 1, (name, size)


# --------------------------------------------------------------------------------------------
# Per-call shortcuts
# --------------------------------------------------------------------------------------------
def test_loaded_kernel_is_returned_without_the_lock(monkeypatch):
    lib = backend.kernel_library()

    class Taken:
        def __enter__(self):
            raise AssertionError("kernel_library() took the lock after the kernel was loaded")

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(backend, "_lock", Taken())
    assert backend.kernel_library() is lib
    backend.linear(torch.randn(1, 8), torch.randn(4, 8))


def test_mask_is_converted_once_per_tensor_and_again_when_it_changes():
    vis = torch.rand(2, 1, 3, 5, generator=torch.Generator().manual_seed(0)) < 0.7
    vis[..., 0] = True
    first, strides = backend._kernel_mask(vis, 2, 4, 3, 5)
    assert backend._kernel_mask(vis, 2, 4, 3, 5)[0] is first          # the next layer: no conversion
    assert strides == (first.stride(0), 0, first.stride(2))
    vis[0, 0, 0, 1] = False                                            # written in place: converted again
    again = backend._kernel_mask(vis, 2, 4, 3, 5)[0]
    assert again is not first and again[0, 0, 0, 1] == float("-inf")
    keys = torch.ones(1, 1, 3, 1, dtype=torch.bool)                    # broadcast over the keys: per key count
    assert backend._kernel_mask(keys, 2, 4, 3, 5)[0].shape == (1, 1, 3, 5)
    assert backend._kernel_mask(keys, 2, 4, 3, 7)[0].shape == (1, 1, 3, 7)
    with torch.inference_mode():                                       # no version counter: no reuse
        frozen = vis.clone()
        assert backend._kernel_mask(frozen, 2, 4, 3, 5)[0] is not backend._kernel_mask(frozen, 2, 4, 3, 5)[0]


def test_mask_conversion_is_dropped_with_its_mask():
    """The conversion lives as long as the mask transformers made for the forward, not after it."""
    vis = torch.ones(1, 1, 4, 6, dtype=torch.bool)
    converted = weakref.ref(backend._kernel_mask(vis, 1, 2, 4, 6)[0])
    assert converted() is not None
    del vis
    assert backend._mask_memo is None and converted() is None


def test_attention_follows_a_mask_written_in_place_between_calls():
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(1, 2, 3, 8, generator=g), torch.randn(1, 2, 6, 8, generator=g), torch.randn(1, 2, 6, 8, generator=g)
    vis = torch.ones(1, 1, 3, 6, dtype=torch.bool)
    for step in range(3):
        got = backend.attention(q, k, v, vis)
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=vis).transpose(1, 2)
        assert (got - want).abs().max() < 1e-5, step
        vis[..., step] = False


@pytest.mark.parametrize("d", [16, 13])   # 13: the scalar tail of the dot products and the value sums
@pytest.mark.parametrize("mask", [False, True])
def test_bf16_keys_and_values_read_in_place_equal_the_fp32_path_bitwise(d, mask):
    """The kernel widens a bf16 cache as it reads it (exact), instead of a converted copy per layer."""
    g = torch.Generator().manual_seed(d)
    q, k, v = (torch.randn(2, 4, 3, d, generator=g).to(torch.bfloat16),
               torch.randn(2, 2, 11, d, generator=g).to(torch.bfloat16), torch.randn(2, 2, 11, d, generator=g).to(torch.bfloat16))
    m = (torch.rand(2, 1, 3, 11, generator=g) < 0.7) if mask else None
    got = backend.attention(q, k, v, m)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, backend.attention(q.float(), k.float(), v.float(), m).to(torch.bfloat16))
