"""Our trained drafters as model directories a serving engine can load (vLLM, transformers).

The shipped drafter files hold only their own weights: the 4-layer draft model and the EAGLE head
both borrow the target's embeddings and lm_head at run time. A serving engine loads a drafter as a
model directory of its own, so exporting means writing those shared tensors in as well, in the
engine's naming.

    export_draft_model(out_dir)   a standalone Hugging Face Llama model (vLLM "draft_model")
    export_eagle_head(out_dir)    the head in vLLM's EAGLE-1 Llama layout (vLLM "eagle"); see its
                                  docstring for what that layout cannot express
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def _embedded_target(target):
    if target is not None:
        return target
    from ..models import load_model

    return load_model(dtype="fp32", device="cpu")[0]


def _copy_tokenizer(out_dir: Path) -> None:
    """The embedded model's tokenizer files, so the directory is a complete model (vLLM and
    transformers both read a tokenizer from the model directory)."""
    from ..models import EMBEDDED, cache_dir, prepare_embedded

    prepare_embedded(verbose=False)
    src = cache_dir() / EMBEDDED
    for name in TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy2(src / name, out_dir / name)


def export_draft_model(out_dir, target=None, dtype: torch.dtype = torch.float32) -> Path:
    """Write the shipped distilled draft (``proposers/draft_model.py``) as a standalone Hugging Face
    ``LlamaForCausalLM`` directory: config.json, model.safetensors, generation_config.json and the
    tokenizer files.

    The draft's four layers and final norm come from the shipped file; its embeddings and (tied)
    lm_head are copies of the target's full 49,152-token vocabulary, so the directory needs no
    target to run. target: the embedded target (loaded in fp32 on the CPU when None). dtype: of the
    written weights; fp32 keeps the de-quantised embeddings exactly.
    """
    from ..proposers.draft_model import load_draft_model

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = _embedded_target(target)
    draft = load_draft_model(target)
    config = draft.config.to_dict()
    config.pop("init_layers", None)
    config.update({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": draft.config.num_hidden_layers,
                   "dtype": str(dtype).replace("torch.", ""), "tie_word_embeddings": True})
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in draft.state_dict().items()
             if k != "lm_head.weight"}  # tied: transformers and vLLM rebuild it from the embeddings
    from safetensors.torch import save_file

    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(_clean(config), indent=2))
    draft.generation_config.save_pretrained(out_dir)
    _copy_tokenizer(out_dir)
    return out_dir


def _clean(config: dict) -> dict:
    for key in ("_name_or_path", "transformers_version", "torch_dtype", "_commit_hash"):
        config.pop(key, None)
    return config


def export_eagle_head(out_dir, target=None, dtype: torch.dtype = torch.float32) -> Path:
    """Write the shipped EAGLE head (``proposers/eagle.py``) in the layout of vLLM's EAGLE-1 Llama
    drafter (``vllm/model_executor/models/llama_eagle.py``, ``EagleLlamaForCausalLM``), for
    ``speculative_config={"method": "eagle", "model": out_dir, "num_speculative_tokens": k}``.

    The layout: config.json (a one-layer Llama config whose ``architectures`` is
    ``EagleLlamaForCausalLM``), model.safetensors with ``fc.weight`` and ``layers.0.*`` (vLLM
    shares the target's embeddings and lm_head when the file has none), tokenizer files.

    What that layout cannot express, so the exported drafter computes a different function from
    ours and its acceptance is not ours:
      - vLLM's fc has no bias; ours has one (dropped).
      - vLLM removes the first layer's input norm (EAGLE's original code does too); ours keeps the
        norm it was trained with (dropped: the layer sees the un-normalised fc output).
      - vLLM sends the layer's output straight to the lm_head and feeds it back as the next
        feature; our head ends with a final norm (dropped: neither a bias nor a norm can be
        folded into the shared lm_head or into the next step's fc, because the norm divides by a
        per-token scale).
    fc's input order differs too (vLLM: [embedding, feature]; ours: [feature, embedding]); that
    one is a column swap and exact. Verification keeps vLLM's greedy output equal to plain greedy
    whatever the drafter computes; only the acceptance changes.

    How much it changes, measured on the cross-check's two prompts in fp32: the bias matters little
    (our head without it picks the same first draft token 99 % of the time), but without its input
    norm the head agrees with itself 6-14 % of the time, without its final norm 6-11 %, and with all
    three dropped (this export) 0-1 %. vLLM 0.32 on the CPU loads and runs the directory, its output
    equals plain greedy, and it accepts 0 of 159 drafted tokens (k = 3) where our EAGLE chain with
    the same head accepts 17 of 108. Running our head as trained inside vLLM needs a drafter class
    of its own (vLLM registers out-of-tree models with ``ModelRegistry.register_model``), not a
    different export.
    """
    from ..proposers.eagle import load_eagle_head

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = _embedded_target(target)
    head = load_eagle_head(target)
    H = target.config.hidden_size
    w = head.fc.weight.detach()  # [H, 2H]: columns [feature | embedding]
    state = {"fc.weight": torch.cat([w[:, H:], w[:, :H]], dim=1)}  # vLLM: [embedding | feature]
    for k, v in head.layer.state_dict().items():
        if not k.startswith("input_layernorm"):
            state[f"layers.0.{k}"] = v.detach()
    state = {k: v.to("cpu", dtype).contiguous() for k, v in state.items()}
    config = target.config.to_dict()
    config.update({"architectures": ["EagleLlamaForCausalLM"], "num_hidden_layers": 1,
                   "dtype": str(dtype).replace("torch.", ""), "tie_word_embeddings": False})
    from safetensors.torch import save_file

    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(_clean(config), indent=2))
    _copy_tokenizer(out_dir)
    return out_dir


__all__ = ["export_draft_model", "export_eagle_head"]
