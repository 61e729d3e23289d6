"""The weights shipped for the embedded target, and what every trained drafter needs to use them.

Each trained family (draft model, exit adapter, Medusa heads, EAGLE head) stores only its own
weights, in bf16 safetensors under ``specdecode_ref/weights/``, with its training settings and
held-out figures as the file's metadata; the embeddings and lm_head stay the target's. The shipped
files fit SmolLM2-135M-Instruct only, so loading them checks the target's shape first. All four
families may draft among the same frequency-ranked reduced vocabulary (vocab.py).
"""
from __future__ import annotations

from pathlib import Path

import torch

WEIGHTS_DIR = Path(__file__).resolve().parent.parent / "weights"
DRAFT_VOCAB = WEIGHTS_DIR / "smollm2-135m-draft-vocab.safetensors"
# The shape of the embedded target the shipped weights were trained for.
EMBEDDED_SHAPE = {"hidden_size": 576, "num_hidden_layers": 30, "vocab_size": 49152}


def is_embedded_target(target) -> bool:
    return all(getattr(target.config, k, None) == v for k, v in EMBEDDED_SHAPE.items())


def require_embedded(target, what: str) -> None:
    """Refuse to put the shipped ``what`` on a target it was not trained for."""
    if target is None:
        raise ValueError(f"the shipped {what} needs the target model: load_proposer(name, target)")
    if not is_embedded_target(target):
        raise ValueError(f"the shipped {what} weights were trained for SmolLM2-135M-Instruct "
                         f"({EMBEDDED_SHAPE}); for another target build the proposer with your own model")


def require_same_target(built_for, target, message: str) -> None:
    """Drafters that read the target's layers, features or lm_head work only with that very model."""
    if target is not built_for:
        raise ValueError(message)


def require_file(path, family: str) -> Path:
    """``path`` as a Path, or a FileNotFoundError saying which training command writes it."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; train it with `python -m specdecode_ref.training {family}`")
    return path


def save_weights(state: dict, path, meta: dict | None = None) -> Path:
    """Write ``state`` in bf16 with ``meta`` as the file's metadata (values stored as strings).
    Integer tensors (e.g. a draft vocabulary's ids) keep their dtype: bf16 cannot hold ids exactly."""
    from safetensors.torch import save_file

    state = {k: (v.detach().to(torch.bfloat16) if v.is_floating_point() else v.detach()).contiguous()
             for k, v in state.items()}
    save_file(state, str(path), metadata={k: str(v) for k, v in (meta or {}).items()})
    return Path(path)


def load_weights(path, like: torch.Tensor | None = None) -> dict:
    """The tensors of ``path``, floating ones cast to the dtype of ``like`` (e.g. a target parameter) when
    given; integer ones as stored."""
    from safetensors.torch import load_file

    state = load_file(str(path))
    return state if like is None else {k: v.to(like.dtype) if v.is_floating_point() else v for k, v in state.items()}


def weights_metadata(path) -> dict:
    """The safetensors metadata of ``path`` (strings, as written)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})


def decoded_metadata(path) -> dict:
    """The weights' metadata with JSON values decoded (lists, dicts, numbers); other strings as written."""
    import json

    out = {}
    for k, v in weights_metadata(path).items():
        try:
            out[k] = json.loads(v)
        except (json.JSONDecodeError, TypeError):
            out[k] = v
    return out


def shipped_vocab(reduced_vocab: bool = True):
    """The shipped 8,192-token draft vocabulary (LongTensor of ids), or None for the full one."""
    from .vocab import load_vocab

    return load_vocab(DRAFT_VOCAB) if reduced_vocab else None


__all__ = ["WEIGHTS_DIR", "DRAFT_VOCAB", "EMBEDDED_SHAPE", "is_embedded_target", "require_embedded",
           "require_same_target", "require_file", "save_weights", "load_weights", "weights_metadata",
           "shipped_vocab"]
