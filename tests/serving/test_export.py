"""The exported draft model is the same function as ours: a standalone Hugging Face directory
(its own full-vocabulary embeddings and tied lm_head) whose fp32 logits equal those of the
shipped draft that borrows the target's. The EAGLE export writes the tensor names and shapes of
vLLM's EAGLE-1 Llama drafter."""
import json

import torch
from safetensors.torch import load_file

from specdecode_ref.proposers.draft_model import load_draft_model
from specdecode_ref.serving.export import export_draft_model, export_eagle_head


def test_exported_draft_model_gives_our_logits(embedded, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = embedded
    out = export_draft_model(tmp_path / "draft", model)
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ours = load_draft_model(model)
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
