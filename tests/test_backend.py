"""The fast backend (backend.py): its kernels compute the right numbers, a position's result does not
depend on how many tokens or rows share its forward (bitwise), and the switch falls back clearly.

Batch invariance is what lets greedy speculative decoding equal plain decoding by construction: a
drafted token's logits come from the same arithmetic whether the target scores it alone or after a
chain of drafts, in a tree, or beside other rows. Each invariance check is also run on a planted
twin whose sums depend on the number of rows, to show the check can fail.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from specdecode_ref import backend, trees
from specdecode_ref.backend import BackendUnavailable, apply_backend, backend_of, resolve_backend

pytestmark = pytest.mark.skipif(not backend.fast_available()[0], reason="the fast backend cannot run here: "
                                + backend.fast_available()[1])


def rows_are_invariant(product, x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether every row of ``product(x, w)`` is bitwise what that row gets alone, or among any
    prefix of the rows (the shapes a decode step, a chain and a batch give)."""
    full = product(x, w)
    for m in range(1, x.shape[0] + 1):
        if not torch.equal(product(x[:m], w), full[:m]):
            return False
    return all(torch.equal(product(x[i:i + 1], w)[0], full[i]) for i in range(x.shape[0]))


def planted_m_dependent(x, w):
    """A product whose rounding depends on the number of rows (as a BLAS's blocking can)."""
    y = backend.linear(x, w)
    return y + y.abs() * (x.shape[0] - 1) * 2.0 ** -23


@pytest.mark.parametrize("n,k", [(49, 37), (64, 576), (1536, 576), (7, 1)])
@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16])
def test_linear_matches_float64_and_is_row_invariant(n, k, wdtype):
    g = torch.Generator().manual_seed(n * 1000 + k)
    w = (torch.randn(n, k, generator=g) * 0.05).to(wdtype)
    bias = torch.randn(n, generator=g)
    x = torch.randn(17, k, generator=g)
    ref = x.double() @ w.double().T + bias.double()
    got = backend.linear(x, w, bias)
    assert got.dtype == torch.float32 and got.shape == (17, n)
    assert (got.double() - ref).abs().max() < 1e-4 * max(1.0, k ** 0.5)
    assert rows_are_invariant(backend.linear, x, w)
    assert not rows_are_invariant(planted_m_dependent, x, w)


def test_linear_keeps_leading_shape_dtype_and_handles_empty_input():
    w = torch.randn(8, 16)
    x = torch.randn(2, 3, 16)
    assert torch.allclose(backend.linear(x, w), F.linear(x, w), atol=1e-5)
    xb = x.to(torch.bfloat16)
    assert backend.linear(xb, w.to(torch.bfloat16)).dtype == torch.bfloat16
    assert backend.linear(torch.randn(0, 16), w).shape == (0, 8)
    with pytest.raises(ValueError, match="features"):
        backend.linear(torch.randn(2, 15), w)


def _sdpa_reference(q, k, v, mask):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    out = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)
    return out.transpose(1, 2).float()


@pytest.mark.parametrize("form", ["causal-none", "bool", "additive"])
def test_attention_matches_sdpa_and_each_query_is_invariant(form):
    g = torch.Generator().manual_seed(3)
    b, h, kvh, q, s, d = 2, 6, 2, 5, 23, 20   # d not a multiple of 8: the tail path too
    query, key, value = torch.randn(b, h, q, d, generator=g), torch.randn(b, kvh, s, d, generator=g), \
        torch.randn(b, kvh, s, d, generator=g)
    visible = torch.ones(q, s, dtype=torch.bool).tril(s - q)[None, None].expand(b, 1, q, s).clone()
    visible[1, 0, :, :4] = False   # row 1 is left-padded by 4 slots
    if form == "causal-none":
        visible[1] = visible[0]
        mask = None
    elif form == "bool":
        mask = visible
    else:
        mask = torch.zeros(visible.shape).masked_fill_(~visible, torch.finfo(torch.float32).min)
    got = backend.attention(query, key, value, mask)
    assert (got - _sdpa_reference(query, key, value, visible)).abs().max() < 1e-5
    # query i alone, with the keys it may see and nothing after them: bitwise the same output
    for i in range(q):
        keys = s - q + i + 1
        m_i = None if mask is None else mask[:, :, i:i + 1, :keys]
        alone = backend.attention(query[:, :, i:i + 1], key[:, :, :keys], value[:, :, :keys], m_i)
        assert torch.equal(alone[:, 0], got[:, i])


def test_attention_fully_masked_query_gives_zeros_and_bad_shapes_are_refused():
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 4, 8)
    mask = torch.zeros(1, 1, 3, 4, dtype=torch.bool)
    assert torch.equal(backend.attention(q, k, k, mask), torch.zeros(1, 3, 2, 8))
    with pytest.raises(ValueError, match="mask"):
        backend.attention(q, k, k, torch.ones(1, 1, 3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="does not match"):
        backend.attention(q, torch.randn(1, 3, 4, 8), torch.randn(1, 3, 4, 8))


def test_fast_linear_leaves_training_to_autograd():
    lin = torch.nn.Linear(6, 4)
    apply_backend(lin, "fast")
    assert type(lin) is backend.FastLinear and backend_of(lin) == "fast"
    x = torch.randn(3, 6, requires_grad=True)
    lin(x).sum().backward()
    assert x.grad is not None and lin.weight.grad is not None
    with torch.no_grad():
        assert torch.allclose(lin(x), F.linear(x, lin.weight, lin.bias), atol=1e-6)
    apply_backend(lin, "eager")
    assert type(lin) is torch.nn.Linear and backend_of(lin) == "eager"


def test_switch_env_override_and_clear_fallbacks(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setenv(backend.ENV_VAR, "eager")
    assert resolve_backend(None, cpu, torch.float32) == "eager"
    monkeypatch.setenv(backend.ENV_VAR, "auto")
    assert resolve_backend(None, cpu, torch.float32) == "fast"
    with pytest.raises(ValueError, match="Unknown backend"):
        resolve_backend("turbo", cpu, torch.float32)
    with pytest.raises(BackendUnavailable, match="fp32 or bf16"):
        resolve_backend("fast", cpu, torch.float16)
    backend._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert resolve_backend("auto", torch.device("cuda"), torch.bfloat16) == "eager"
        assert resolve_backend("auto", torch.device("cuda"), torch.bfloat16) == "eager"
    assert len(caught) == 1 and "for CPUs" in str(caught[0].message)   # one message, not one per load


def test_no_compiler_is_one_clear_message(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    monkeypatch.setattr(backend, "_lib", None)
    monkeypatch.setattr(backend, "_lib_error", None)
    monkeypatch.setattr(backend, "_compiler", lambda: None)
    ok, why = backend.fast_available()
    assert not ok and "no C compiler" in why
    with pytest.raises(BackendUnavailable, match="no C compiler"):
        resolve_backend("fast", torch.device("cpu"), torch.float32)
    backend._warned.clear()
    with pytest.warns(UserWarning, match="eager .* no C compiler"):
        assert resolve_backend("auto", torch.device("cpu"), torch.float32) == "eager"


def test_kernel_is_built_once_per_machine_and_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    monkeypatch.setattr(backend, "_lib", None)
    monkeypatch.setattr(backend, "_lib_error", None)
    assert not any(backend.kernel_path(variant).exists() for variant in backend.VARIANTS)
    path = Path(backend.kernel_library()._name)   # the variant this compiler builds
    assert path.exists() and path.is_relative_to(tmp_path)
    stamp = path.stat().st_mtime_ns
    monkeypatch.setattr(backend, "_lib", None)
    backend.kernel_library()   # a second process finds the compiled file and does not rebuild it
    assert path.stat().st_mtime_ns == stamp


# --------------------------------------------------------------------------------------------
# The real model: a position's logits, however it is scored
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fast_and_eager():
    from specdecode_ref import load_model

    fast, tok = load_model(dtype="fp32", device="cpu", backend="fast")
    eager, _ = load_model(dtype="fp32", device="cpu", backend="eager")
    return fast, eager, tok


def _ids(tok):
    from specdecode_ref import chat_ids

    return chat_ids(tok, "List three facts about the Moon, one per line.")


def _logits_after(model, ids, prefix_len, new, **kwargs):
    from specdecode_ref import kv

    cache = kv.new_cache(model)
    with torch.no_grad():
        model(input_ids=ids[None, :prefix_len], past_key_values=cache, use_cache=True)
        return model(input_ids=new[None], past_key_values=cache, use_cache=True, **kwargs).logits[0]


@pytest.mark.embedded
def test_real_model_logits_do_not_depend_on_the_chain_length(fast_and_eager):
    fast, eager, tok = fast_and_eager
    assert backend_of(fast) == "fast" and fast.config._attn_implementation == backend.ATTENTION
    assert backend_of(eager) == "eager"
    ids = _ids(tok)
    p = ids.numel() - 17
    full = _logits_after(fast, ids, p, ids[p:])
    for n in range(1, 17):
        assert torch.equal(_logits_after(fast, ids, p, ids[p:p + n]), full[:n]), n
    # ... and they are the eager model's, up to rounding
    assert (full - _logits_after(eager, ids, p, ids[p:])).abs().max() < 1e-3


@pytest.mark.embedded
def test_bf16_logits_do_not_depend_on_the_chain_length_either():
    """bf16 weights: the kernel widens them to fp32 and rounds each output once, so invariance holds
    there too, and greedy speculative output equals plain decoding in bf16 by construction."""
    from specdecode_ref import load_model

    model, tok = load_model(dtype="bf16", device="cpu", backend="fast")
    ids = _ids(tok)
    p = ids.numel() - 9
    full = _logits_after(model, ids, p, ids[p:])
    assert full.dtype == torch.bfloat16
    for n in range(1, 10):
        assert torch.equal(_logits_after(model, ids, p, ids[p:p + n]), full[:n]), n


@pytest.mark.embedded
def test_real_model_tree_node_equals_its_path_bitwise(fast_and_eager):
    fast, _, tok = fast_and_eager
    ids = _ids(tok)
    p = ids.numel() - 6
    parents = torch.tensor([-1, -1, 0, 0, 1])   # two children of the root, three grandchildren
    g = torch.Generator().manual_seed(0)
    slots = torch.cat([ids[p:p + 1], torch.randint(100, 40000, (5,), generator=g)])   # the root, then the nodes
    tree = _logits_after(fast, ids, p, slots, attention_mask=trees.tree_attention_mask(parents, p, dtype=torch.float32),
                         position_ids=trees.tree_position_ids(parents, p))
    for i in range(len(parents)):
        path = [i]
        while parents[path[-1]] >= 0:
            path.append(int(parents[path[-1]]))
        alone = _logits_after(fast, ids, p, torch.cat([slots[:1], slots[1:][path[::-1]]]))
        assert torch.equal(tree[i + 1], alone[-1]), i
    assert torch.equal(tree[0], _logits_after(fast, ids, p, slots[:1])[0])


@pytest.mark.embedded
def test_real_model_batch_rows_equal_each_prompt_alone_bitwise(fast_and_eager):
    """Two prompts of different lengths, left-padded into one forward with a padding mask: each
    row's logits are bitwise those of the prompt run alone."""
    from specdecode_ref import chat_ids

    fast, _, tok = fast_and_eager
    a, b = chat_ids(tok, "Name a colour."), chat_ids(tok, "Write a haiku about winter mornings, please.")
    width = max(a.numel(), b.numel())
    rows, masks, positions = [], [], []
    for ids in (a, b):
        pad = width - ids.numel()
        rows.append(torch.cat([torch.zeros(pad, dtype=torch.long), ids]))
        vis = torch.ones(width, width, dtype=torch.bool).tril()
        vis[:, :pad] = False
        vis[torch.arange(pad), torch.arange(pad)] = True   # padding slots see themselves only
        masks.append(vis)
        positions.append(torch.cat([torch.zeros(pad, dtype=torch.long), torch.arange(ids.numel())]))
    mask = torch.zeros(2, 1, width, width).masked_fill_(~torch.stack(masks)[:, None], torch.finfo(torch.float32).min)
    with torch.no_grad():
        batched = fast(input_ids=torch.stack(rows), attention_mask=mask, position_ids=torch.stack(positions)).logits
        for row, ids in enumerate((a, b)):
            alone = fast(input_ids=ids[None]).logits[0]
            assert torch.equal(batched[row, width - ids.numel():], alone), row


@pytest.mark.embedded
def test_greedy_output_equals_the_eager_model(fast_and_eager):
    from specdecode_ref import autoregressive_generate, chat_ids

    fast, eager, tok = fast_and_eager
    for q in ("Explain in two sentences why the sky is blue.", "Write a Python function that reverses a string."):
        ids = chat_ids(tok, q)
        f = autoregressive_generate(fast, ids, max_new_tokens=32)
        e = autoregressive_generate(eager, ids, max_new_tokens=32)
        assert f.tokens.tolist() == e.tokens.tolist(), q
