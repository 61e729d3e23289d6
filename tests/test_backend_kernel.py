"""The product kernel read as a definition and an implementation (kernels/linear.c).

``dot_row`` is the plain loop whose summation order defines every output; ``sd_linear_reference_*``
is the product written with it, one output after another. The fast ``sd_linear_*`` (tiles of weight
rows read once, token rows in register blocks, prefetching, threads) must give the same bits for
every shape: every number of token rows M across the block sizes, weight-row counts that leave a
short last tile, K with and without a tail after the last full vector, with and without a bias, on
one thread and on two. bf16 weights must give exactly the fp32 result of the widened weights.

Each comparison also runs on a planted twin (torch's own product, whose summation order differs),
to show that the comparison can fail.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specdecode_ref import backend

pytestmark = pytest.mark.skipif(not backend.fast_available()[0], reason="the fast backend cannot run here: "
                                + backend.fast_available()[1])

MS = list(range(1, 15)) + [17]          # past twice the largest block of token rows on every CPU
SHAPES = [(1, 1), (3, 7), (4, 16), (5, 17), (13, 64), (37, 100), (64, 576), (130, 1536)]


def bitwise_mismatches(product, dtype: torch.dtype, threads: int, seed: int = 0) -> list:
    """Every (shape, M, bias) where ``product(x, w, bias)`` differs in any bit from the reference."""
    g = torch.Generator().manual_seed(seed)
    bad = []
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for n, k in SHAPES:
            w = torch.randn(n, k, generator=g).to(dtype)
            b = torch.randn(n, generator=g)
            x = torch.randn(max(MS), k, generator=g)
            for bias in (None, b):
                for m in MS:
                    xm = x[:m].contiguous()
                    if not torch.equal(product(xm, w, bias), backend.linear_reference(xm, w, bias)):
                        bad.append((n, k, m, bias is not None))
    finally:
        torch.set_num_threads(old)
    return bad


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_product_equals_the_plain_definition_bit_for_bit(dtype, threads):
    assert bitwise_mismatches(backend.linear, dtype, threads) == []


def test_planted_twin_another_summation_order_is_caught():
    """torch's product sums in another order: the same comparison finds it on most shapes."""
    twin = lambda x, w, bias: F.linear(x, w.float(), bias)  # noqa: E731
    bad = bitwise_mismatches(twin, torch.float32, threads=1)
    assert len(bad) > len(SHAPES)


def test_bf16_weights_give_exactly_the_widened_fp32_product():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(37, 600, generator=g).bfloat16()
    x = torch.randn(9, 600, generator=g)
    assert torch.equal(backend.linear(x, w), backend.linear(x, w.float()))
    # planted twin: rounding the activations to bf16 too (as a bf16 dot-product instruction would)
    # is a different number, and the comparison sees it
    assert not torch.equal(backend.linear(x.bfloat16().float(), w), backend.linear(x, w.float()))


def test_reference_agrees_with_float64_to_fp32_rounding():
    """The definition itself is a correct product (up to fp32 rounding of a length-K sum)."""
    g = torch.Generator().manual_seed(2)
    w, x, b = torch.randn(50, 777, generator=g), torch.randn(6, 777, generator=g), torch.randn(50, generator=g)
    want = F.linear(x.double(), w.double(), b.double())
    got = backend.linear_reference(x, w, b).double()
    assert (got - want).abs().max() < 1e-4


def test_reference_refuses_what_it_does_not_define():
    with pytest.raises(ValueError, match="linear_reference takes"):
        backend.linear_reference(torch.randn(2, 3, 4), torch.randn(5, 4))
    with pytest.raises(ValueError, match="linear_reference takes"):
        backend.linear_reference(torch.randn(2, 4).bfloat16(), torch.randn(5, 4))
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        backend.linear_reference(torch.randn(2, 4).double(), torch.randn(5, 4).double())


def _product_of_library(lib, fast: bool):
    """``product(x, w, bias)`` calling one build's fast or reference entry point directly."""
    import ctypes

    def product(x, w, bias):
        m, k = x.shape
        n = w.shape[0]
        y = torch.empty(m, n)
        kind = "f32" if w.dtype == torch.float32 else "bf16w"
        fn = getattr(lib, f"sd_linear_{kind}" if fast else f"sd_linear_reference_{kind}")
        args = [ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(w.data_ptr()),
                ctypes.c_void_p(bias.data_ptr() if bias is not None else None), ctypes.c_void_p(y.data_ptr()),
                *map(ctypes.c_int64, (m, n, k, k, n))]
        assert fn(*args, *([ctypes.c_int(2)] if fast else [])) == 0
        return y
    return product


@pytest.mark.parametrize("flags", [(), ("-march=native", "-fopenmp", "-DBLOCK_MAX=2")],
                         ids=["generic-no-fma-8-lanes", "native-blocks-of-2"])
def test_other_builds_also_equal_their_own_definition(flags, tmp_path):
    """The same equality in the builds other CPUs get: no -march=native (8 lanes, a multiply then an
    add where this CPU would fuse them) and a smaller register block (as on AVX2 or NEON)."""
    import ctypes

    cc = backend._compiler()
    if cc is None:
        pytest.skip("no C compiler")
    out = tmp_path / "variant.so"
    error = backend._compile(cc, flags, out)
    if error is not None:
        pytest.skip(f"this compiler cannot build {flags}: {error[-200:]}")
    lib = ctypes.CDLL(str(out))
    fast, reference = _product_of_library(lib, True), _product_of_library(lib, False)
    g = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.bfloat16):
        for n, k in SHAPES:
            w = torch.randn(n, k, generator=g).to(dtype)
            x = torch.randn(max(MS), k, generator=g)
            for m in MS:
                xm = x[:m].contiguous()
                assert torch.equal(fast(xm, w, None), reference(xm, w, None)), (flags, dtype, n, k, m)
