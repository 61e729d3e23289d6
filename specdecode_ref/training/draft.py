"""Distilling the draft model (notebook 05): a few copied target layers learn the target's
next-token distribution at every answer position, the embeddings and lm_head shared and frozen."""
from __future__ import annotations

import torch

from .. import decoder
from . import distill
from .distill import Corpus
from .loop import evaluate, fit
from .recipes import DRAFT


def draft_loss_fn(draft, corpus: Corpus, device="cpu"):
    """Soft cross-entropy of the draft model at every answer position of a batch."""

    def loss_fn(idx):
        x, mask, rows, cols, t_ids, t_logp = distill.pad_batch(corpus, idx)
        h, _ = decoder.last_hidden(draft, x.to(device), mask.to(device))
        logits = decoder.lm_head(draft, h[rows, cols])
        return distill.soft_cross_entropy(logits, t_ids.to(device), t_logp.to(device)), \
            distill.agreement(logits.detach(), t_ids.to(device))

    return loss_fn


def train_draft(target, corpus: Corpus, *, init_layers=DRAFT.init_layers, steps: int = DRAFT.steps,
                lr: float = DRAFT.lr, batch_tokens: int = DRAFT.batch_tokens, seed: int = DRAFT.seed,
                holdout: Corpus | None = None):
    """Distil a small draft model (copies of some target layers + the shared embeddings/head).
    Returns (draft, TrainResult); with ``holdout``, ``result.heldout = {"before": ..., "after": ...}``."""
    from ..proposers.draft_model import build_draft_model

    device = next(target.parameters()).device
    torch.manual_seed(seed)
    draft = build_draft_model(target, DRAFT.init_layers if init_layers is None else init_layers)
    draft.float().train()
    for name, p in draft.named_parameters():
        p.requires_grad_(not decoder.is_shared_param(name))
    loss_fn = draft_loss_fn(draft, corpus, device)
    before = evaluate(draft_loss_fn(draft, holdout, device), holdout) if holdout is not None else {}
    result = fit(draft.parameters(), loss_fn, corpus, steps=steps, lr=lr, batch_tokens=batch_tokens,
                 seed=seed, desc="draft model", device=device)
    draft.eval()
    if holdout is not None:
        result.heldout = {"before": before, "after": evaluate(draft_loss_fn(draft, holdout, device), holdout)}
    draft.requires_grad_(False)
    return draft, result
