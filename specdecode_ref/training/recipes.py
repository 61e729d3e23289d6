"""How each shipped drafter was trained: the one source of training defaults.

The training functions, the command line (``python -m specdecode_ref.training``) and the weights'
metadata all read these values, and the README's training section quotes them. They are the
settings of the files in ``specdecode_ref/weights/`` (each file's metadata records its own run;
tests/training/test_recipes.py checks that they agree), so running a command with its defaults
reproduces the shipped weights. Plain data only: the proposers import it without pulling in
training code.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from ..proposers.draft_model import DEFAULT_INIT_LAYERS


@dataclass(frozen=True)
class Recipe:
    """What every family's run needs: AdamW steps, peak learning rate, tokens per batch, seed."""

    steps: int
    lr: float
    batch_tokens: int = 2048
    seed: int = 0

    def settings(self) -> dict:
        """The recipe as weights metadata: numbers as they are, sequences as JSON lists."""
        return {k: json.dumps(list(v)) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class DraftRecipe(Recipe):
    init_layers: tuple = DEFAULT_INIT_LAYERS  # the target layers the draft starts from (lowest held-out loss)
    vocab_size: int = 8192  # the reduced draft vocabulary written beside the weights


@dataclass(frozen=True)
class EarlyExitRecipe(Recipe):
    exits: tuple = (4, 8, 12)  # exit layers trained jointly; the best predicted one is shipped


@dataclass(frozen=True)
class MedusaRecipe(Recipe):
    num_heads: int = 3  # head i predicts the token i + 2 places ahead
    num_layers: int = 1  # ResBlocks per head
    hydra: bool = False  # Hydra heads: head i also reads the tokens between the feature and its prediction
    hydra_width: int = 256  # Hydra only: the bottleneck of each head's MLP on [feature; token embeddings]


@dataclass(frozen=True)
class EagleRecipe(Recipe):
    feature_weight: float = 1.0  # smooth-L1 on the predicted feature
    token_weight: float = 1.0  # soft cross-entropy of its tokens (EAGLE's paper: 0.1; 1.0 measured better here)
    unroll: int = 3  # stage 2, training-time test: steps in which the head reads its own outputs
    unroll_steps: int = 500
    unroll_lr: float = 3e-4
    features: str = "final"  # "final": EAGLE-1's head on the last normed state; "fused": EAGLE-3's fused head


@dataclass(frozen=True)
class ParallelDraftRecipe(Recipe):
    positions: int = 4  # K: one forward drafts K positions (K - 1 mask tokens)
    keep: tuple = (0.7, 0.49, 0.343)  # conditional drop: share of positions trained at mask depth 1, 2, 3 (PARD: 0.7^j)
    rank: int = 4  # the low-rank update of every projection (what is shipped, with the masks)
    scale: float = 2.0  # the update is scale * B @ A
    max_len: int = 512  # training sequences up to this many tokens (prompt + answer)


@dataclass(frozen=True)
class CorpusRecipe:
    """The self-distillation corpus (distill.py): answers per prompt, and the held-out share."""

    max_new_tokens: int = 256
    batch_size: int = 32
    temperatures: tuple = (0.0, 0.7)
    top_k: int = 20
    holdout_fraction: float = 0.03


# The shipped files were trained on one H100 (Python-bound at 3-25 steps/s: each step gathers a batch
# of ~8k tokens on the host) on the 4.9M-token corpus; see the README for the CPU equivalent.
DRAFT = DraftRecipe(steps=1000, lr=1e-3, batch_tokens=8192)
EARLY_EXIT = EarlyExitRecipe(steps=800, lr=1e-3, batch_tokens=4096)
MEDUSA = MedusaRecipe(steps=1500, lr=1e-3, batch_tokens=8192)
HYDRA = MedusaRecipe(steps=3000, lr=1e-3, batch_tokens=8192, hydra=True)
EAGLE = EagleRecipe(steps=1500, lr=1e-3, batch_tokens=8192, unroll_steps=300)
PARALLEL_DRAFT = ParallelDraftRecipe(steps=800, lr=2e-3, batch_tokens=2048)
CORPUS = CorpusRecipe()

# Command name -> recipe, in training order.
RECIPES = {"draft": DRAFT, "early-exit": EARLY_EXIT, "medusa": MEDUSA, "hydra": HYDRA, "eagle": EAGLE,
           "parallel-draft": PARALLEL_DRAFT}

__all__ = ["Recipe", "DraftRecipe", "EarlyExitRecipe", "MedusaRecipe", "EagleRecipe", "ParallelDraftRecipe", "CorpusRecipe", "DRAFT",
           "EARLY_EXIT", "MEDUSA", "HYDRA", "EAGLE", "PARALLEL_DRAFT", "CORPUS", "RECIPES"]
