"""The exported draft model is the same function as ours: a standalone Hugging Face directory
(its own full-vocabulary embeddings and tied lm_head) whose fp32 logits equal those of the
shipped draft that borrows the target's. The EAGLE export writes the tensor names and shapes of
vLLM's EAGLE-1 Llama drafter."""
import json

import pytest
import torch
from safetensors.torch import load_file

from specdecode_ref.backend import apply_backend, backend_of
from specdecode_ref.proposers.draft_model import load_draft_model
from specdecode_ref.serving.export import export_draft_model, export_eagle_head


def test_exported_draft_model_gives_our_logits(embedded, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = embedded
    out = export_draft_model(tmp_path / "draft", model)
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ours = load_draft_model(model)
    apply_backend(hf, backend_of(ours))   # the same kernels, so the same function means the same bits
    assert hf.config.num_hidden_layers == ours.config.num_hidden_layers == 4
    assert hf.config.vocab_size == model.config.vocab_size
    assert AutoTokenizer.from_pretrained(out)("speculative decoding").input_ids == tok("speculative decoding").input_ids
    ids = tok("Rewrite this function with type hints: def area(w, h): return w * h", return_tensors="pt").input_ids
    ids = torch.cat([ids, torch.tensor([[0, model.config.vocab_size - 1]])], dim=1)  # first and last rows too
    with torch.no_grad():
        expected, got = ours(input_ids=ids).logits, hf(input_ids=ids).logits
    assert torch.equal(got, expected)


def test_eagle_export_has_vllms_eagle_layout(embedded, tmp_path):
    model, _ = embedded
    out = export_eagle_head(tmp_path / "eagle", model)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["EagleLlamaForCausalLM"] and config["num_hidden_layers"] == 1
    state = load_file(str(out / "model.safetensors"))
    H = model.config.hidden_size
    assert state["fc.weight"].shape == (H, 2 * H)
    assert not any(k.startswith(("lm_head", "embed_tokens", "model.")) for k in state)  # shared with the target
    assert "layers.0.input_layernorm.weight" not in state  # vLLM's first EAGLE layer has no input norm
    assert {k for k in state if k.startswith("layers.0.self_attn")} == {
        f"layers.0.self_attn.{p}_proj.weight" for p in "qkvo"}


# --- EAGLE-3 and Medusa: the exported weights, computed as vLLM computes them, give our drafts -----

def _vllm_eagle3_logits(state, config, target, fused, tokens):
    """vLLM's Eagle3LlamaForCausalLM (llama_eagle3.py) written out from the exported tensors alone:
    fc on the fused feature; [input_layernorm(emb), hidden_norm(g)] into q, k, v; the feature as the
    residual; post-attention norm and SiLU MLP; final norm; lm_head over the draft vocabulary, whose
    ids are index + d2t. One prefill of q positions (causal), positions 0..q-1."""
    H, eps = config["hidden_size"], config["rms_norm_eps"]
    nh, nkv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = H // nh

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    L = "layers.0."
    g = fused @ state["fc.weight"].T                                   # [q, H]
    e = target.get_input_embeddings().weight[tokens]                   # shared with the target
    x = torch.cat([rms(e, state[L + "input_layernorm.weight"]), rms(g, state[L + "hidden_norm.weight"])], -1)
    q, k, v = (x @ state[f"{L}self_attn.{p}_proj.weight"].T for p in "qkv")
    n = tokens.numel()
    q, k, v = q.view(n, nh, hd), k.view(n, nkv, hd), v.view(n, nkv, hd)
    cos, sin = target.model.rotary_emb(x[None], position_ids=torch.arange(n)[None])
    cos, sin = cos[0][:, None], sin[0][:, None]

    def rot(t):
        a, b = t[..., : hd // 2], t[..., hd // 2:]
        return t * cos + torch.cat([-b, a], -1) * sin

    q, k = rot(q), rot(k)
    k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
    att = torch.einsum("qhd,khd->hqk", q, k) / hd ** 0.5
    att = att.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    o = torch.einsum("hqk,khd->qhd", att, v).reshape(n, H) @ state[L + "self_attn.o_proj.weight"].T
    r = g + o
    m = rms(r, state[L + "post_attention_layernorm.weight"])
    m = torch.nn.functional.silu(m @ state[L + "mlp.gate_proj.weight"].T) * (m @ state[L + "mlp.up_proj.weight"].T)
    h = r + m @ state[L + "mlp.down_proj.weight"].T
    logits = rms(h, state["norm.weight"]) @ state["lm_head.weight"].T   # [q, draft vocab]
    ids = torch.arange(state["d2t"].numel()) + state["d2t"]
    return logits, ids


def test_eagle3_export_computed_as_vllm_does_gives_our_logits(embedded, tmp_path):
    from specdecode_ref.proposers.eagle import build_eagle_head
    from specdecode_ref.proposers.shipped import shipped_vocab
    from specdecode_ref.serving.export import export_eagle3_head
    from support import noisy

    model, tok = embedded
    head = noisy(build_eagle_head(model, "fused", draft_vocab=shipped_vocab()), 0.2, 0)
    out = export_eagle3_head(tmp_path / "eagle3", head, model)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Eagle3LlamaForCausalLM"] and config["num_hidden_layers"] == 1
    V_d = head.draft_ids.numel()  # the shipped draft vocabulary: 8,192 frequent tokens and EOS
    assert config["draft_vocab_size"] == V_d and config["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    state = load_file(str(out / "model.safetensors"))
    assert not any(k.startswith(("embed_tokens", "model.")) for k in state)  # shared with the target
    assert state["t2d"].sum() == V_d and torch.equal(torch.nonzero(state["t2d"])[:, 0], head.draft_ids.sort().values)
    ids = tok("Rewrite this function with type hints: def area(w, h): return w * h", return_tensors="pt").input_ids
    with torch.no_grad():
        hs = model(ids, output_hidden_states=True).hidden_states
        fused = head.target_features(hs)[0, :-1]                      # f_t, t = 0..n-2
        tokens = ids[0, 1:]                                          # x_{t+1}
        theirs, theirs_ids = _vllm_eagle3_logits(state, config, model, fused, tokens)
        pos = torch.arange(tokens.numel())[None]
        from specdecode_ref.masks import causal_additive_mask

        out_h = head(fused[None], tokens[None], pos, causal_additive_mask(tokens.numel(), 0, torch.float32, "cpu"),
                     model)
        ours = head.readout(out_h)[0] @ model.get_output_embeddings().weight[head.draft_ids].T
    assert torch.equal(theirs_ids, head.draft_ids)
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)
    assert torch.equal(theirs.argmax(-1), ours.argmax(-1))


def test_eagle3_export_planted_feature_order_is_caught(embedded, tmp_path):
    """The same check catches an export that writes fuse's three feature blocks in another order
    (vLLM concatenates the aux layers low, middle, high, as head.target_features does)."""
    from specdecode_ref.proposers.eagle import build_eagle_head
    from specdecode_ref.serving.export import export_eagle3_head
    from support import noisy

    model, tok = embedded
    head = noisy(build_eagle_head(model, "fused"), 0.2, 0)
    with torch.no_grad():
        head.fuse.weight.copy_(torch.randn(head.fuse.weight.shape, generator=torch.Generator().manual_seed(0)) * 0.02)
    out = export_eagle3_head(tmp_path / "eagle3", head, model)
    state, config = load_file(str(out / "model.safetensors")), json.loads((out / "config.json").read_text())
    H = model.config.hidden_size
    w = state["fc.weight"]
    state["fc.weight"] = torch.cat([w[:, 2 * H:], w[:, H:2 * H], w[:, :H]], 1)  # high, middle, low
    ids = tok("Name three primary colors.", return_tensors="pt").input_ids
    with torch.no_grad():
        fused = head.target_features(model(ids, output_hidden_states=True).hidden_states)[0, :-1]
        good, _ = _vllm_eagle3_logits(load_file(str(out / "model.safetensors")), config, model, fused, ids[0, 1:])
        bad, _ = _vllm_eagle3_logits(state, config, model, fused, ids[0, 1:])
    assert not torch.allclose(good, bad, atol=1e-3)


@pytest.mark.parametrize("vocab", [None, "shipped"])
def test_medusa_export_computed_as_vllm_does_gives_our_chain(embedded, tmp_path, vocab):
    """vLLM's MedusaModel (medusa.py) from the exported tensors: per head x + SiLU(W x + b) blocks,
    the one lm_head (original_lm_head) over the truncated vocabulary, ids through token_map, argmax
    per head -- the chain our Medusa proposer drafts (tree=False)."""
    from specdecode_ref.proposers.medusa import load_medusa_proposer
    from specdecode_ref.serving.export import export_drafter

    model, tok = embedded
    out, spec = export_drafter("medusa", tmp_path / "medusa", target=model, draft_vocab=vocab)
    config = json.loads((out / "config.json").read_text())
    state = load_file(str(out / "model.safetensors"))
    assert spec == {"method": "medusa", "model": str(out), "num_speculative_tokens": config["num_heads"]}
    assert config["truncated_vocab_size"] == state["lm_heads.0.weight"].shape[0]
    if vocab is None:
        assert "token_map" not in state and config["truncated_vocab_size"] == config["vocab_size"]
        state["token_map"] = torch.arange(config["vocab_size"])  # vLLM's token_map is None: ids are indices
    else:
        assert config["truncated_vocab_size"] == state["token_map"].numel() < config["vocab_size"]
    P = load_medusa_proposer(model, k=config["num_heads"], tree=False, reduced_vocab=vocab is not None)
    ids = tok("Name three primary colors.", return_tensors="pt").input_ids
    with torch.no_grad():
        h = model(ids, output_hidden_states=True).hidden_states[-1][0]  # final normed states [n, H]
        drafts = []
        for i in range(config["num_heads"]):
            x = h
            for j in range(config["num_hidden_layers"]):
                x = x + torch.nn.functional.silu(x @ state[f"blocks.{i}.layers.{j}.weight"].T
                                                 + state[f"blocks.{i}.layers.{j}.bias"])
            drafts.append(state["token_map"][(x @ state["lm_heads.0.weight"].T).argmax(-1)])
        theirs = torch.stack(drafts, 1)  # [n, heads]
        ours = torch.stack([P.head.to_token(P.head_logits(h[t]).argmax(-1)) for t in range(h.shape[0])])
    assert torch.equal(theirs, ours)


# --- the parallel drafter (PARD): vLLM's draft_model with parallel_drafting -----------------------

def test_parallel_draft_export_gives_our_position_logits(embedded, tmp_path):
    """The export is a plain untied Llama whose reserved ``pard_token`` row holds our mask vector:
    context + K - 1 copies of it give, at the last K positions, the logits our parallel drafter
    computes from one forward with its own mask id (one past the vocabulary)."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from specdecode_ref import kv
    from specdecode_ref.proposers.parallel_draft import ParallelDraftProposer, load_parallel_draft
    from specdecode_ref.serving.export import PARD_TOKEN, export_drafter

    model, tok = embedded
    out, spec = export_drafter("pard", tmp_path / "pard", target=model)
    config = json.loads((out / "config.json").read_text())
    V, K, m = model.config.vocab_size, config["pard_positions"], config["pard_token"]
    assert spec == {"method": "draft_model", "model": str(out), "num_speculative_tokens": K, "parallel_drafting": True}
    assert config["vocab_size"] == V == 49152 and config["tie_word_embeddings"] is False
    assert config["num_hidden_layers"] == 4 and "mask_token_id" not in config  # vLLM would read that one first
    assert 0 <= m < V and tok.convert_tokens_to_ids(PARD_TOKEN) == m
    assert tok.added_tokens_decoder[m].special and m not in (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    assert AutoTokenizer.from_pretrained(out).convert_tokens_to_ids(PARD_TOKEN) == m

    state = load_file(str(out / "model.safetensors"))
    emb = model.get_input_embeddings().weight
    assert torch.equal(state["lm_head.weight"], model.get_output_embeddings().weight)  # the logits stay the target's
    assert torch.equal(state["model.embed_tokens.weight"][:m], emb[:m])
    assert torch.equal(state["model.embed_tokens.weight"][m + 1:], emb[m + 1:])

    hf = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    P = ParallelDraftProposer(load_parallel_draft(model), k=K, draft_vocab=None, draft_sampling="greedy")
    ids = tok("Rewrite this function with type hints: def area(w, h): return w * h", return_tensors="pt").input_ids
    with torch.no_grad():
        P.cache = kv.new_cache(P.model)
        ours = P.position_logits(ids[0].tolist(), K)  # [K, V]
        x = torch.cat([ids, torch.full((1, K - 1), m)], dim=1)
        theirs = hf(input_ids=x).logits[0, -K:]
    assert ours.shape == theirs.shape == (K, V)
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)
    assert torch.equal(theirs.argmax(-1), ours.argmax(-1))
    with pytest.raises(ValueError, match="at most"):
        export_drafter("pard", tmp_path / "pard-long", k=K + 1, target=model)
    with pytest.raises(ValueError, match="reserved special token"):
        export_drafter("pard", tmp_path / "pard-eos", target=model, pard_token=tok.eos_token_id)
