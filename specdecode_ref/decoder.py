"""The only module that reaches inside a transformers causal LM (as kv.py is for the cache).

Self-speculation, EAGLE, the draft model built from target layers, training and the layer
analyses all need more than ``model(input_ids)``: one decoder layer at a time, the rotary
embeddings, the final norm, the lm_head. transformers keeps these at ``model.model.layers[i]``,
``model.model.rotary_emb``, ``model.model.norm`` and ``model.lm_head`` in Llama-style decoders
(Llama, SmolLM2, Qwen2, Mistral), and the call signature of a layer changes between versions.
Everything else in the package goes through the functions here.

Shapes: ``hidden`` [B, q, H]; ``positions`` [B, q] (absolute position ids); ``mask`` a 4D mask
over the cache plus the new entries (masks.py), or None for a single query.
"""
from __future__ import annotations

import copy

import torch

# Parameter names of the embeddings and the lm_head, which drafters share with the target.
SHARED_PREFIXES = ("model.embed_tokens", "lm_head")


def is_llama_style(model) -> bool:
    """Whether ``model`` exposes a Llama-style decoder (``model.layers``, ``rotary_emb``, ``norm``)."""
    base = getattr(model, "model", None)
    return base is not None and all(hasattr(base, a) for a in ("layers", "rotary_emb", "norm"))


def require_llama_style(model, what: str) -> None:
    """Raise a clear error when ``what`` (e.g. "early exit") cannot reach the layers it needs."""
    if not is_llama_style(model):
        raise ValueError(f"{what} needs a Llama-style decoder (model.layers, model.rotary_emb, model.norm)")


def num_layers(model) -> int:
    return int(model.config.num_hidden_layers)


def layer(model, i: int) -> torch.nn.Module:
    """Decoder layer ``i`` of ``model`` (the module itself, shared, not a copy)."""
    return model.model.layers[i]


def copy_layer(model, i: int, layer_idx: int = 0) -> torch.nn.Module:
    """A copy of decoder layer ``i`` that writes to ``layer_idx`` of its own cache."""
    out = copy.deepcopy(model.model.layers[i])
    out.self_attn.layer_idx = layer_idx
    return out


def copy_final_norm(model) -> torch.nn.Module:
    return copy.deepcopy(model.model.norm)


def embed(model, ids: torch.Tensor) -> torch.Tensor:
    """Token embeddings [B, q, H] of ids [B, q] (the target's own table, shared)."""
    return model.model.embed_tokens(ids)


def rotary(model, hidden: torch.Tensor, positions: torch.Tensor):
    """The (cos, sin) rotary embeddings of ``positions`` [B, q] for ``hidden`` [B, q, H]."""
    return model.model.rotary_emb(hidden, position_ids=positions)


def run_layer(module: torch.nn.Module, hidden, positions, rope, cache=None, mask=None) -> torch.Tensor:
    """One decoder layer (the target's or a drafter's own copy) on ``hidden`` [B, q, H]; it appends
    its keys and values to ``cache`` when one is given. ``rope``: :func:`rotary` of the positions."""
    return module(hidden, attention_mask=mask, position_ids=positions, past_key_values=cache,
                  use_cache=cache is not None, position_embeddings=rope)


def run_layers(model, hidden, positions, layers, cache=None, mask=None) -> torch.Tensor:
    """The target's decoder ``layers`` (an index range) on ``hidden`` [B, q, H] at ``positions``
    [B, q]: the slice of the model's own forward that self-speculation needs."""
    rope = rotary(model, hidden, positions)
    for i in layers:
        hidden = run_layer(model.model.layers[i], hidden, positions, rope, cache, mask)
    return hidden


def final_norm(model, hidden: torch.Tensor) -> torch.Tensor:
    return model.model.norm(hidden)


def lm_head(model, hidden: torch.Tensor) -> torch.Tensor:
    """Logits [..., V] from final-normed hidden states [..., H]."""
    return model.lm_head(hidden)


def logits_from_residual(model, hidden: torch.Tensor) -> torch.Tensor:
    """lm_head(norm(h)): what the model would predict if it stopped at this residual stream."""
    return lm_head(model, final_norm(model, hidden))


def last_hidden(model, input_ids, attention_mask=None, cache=None) -> tuple:
    """The decoder without its lm_head: ``(final-normed hidden states [B, q, H], cache)``.

    Drafters that project onto a reduced vocabulary, and the teacher pass, skip the full
    vocabulary projection this way.
    """
    out = model.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                      use_cache=cache is not None)
    return out.last_hidden_state, out.past_key_values


def residual_streams(model, input_ids, attention_mask=None) -> tuple:
    """The input of every layer, N+1 tensors [B, T, H] (entry L enters layer L, entry N is the
    final-normed output as transformers reports it); no cache, no lm_head."""
    return model.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True).hidden_states


def fused_hidden(hidden_states: tuple, layers) -> torch.Tensor:
    """Entries ``layers`` of a transformers ``hidden_states`` tuple (entry L enters layer L, the last is
    the final-normed output) concatenated on the last dim: [..., len(layers) * H]. EAGLE-3's fused
    feature; the engine's hidden states and :func:`hidden_states_at` both go through here, so
    training and drafting read the very same entries."""
    if not layers:
        raise ValueError("layers must name at least one entry of hidden_states")
    bad = [i for i in layers if not -len(hidden_states) <= i < len(hidden_states)]
    if bad:
        raise ValueError(f"layers {bad} are outside the {len(hidden_states)} hidden states of this model")
    return torch.cat([hidden_states[i] for i in layers], dim=-1)


def hidden_states_at(model, input_ids, attention_mask=None, layers=()) -> tuple:
    """One forward without the lm_head: ``(final-normed hidden states [B, q, H], fused [B, q, len(layers) * H])``
    where fused is :func:`fused_hidden` of ``layers`` (None when ``layers`` is empty)."""
    if not layers:
        return last_hidden(model, input_ids, attention_mask)[0], None
    hs = model.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True).hidden_states
    return hs[-1], fused_hidden(hs, layers)


def is_shared_param(name: str) -> bool:
    """Whether a drafter's parameter ``name`` is the target's embeddings or lm_head (never trained
    nor shipped)."""
    return name.startswith(SHARED_PREFIXES)


def model_from_layers(target, layer_indices) -> torch.nn.Module:
    """A smaller causal LM of the target's class made of copies of ``layer_indices`` (renumbered
    0..n-1), with copies of the final norm and rotary embeddings, sharing the target's embeddings
    and lm_head (so it costs no extra vocabulary weights)."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(target.config)
    config.num_hidden_layers = len(layer_indices)
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = [target.config.layer_types[i] for i in layer_indices]
    with torch.device("meta"):
        small = AutoModelForCausalLM.from_config(config)
    base = small.model
    base.layers = torch.nn.ModuleList(copy_layer(target, i, new_idx) for new_idx, i in enumerate(layer_indices))
    base.norm = copy_final_norm(target)
    base.rotary_emb = copy.deepcopy(target.model.rotary_emb)
    base.embed_tokens = target.model.embed_tokens  # shared, frozen
    small.lm_head = target.lm_head  # shared (tied to the embeddings in SmolLM2)
    small.generation_config = copy.deepcopy(target.generation_config)
    return small


__all__ = ["SHARED_PREFIXES", "is_llama_style", "require_llama_style", "num_layers", "layer", "copy_layer",
           "copy_final_norm", "embed", "rotary", "run_layer", "run_layers", "final_norm", "lm_head",
           "logits_from_residual", "last_hidden", "residual_streams", "fused_hidden", "hidden_states_at",
           "is_shared_param", "model_from_layers"]
