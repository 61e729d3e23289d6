"""Our trained drafters as model directories a serving engine can load (vLLM, transformers).

The shipped drafter files hold only their own weights: the 4-layer draft model and the EAGLE head
both borrow the target's embeddings and lm_head at run time. A serving engine loads a drafter as a
model directory of its own, so exporting means writing those shared tensors in as well, in the
engine's naming.

    export_draft_model(out_dir)   a standalone Hugging Face Llama model (vLLM "draft_model")
    export_eagle_head(out_dir)    the head in vLLM's EAGLE-1 Llama layout (vLLM "eagle"); see its
                                  docstring for what that layout cannot express
    export_eagle3_head(out_dir)   an EAGLE-3 head in vLLM's Eagle3LlamaForCausalLM layout (vLLM
                                  "eagle3"): the same function, weight for weight
    export_medusa_heads(out_dir)  the shipped Medusa heads as vLLM's MedusaModel (vLLM "medusa")
    export_parallel_draft(out_dir)  the parallel drafter (PARD) as a standalone Hugging Face Llama
                                  model with its mask token on a reserved id (vLLM "draft_model"
                                  with ``parallel_drafting``)

    export_drafter(name, out_dir, k)  any of them by the proposer's name, with the
                                  ``speculative_config`` that serves it in vLLM

Hydra heads have no vLLM counterpart (vLLM's Medusa heads read the hidden state alone; a Hydra
head also reads the tokens on its path), nor do early exit (LayerSkip-style self-speculation) or
the n-gram and suffix drafters, which vLLM builds itself from settings (``vllm_runner.ngram_config``,
``vllm_runner.suffix_config``).
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


def export_eagle3_head(out_dir, head=None, target=None, dtype: torch.dtype = torch.float32) -> Path:
    """Write an EAGLE-3 head (``proposers/eagle.py``, :class:`FusedEagleHead`) as vLLM's
    ``Eagle3LlamaForCausalLM`` directory (``vllm/model_executor/models/llama_eagle3.py``), for
    ``speculative_config={"method": "eagle3", "model": out_dir, "num_speculative_tokens": k}``.

    head: a FusedEagleHead, a weights file, or None for the shipped ``EAGLE3_WEIGHTS``. Our head
    computes what vLLM's does, so nothing is dropped; the names map one to one:

        fuse.weight [H, 3H]                        -> fc.weight (vLLM's combine_hidden_states)
        layer.* (q/k/v read 2H), hidden_norm       -> layers.0.* (vLLM's "midlayer")
        norm                                       -> norm.weight
        target lm_head rows of draft_ids [V', H]   -> lm_head.weight (the draft vocabulary's own head)
        draft_ids                                  -> d2t = draft_ids - arange(V') (vLLM adds it back),
                                                      t2d = which target ids are drafted

    config.json: the target's Llama config with one layer, ``draft_vocab_size``,
    ``target_hidden_size``, ``norm_before_residual`` and ``eagle_aux_hidden_state_layer_ids`` (the
    hidden states vLLM's target hands over: entries of transformers' ``hidden_states`` tuple, the
    same indexing as ``head.feature_layers``). The token embeddings are left out: vLLM shares the
    target's, as our head does.
    """
    from ..proposers.eagle import EAGLE3_WEIGHTS, FusedEagleHead, load_eagle_weights

    out_dir = Path(out_dir)
    target = _embedded_target(target)
    if head is None:
        from ..proposers.shipped import require_file

        head = load_eagle_weights(target, require_file(EAGLE3_WEIGHTS, "eagle3"))
    elif not isinstance(head, torch.nn.Module):
        head = load_eagle_weights(target, head)
    if not isinstance(head, FusedEagleHead):
        raise ValueError(f"export_eagle3_head writes an EAGLE-3 (fused) head, got {type(head).__name__}; "
                         "an EAGLE-1 head goes through export_eagle_head")
    out_dir.mkdir(parents=True, exist_ok=True)
    H, V = target.config.hidden_size, target.config.vocab_size
    ids = torch.arange(V) if head.draft_ids is None else head.draft_ids.cpu()
    lm_head = target.get_output_embeddings().weight.detach().cpu()[ids]
    state = {"fc.weight": head.fuse.weight, "norm.weight": head.norm.weight,
             "layers.0.hidden_norm.weight": head.hidden_norm.weight, "lm_head.weight": lm_head}
    state.update({f"layers.0.{k}": v for k, v in head.layer.state_dict().items()})
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in state.items()}
    state["d2t"] = (ids - torch.arange(ids.numel())).to(torch.long).contiguous()
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    state["t2d"] = t2d
    config = target.config.to_dict()
    config.update({"architectures": ["Eagle3LlamaForCausalLM"], "num_hidden_layers": 1,
                   "dtype": str(dtype).replace("torch.", ""), "tie_word_embeddings": False,
                   "draft_vocab_size": int(ids.numel()), "target_hidden_size": H,
                   "norm_before_residual": bool(head.norm_before_residual),
                   "eagle_aux_hidden_state_layer_ids": list(head.feature_layers)})
    from safetensors.torch import save_file

    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(_clean(config), indent=2))
    _copy_tokenizer(out_dir)
    return out_dir


def export_medusa_heads(out_dir, heads=None, target=None, draft_vocab=None,
                        dtype: torch.dtype = torch.float32) -> Path:
    """Write Medusa heads (``proposers/medusa.py``) as vLLM's ``MedusaModel`` directory
    (``vllm/model_executor/models/medusa.py``), for ``speculative_config={"method": "medusa",
    "model": out_dir, "num_speculative_tokens": num_heads}``.

    vLLM's heads are ours: per head a stack of ``x + SiLU(Linear(x))`` blocks (with bias:
    ``medusa_fc_bias``) on the target's last normed hidden state, then a vocabulary projection; it
    drafts the argmax of every head, one chain of num_heads tokens, which is our
    ``load_medusa_proposer(tree=False)``. Our heads share the target's lm_head; the export writes it
    once with ``original_lm_head`` (vLLM then uses one projection for all heads). draft_vocab: None
    for the full vocabulary (our ``load_medusa_proposer(tree=False, reduced_vocab=False)``),
    "shipped" for the draft vocabulary our proposer uses by default, or ids: written as vLLM's
    ``token_map`` with ``truncated_vocab_size``. vLLM 0.32 cannot load that one: its loader creates
    ``token_map`` as a parameter inside ``load_weights`` and then stops with "Following weights were
    not initialized from checkpoint: {'token_map'}", hence the full vocabulary by default.
    heads: MedusaHeads, a weights file, or None for the shipped file. Hydra heads are refused.
    """
    from ..proposers.medusa import MEDUSA_WEIGHTS, HydraHeads, MedusaHeads, load_medusa_heads
    from ..proposers.shipped import shipped_vocab

    out_dir = Path(out_dir)
    target = _embedded_target(target)
    if heads is None or not isinstance(heads, torch.nn.Module):
        heads = load_medusa_heads(target, MEDUSA_WEIGHTS if heads is None else heads)
    if isinstance(heads, HydraHeads):
        raise ValueError("vLLM has no Hydra heads: its Medusa heads read the hidden state alone, a Hydra head "
                         "also the tokens drafted before it")
    if not isinstance(heads, MedusaHeads):
        raise ValueError(f"export_medusa_heads writes MedusaHeads, got {type(heads).__name__}")
    out_dir.mkdir(parents=True, exist_ok=True)
    H, V = target.config.hidden_size, target.config.vocab_size
    if isinstance(draft_vocab, str):
        if draft_vocab != "shipped":
            raise ValueError(f"draft_vocab must be 'shipped', None or token ids, got {draft_vocab!r}")
        draft_vocab = shipped_vocab(True)
    ids = torch.arange(V) if draft_vocab is None else torch.as_tensor(draft_vocab, dtype=torch.long).cpu()
    state = {}
    for i, head in enumerate(heads.heads):
        for j, block in enumerate(head):
            state[f"blocks.{i}.layers.{j}.weight"] = block.linear.weight
            state[f"blocks.{i}.layers.{j}.bias"] = block.linear.bias
    state["lm_heads.0.weight"] = target.get_output_embeddings().weight[ids]
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in state.items()}
    truncated = ids.numel() < V
    if truncated:
        state["token_map"] = ids.contiguous()
    config = {"architectures": ["MedusaModel"], "model_type": "medusa", "hidden_size": H, "vocab_size": V,
              "num_heads": heads.num_heads, "num_hidden_layers": heads.num_layers,
              "truncated_vocab_size": int(ids.numel()), "original_lm_head": True, "medusa_fc_bias": True,
              "dtype": str(dtype).replace("torch.", "")}
    from safetensors.torch import save_file

    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    _copy_tokenizer(out_dir)
    return out_dir


PARD_TOKEN = "<gh_stars>"  # the reserved token whose embedding row the exported parallel drafter's mask takes


def _pard_token_id(pard_token, vocab_size: int) -> int:
    """The id of ``pard_token`` (None: :data:`PARD_TOKEN`; a token string or an id), checked to be one
    of the embedded tokenizer's reserved special tokens: never a chat-template token (BOS, EOS, PAD,
    UNK) and below the vocabulary size."""
    from transformers import AutoTokenizer

    from ..models import EMBEDDED, cache_dir, prepare_embedded

    prepare_embedded(verbose=False)
    tok = AutoTokenizer.from_pretrained(cache_dir() / EMBEDDED)
    special = {i for i, t in tok.added_tokens_decoder.items() if getattr(t, "special", False)}
    used = {tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id}
    allowed = sorted(special - used)
    pard_token = PARD_TOKEN if pard_token is None else pard_token
    if isinstance(pard_token, str):
        token_id = tok.convert_tokens_to_ids(pard_token)
        if token_id is None or token_id == tok.unk_token_id:
            raise ValueError(f"{pard_token!r} is not a token of the embedded tokenizer; reserved ids: {allowed}")
    elif isinstance(pard_token, int) and not isinstance(pard_token, bool):
        token_id = pard_token
    else:
        raise ValueError(f"pard_token must be a token string or an id, got {pard_token!r}")
    if not 0 <= token_id < vocab_size or token_id not in allowed:
        raise ValueError(f"pard_token {pard_token!r} (id {token_id}) must be a reserved special token that chat "
                         f"text does not use, one of ids {allowed}")
    return int(token_id)


def export_parallel_draft(out_dir, target=None, path=None, pard_token=None,
                          dtype: torch.dtype = torch.float32) -> Path:
    """Write the parallel drafter (``proposers/parallel_draft.py``, PARD) as a standalone Hugging Face
    ``LlamaForCausalLM`` directory for vLLM's parallel drafting: ``speculative_config={"method":
    "draft_model", "model": out_dir, "parallel_drafting": True, "num_speculative_tokens": k}``.

    Ours is the shipped 4-layer draft model with a low-rank update merged into its projections
    (``load_parallel_draft``) and one learned mask embedding at id V, one past the vocabulary. vLLM
    wants the draft's vocabulary to be the target's (49,152) and reads the mask id from config.json
    (``pard_token``), so the mask takes the row of a reserved token instead: ``pard_token`` (None:
    :data:`PARD_TOKEN`, ``<gh_stars>``, a code-corpus metadata token that neither the chat template
    nor chat text produces). That row of the input embeddings is the mask vector; the output
    projection stays the target's own (untied: ``tie_word_embeddings`` false, ``lm_head.weight`` =
    the target's embedding matrix), so the logits are ours to the last row. A context that did
    contain the reserved token would read the mask vector in the draft; only acceptance could change.

    config.json also records ``pard_positions``: the positions one forward was trained to draft (the
    largest k to serve). path: the parallel drafter's weights (None: the shipped file). target: the
    embedded target (fp32 on the CPU when None). dtype: of the written weights.
    """
    from ..proposers.parallel_draft import PARD_WEIGHTS, load_parallel_draft, masked_embedding

    out_dir = Path(out_dir)
    target = _embedded_target(target)
    token_id = _pard_token_id(pard_token, int(target.config.vocab_size))
    draft = load_parallel_draft(target, PARD_WEIGHTS if path is None else path)
    masked = masked_embedding(draft)
    V = int(masked.weight.shape[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    embed = masked.weight.detach().clone()
    embed[token_id] = masked.mask.detach().to(embed.dtype)
    state = {"model.embed_tokens.weight": embed, "lm_head.weight": draft.get_output_embeddings().weight}
    state.update({k: v for k, v in draft.state_dict().items()
                  if not k.startswith(("model.embed_tokens.", "lm_head."))})
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in state.items()}
    config = draft.config.to_dict()
    config.pop("init_layers", None)
    config.update({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": draft.config.num_hidden_layers,
                   "vocab_size": V, "dtype": str(dtype).replace("torch.", ""), "tie_word_embeddings": False,
                   "pard_token": token_id, "pard_positions": masked.positions})
    for key in ("mask_token_id", "dspark_noise_token_id", "ptd_token_id"):  # vLLM reads these before pard_token
        config.pop(key, None)
    from safetensors.torch import save_file

    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(_clean(config), indent=2))
    draft.generation_config.save_pretrained(out_dir)
    _copy_tokenizer(out_dir)
    return out_dir


VLLM_METHODS = {"draft": "draft_model", "eagle": "eagle", "eagle3": "eagle3", "medusa": "medusa",
                "pard": "draft_model"}


def export_drafter(name: str, out_dir, k: int | None = None, target=None, **kwargs) -> tuple:
    """Export the drafter ``name`` ("draft", "eagle", "eagle3", "medusa", "pard": as ``load_proposer``
    names them) and return ``(model_dir, speculative_config)`` for vLLM's ``LLM(...,
    speculative_config=...)``. k: draft tokens per step (default 3; Medusa: its number of heads,
    the only k vLLM's Medusa takes; PARD: at most the positions it was trained to draft, which is
    also its default, and the config adds ``"parallel_drafting": True``). kwargs go to the
    drafter's export function."""
    if name not in VLLM_METHODS:
        raise ValueError(f"no vLLM export for {name!r}; exportable: {sorted(VLLM_METHODS)} (vLLM builds "
                         "n-gram and suffix drafters itself: vllm_runner.ngram_config / suffix_config)")
    write = {"draft": export_draft_model, "eagle": export_eagle_head, "eagle3": export_eagle3_head,
             "medusa": export_medusa_heads, "pard": export_parallel_draft}[name]
    out = write(out_dir, target=target, **kwargs)
    if name == "medusa":
        heads = json.loads((out / "config.json").read_text())["num_heads"]
        if k is not None and k != heads:
            raise ValueError(f"vLLM's Medusa drafts one token per head: k must be {heads}, got {k}")
        k = heads
    positions = json.loads((out / "config.json").read_text())["pard_positions"] if name == "pard" else None
    k = (3 if positions is None else positions) if k is None else k
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    config = {"method": VLLM_METHODS[name], "model": str(out), "num_speculative_tokens": k}
    if name == "pard":
        if k > positions:
            raise ValueError(f"the parallel drafter was trained to draft {positions} positions per forward "
                             f"({positions - 1} mask tokens); k must be at most {positions}, got {k}")
        config["parallel_drafting"] = True
    return out, config


__all__ = ["export_draft_model", "export_eagle_head", "export_eagle3_head", "export_medusa_heads",
           "export_parallel_draft", "export_drafter", "PARD_TOKEN", "VLLM_METHODS"]
