"""The fast backend on every path transformers drives it through: it must give the eager model's
numbers whatever cache, mask shape or dtype the model hands its attention.

transformers' attention interface does not always pass a mask: where SDPA's own ``is_causal`` can
stand in for it (a prefill into an empty cache, a single decoded token) the mask is None, and
SDPA's causal mask is aligned with the *first* keys. A StaticCache prefill relies on that: its keys
are the prompt followed by empty, zero-filled slots. Read with the decoding convention (queries are
the last Q keys) the prompt attends to the empty slots, a silent wrong answer; these tests pin the
backend to SDPA's semantics on each path: caches (dynamic, static; prefill, decode,
``generate``), a left-padded batch, a tree mask, bf16, and the shapes it must refuse.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache, StaticCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specdecode_ref import backend, trees
from specdecode_ref.backend import apply_backend

from support import make_tiny_llama

pytestmark = pytest.mark.skipif(not backend.fast_available()[0], reason="the fast backend cannot run here: "
                                + backend.fast_available()[1])

ATOL = 1e-4        # fp32: the kernels sum in another order than the BLAS, nothing more
BF16_RTOL = 2 ** -5  # bf16, relative to the largest logit: 4 units in the last place of its 8-bit
                     # mantissa. Eager rounds every activation to bf16, the kernels sum in fp32 and
                     # round once; on the tiny model they differ by up to 2.5 such units
REAL_RTOL = 1e-5     # fp32 on the 135M model, relative to the largest logit (about 38: 1.1e-4 apart)


def _tiny_pair(dtype=torch.float32):
    """The same tiny random Llama twice (same seed): one on the fast backend, one eager."""
    models = [make_tiny_llama(vocab_size=96, init_range=0.3).to(dtype) for _ in range(2)]
    return apply_backend(models[0], "fast"), apply_backend(models[1], "eager")


@pytest.fixture(scope="module")
def tiny():
    return _tiny_pair()


def _prompt(n=11, row=0, vocab=96):
    return torch.randint(1, vocab, (1, n), generator=torch.Generator().manual_seed(100 + row))


def _new_cache(kind, model, prompt_len):
    """A fresh cache; a static one has room for 16 tokens after the prompt (empty, zero-filled slots)."""
    if kind == "static":
        return StaticCache(config=model.config, max_cache_len=prompt_len + 16)
    return DynamicCache(config=model.config)


def _prefill_then_decode(model, kind, ids, steps=(1, 3, 1)):
    """Logits of a prefill into a fresh ``kind`` cache, then of chunks of ``steps`` tokens fed after it."""
    cache, out = _new_cache(kind, model, ids.shape[1]), []
    with torch.no_grad():
        out.append(model(input_ids=ids, past_key_values=cache, use_cache=True).logits[0])
        for n in steps:
            nxt = out[-1][-1].argmax().repeat(1, n)
            out.append(model(input_ids=nxt, past_key_values=cache, use_cache=True).logits[0])
    return out


def _assert_close(fast_logits, eager_logits, atol, what=""):
    err = (fast_logits.float() - eager_logits.float()).abs().max().item()
    assert err < atol, f"{what}: max |fast - eager| = {err:.3g}"
    assert torch.equal(fast_logits.argmax(-1), eager_logits.argmax(-1)), what


# --------------------------------------------------------------------------------------------
# Caches: prefill, decode, generate
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_prefill_and_decode_match_eager(tiny, kind):
    fast, eager = tiny
    ids = _prompt()
    for step, (f, e) in enumerate(zip(_prefill_then_decode(fast, kind, ids), _prefill_then_decode(eager, kind, ids))):
        _assert_close(f, e, ATOL, f"{kind} cache, forward {step}")


def test_static_cache_gives_the_dynamic_cache_logits_bitwise(tiny):
    """The kernel skips the keys a query may not see, so a static cache's empty slots change nothing:
    not one bit (batch invariance, whatever the cache)."""
    fast, _ = tiny
    ids = _prompt()
    static, dynamic = (_prefill_then_decode(fast, kind, ids) for kind in ("static", "dynamic"))
    for step, (st, dy) in enumerate(zip(static, dynamic)):
        assert torch.equal(st, dy), step


def _cache_implementations():
    """Every ``cache_implementation`` transformers offers (its deprecated aliases of "static" aside), with
    a skip where this machine cannot run it: the offloaded caches move layers between an accelerator and
    the CPU, the quantized one needs optimum-quanto."""
    import importlib.util

    from transformers.generation.configuration_utils import DYNAMIC_CACHE_IMPLEMENTATIONS, STATIC_CACHE_IMPLEMENTATIONS

    params = []
    for name in (*DYNAMIC_CACHE_IMPLEMENTATIONS, *STATIC_CACHE_IMPLEMENTATIONS):
        why = None
        if name.startswith("offloaded") and not torch.cuda.is_available():
            why = "an offloaded cache needs a CUDA device to offload from"
        elif name == "quantized" and importlib.util.find_spec("optimum") is None:
            why = "the quantized cache needs optimum-quanto"
        params.append(pytest.param(name, marks=pytest.mark.skip(reason=why)) if why else name)
    return params


def _greedy(model, ids, attention_mask=None, **kwargs):
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=attention_mask, max_new_tokens=8, do_sample=False,
                             pad_token_id=0, output_logits=True, return_dict_in_generate=True, **kwargs)
    return out.sequences, torch.stack(out.logits, 1)


@pytest.mark.parametrize("impl", _cache_implementations())
def test_generate_matches_eager_on_every_cache_implementation(tiny, impl):
    fast, eager = tiny
    ids = _prompt(9)
    (fs, fl), (es, el) = _greedy(fast, ids, cache_implementation=impl), _greedy(eager, ids, cache_implementation=impl)
    assert fs.tolist() == es.tolist()
    _assert_close(fl, el, ATOL)


@pytest.mark.parametrize("impl", ["dynamic", "static"])
def test_left_padded_batch_matches_eager(tiny, impl):
    """Two prompts of different lengths, left-padded, with a 2-D padding mask: transformers turns it
    into a 4-D mask (its keys the static cache's full length, for a static cache)."""
    fast, eager = tiny
    a, b = _prompt(5, row=1), _prompt(12, row=2)
    ids = torch.cat([torch.cat([torch.zeros(1, 7, dtype=torch.long), a], 1), b])
    mask = torch.ones_like(ids)
    mask[0, :7] = 0
    (fs, fl), (es, el) = (_greedy(m, ids, mask, cache_implementation=impl) for m in (fast, eager))
    assert fs.tolist() == es.tolist()
    _assert_close(fl, el, ATOL)
    # the padded row generates what the prompt alone generates (its position ids start at 0 either way)
    assert fs[0, 7:].tolist() == _greedy(fast, a, cache_implementation=impl)[0][0].tolist()


def test_tree_mask_matches_eager(tiny):
    """A candidate tree scored after a cached prefix with the course's 4-D additive tree mask."""
    fast, eager = tiny
    ids, parents = _prompt(10), torch.tensor([-1, -1, 0, 0, 1, 3])
    nodes = torch.randint(1, 96, (1, 7), generator=torch.Generator().manual_seed(7))
    p = ids.shape[1]
    logits = []
    for model in (fast, eager):
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=ids, past_key_values=cache, use_cache=True)
            logits.append(model(input_ids=nodes, past_key_values=cache, use_cache=True,
                                attention_mask=trees.tree_attention_mask(parents, p),
                                position_ids=trees.tree_position_ids(parents, p)).logits[0])
    _assert_close(*logits, ATOL)


def test_custom_mask_that_does_not_cover_the_keys_is_refused(tiny):
    """A 4-D mask sized for a dynamic cache fed to a static one (more key slots than mask columns):
    eager cannot add it either; the fast backend says so rather than reading past the mask."""
    fast, eager = tiny
    ids, parents = _prompt(10), torch.tensor([-1, 0])
    p = ids.shape[1]
    for model, error in ((fast, ValueError), (eager, RuntimeError)):
        cache = _new_cache("static", model, p)
        with torch.no_grad():
            model(input_ids=ids, past_key_values=cache, use_cache=True)
            with pytest.raises(error):
                model(input_ids=torch.ones(1, 3, dtype=torch.long), past_key_values=cache, use_cache=True,
                      attention_mask=trees.tree_attention_mask(parents, p),
                      position_ids=trees.tree_position_ids(parents, p))


def test_bf16_static_and_dynamic_match_eager():
    fast, eager = _tiny_pair(torch.bfloat16)
    ids = _prompt()
    for kind in ("dynamic", "static"):
        for f, e in zip(_prefill_then_decode(fast, kind, ids), _prefill_then_decode(eager, kind, ids)):
            assert f.dtype == torch.bfloat16
            err = (f.float() - e.float()).abs().max().item()
            assert err < BF16_RTOL * e.float().abs().max().item(), (kind, err)


# --------------------------------------------------------------------------------------------
# The attention interface against SDPA's, mask by mask
# --------------------------------------------------------------------------------------------
class _Attention(torch.nn.Module):
    """What the interface reads off a model's attention module."""

    def __init__(self, groups, is_causal=True):
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, is_causal


def _qkv(q, s, b=2, h=6, kvh=2, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, q, d, generator=g), torch.randn(b, kvh, s, d, generator=g),
            torch.randn(b, kvh, s, d, generator=g))


def _visible(shape, seed=1):
    """A random visibility pattern in which every query sees at least one key."""
    vis = torch.rand(shape, generator=torch.Generator().manual_seed(seed)) < 0.6
    vis[..., 0] = True
    return vis


def _additive(vis):
    return torch.zeros(vis.shape).masked_fill_(~vis, torch.finfo(torch.float32).min)


MASKS = {
    "none": lambda q, s: None,
    "bool [B,1,Q,S]": lambda q, s: _visible((2, 1, q, s)),
    "additive [1,1,Q,S]": lambda q, s: _additive(_visible((1, 1, q, s))),
    "additive [B,H,Q,S]": lambda q, s: _additive(_visible((2, 6, q, s))),
    "bool [B,1,1,S] (queries broadcast)": lambda q, s: _visible((2, 1, 1, s)),
    "bool [1,1,Q,1] (keys broadcast)": lambda q, s: torch.ones(1, 1, q, 1, dtype=torch.bool),
    "bool [Q,S] (2-D, SDPA's broadcasting)": lambda q, s: _visible((q, s)),
}
SHAPES = {"prefill Q=S": (7, 7), "static prefill Q<S": (7, 19), "decode Q=1": (1, 19), "verify Q<S": (4, 19)}


@pytest.mark.parametrize("is_causal", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mask", MASKS)
def test_interface_follows_sdpa(mask, shape, is_causal):
    q, s = SHAPES[shape]
    query, key, value = _qkv(q, s)
    m = MASKS[mask](q, s)
    module = _Attention(groups=3, is_causal=is_causal)
    ref_mask = m if m is None or m.dtype == torch.bool else m.double()
    try:
        want, _ = sdpa_attention_forward(module, query.double(), key.double(), value.double(), ref_mask, scaling=0.3)
    except (RuntimeError, ValueError):   # transformers cannot take it (a 2-D mask for one query): nor can we
        with pytest.raises((RuntimeError, ValueError)):
            backend._transformers_attention(module, query, key, value, m, scaling=0.3)
        return
    got, _ = backend._transformers_attention(module, query, key, value, m, scaling=0.3)
    assert got.shape == want.shape
    assert (got.double() - want).abs().max() < 1e-5


def test_interface_is_causal_argument_overrides_the_module():
    query, key, value = _qkv(5, 5)
    module = _Attention(groups=3, is_causal=True)
    for flag in (True, False):
        got, _ = backend._transformers_attention(module, query, key, value, None, is_causal=flag)
        want, _ = sdpa_attention_forward(module, query, key, value, None, is_causal=flag)
        assert (got - want).abs().max() < 1e-5, flag


# --------------------------------------------------------------------------------------------
# Shapes, devices and dtypes the kernels must refuse rather than misread
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mask_shape", [(1, 2, 3, 4), (3, 1, 3, 4), (1, 1, 2, 4), (1, 1, 3, 5), (1, 3, 4)])
def test_attention_refuses_masks_it_cannot_broadcast(mask_shape):
    query, key, value = torch.randn(2, 6, 3, 8), torch.randn(2, 2, 4, 8), torch.randn(2, 2, 4, 8)
    with pytest.raises(ValueError, match="mask"):
        backend.attention(query, key, value, torch.ones(mask_shape, dtype=torch.bool))


def test_attention_refuses_other_devices_dtypes_and_shapes():
    query, key = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match="CPU"):
        backend.attention(query.to("meta"), key, key)
    with pytest.raises(ValueError, match="CPU"):
        backend.attention(query, key, key, torch.ones(1, 1, 3, 4, dtype=torch.bool, device="meta"))
    with pytest.raises(ValueError, match="dtype"):
        backend.attention(query.half(), key, key)
    with pytest.raises(ValueError, match="dtype"):
        backend.attention(query, key, key, torch.ones(1, 1, 3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="4-D"):
        backend.attention(query[0], key, key)
    with pytest.raises(ValueError, match="does not match"):
        backend.attention(query, key, torch.randn(1, 1, 4, 9))
    with pytest.raises(ValueError, match="does not match"):
        backend.attention(query.to(torch.bfloat16), key, key)
    with pytest.raises(ValueError, match="causal"):
        backend.attention(query, key, key, causal="middle")
    with pytest.raises(ValueError, match="not both"):
        backend.attention(query, key, key, torch.ones(1, 1, 3, 4, dtype=torch.bool), causal="first")


def test_linear_refuses_bad_bias_devices_and_dtypes():
    x, w = torch.randn(3, 16), torch.randn(8, 16)
    with pytest.raises(ValueError, match="bias"):
        backend.linear(x, w, torch.randn(7))
    with pytest.raises(ValueError, match="bias"):
        backend.linear(x, w, torch.randn(8, 1))
    with pytest.raises(ValueError, match="CPU"):
        backend.linear(x.to("meta"), w)
    with pytest.raises(ValueError, match="CPU"):
        backend.linear(x, w, torch.randn(8, device="meta"))
    with pytest.raises(ValueError, match="CPU"):
        backend.linear(x, w.to("meta"))
    with pytest.raises(ValueError, match="dtype"):
        backend.linear(x.double(), w)
    with pytest.raises(ValueError, match="dtype"):
        backend.linear(x, w.half())
    bias = torch.randn(8).to(torch.bfloat16)   # a bf16 bias (a bf16 model's) is read as it is
    assert torch.allclose(backend.linear(x, w, bias), F.linear(x, w, bias.float()), atol=1e-5)


# --------------------------------------------------------------------------------------------
# The real model: the StaticCache prefill that used to read empty slots
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_pair():
    from specdecode_ref import chat_ids, load_model

    fast, tok = load_model(dtype="fp32", device="cpu", backend="fast")
    eager, _ = load_model(dtype="fp32", device="cpu", backend="eager")
    return fast, eager, chat_ids(tok, "List three facts about the Moon, one per line.")[None]


@pytest.mark.embedded
def test_real_model_static_cache_prefill_and_generate_match_eager(real_pair):
    """The 135M model's logits sum over 576 to 1536 terms per product: they agree to REAL_RTOL
    (before the fix, the static prefill's were 30 apart)."""
    fast, eager, ids = real_pair
    f, e = (_prefill_then_decode(m, "static", ids, steps=(1,)) for m in (fast, eager))
    for fl, el in zip(f, e):
        _assert_close(fl, el, REAL_RTOL * el.abs().max().item())
    fs, es = (m.generate(input_ids=ids, max_new_tokens=12, do_sample=False, cache_implementation="static")
              for m in (fast, eager))
    assert fs.tolist() == es.tolist()
