"""Train the drafters on the target's own answers, reproducibly, on a laptop CPU.

One command per step, each with a progress bar, a fixed seed, a loss curve and safetensors written
into ``specdecode_ref/weights/``::

    python -m specdecode_ref.training data        # self-distillation corpus (distill.py)
    python -m specdecode_ref.training draft       # 4-layer draft model (notebook 05)
    python -m specdecode_ref.training early-exit  # exit adapters for self-speculation (notebook 06)
    python -m specdecode_ref.training medusa      # Medusa heads on the corpus' hidden states (notebook 07)
    python -m specdecode_ref.training medusa --hydra  # Hydra heads: Medusa heads that read the drafted tokens
    python -m specdecode_ref.training eagle       # EAGLE feature-drafting head (notebook 08)
    python -m specdecode_ref.training fused-features       # EAGLE-3: add the fused features to the corpus,
    python -m specdecode_ref.training eagle --features fused  # then train the fused head on them
    python -m specdecode_ref.training parallel-draft  # the draft model adapted to draft K tokens per forward (notebook 13)

The target stays frozen. Every drafter minimises the soft cross-entropy against the target's top-k
next-token distribution (KL up to a constant), not only its argmax, so the same weights serve greedy
and sampled decoding. Training runs in bf16 autocast with fp32 master weights.

This module gathers the names notebooks use; the code lives by purpose: loop.py (the shared loop),
draft.py, early_exit.py, medusa.py, eagle.py, parallel_draft.py (one per family), recipes.py (the defaults), cli.py.
"""
from __future__ import annotations

from ..masks import unrolled_mask
from .cli import main
from .draft import draft_loss_fn, train_draft
from .eagle import eagle_batch, eagle_loss_fn, evaluate_eagle, train_eagle, write_eagle
from .early_exit import best_exit, early_exit_loss_fn, exit_hidden_states, train_early_exit
from .loop import TrainResult, combine_stages, evaluate, fit, save_curve
from .medusa import hydra_batch, hydra_loss_fn, medusa_accuracy, medusa_batch, medusa_loss_fn, train_medusa
from .parallel_draft import pard_layout, token_corpus, train_parallel_draft

__all__ = ["TrainResult", "fit", "evaluate", "save_curve", "combine_stages", "draft_loss_fn", "train_draft",
           "exit_hidden_states", "early_exit_loss_fn", "train_early_exit", "best_exit", "medusa_batch",
           "medusa_loss_fn", "hydra_batch", "hydra_loss_fn", "medusa_accuracy", "train_medusa", "eagle_batch",
           "unrolled_mask", "eagle_loss_fn", "evaluate_eagle", "train_eagle", "write_eagle", "pard_layout",
           "token_corpus", "train_parallel_draft", "main"]

if __name__ == "__main__":
    main()
