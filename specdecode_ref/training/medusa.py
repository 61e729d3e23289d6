"""Training Medusa heads (notebook 07, Medusa-1): the target stays frozen and is never run; the
heads learn from the hidden states stored in the corpus, through the target's lm_head."""
from __future__ import annotations

import torch

from . import distill
from .distill import Corpus
from .loop import autocast, fit, require_features
from .recipes import MEDUSA


def medusa_batch(corpus: Corpus, idx: list, num_heads: int, device="cpu"):
    """Features and labels for Medusa heads, read from the corpus' stored hidden states (no target
    forward: this is why Medusa-1 trains cheaply).

    Rows: every position t from start-1 (the last prompt token) to T-3 of each sequence -- the
    positions whose feature a proposer reads at decode time. labels[:, i] = ids[t + 2 + i], the
    token head i predicts (an answer token, since t + 2 + i >= start + 1), or -100 past the end.
    Returns (features [M, H] float, labels [M, num_heads] long).
    """
    require_features(corpus)
    feats, labels = [], []
    for i in idx:
        ids, h = corpus.ids[i], corpus.hidden[i]
        T = ids.numel()
        t = torch.arange(max(corpus.start[i] - 1, 0), T - 2)
        if t.numel() == 0:
            continue
        lab = torch.full((t.numel(), num_heads), -100, dtype=torch.long)
        for j in range(num_heads):
            pos = t + 2 + j
            ok = pos <= T - 1
            lab[ok, j] = ids[pos[ok]]
        feats.append(h[t])
        labels.append(lab)
    if not feats:
        return torch.zeros(0, 0, device=device), torch.zeros(0, num_heads, dtype=torch.long, device=device)
    return torch.cat(feats).float().to(device), torch.cat(labels).to(device)


def medusa_loss_fn(target, heads, corpus: Corpus, device="cpu"):
    """Sum over heads of the cross-entropy against the actual answer token i+2 ahead, through the
    target's frozen lm_head; the agreement reported is head 0's top-1 accuracy."""
    from ..proposers.medusa import project

    def loss_fn(idx):
        x, y = medusa_batch(corpus, idx, heads.num_heads, device)
        feats = heads(x)  # [M, num_heads, H]
        total, agree = feats.sum() * 0.0, 0.0
        for j in range(heads.num_heads):
            ok = y[:, j] >= 0
            if not bool(ok.any()):
                continue
            logits = project(target, feats[ok, j]).float()
            total = total + torch.nn.functional.cross_entropy(logits, y[ok, j])
            if j == 0:
                agree = float((logits.detach().argmax(-1) == y[ok, 0]).float().mean())
        return total, agree

    return loss_fn


@torch.no_grad()
def medusa_accuracy(target, heads, corpus: Corpus, ranks: int = 10, batch_tokens: int = 2048, device="cpu") -> dict:
    """Per-head accuracy on ``corpus``: rank_accuracy[i][r] = share of positions where the actual token
    is head i's rank-r candidate (what derive_choices needs), top1 and top5 (its cumulative sums),
    cross-entropy per head, and the number of positions per head."""
    from ..proposers.medusa import project

    nh = heads.num_heads
    hits = torch.zeros(nh, ranks, dtype=torch.float64)
    nll = torch.zeros(nh, dtype=torch.float64)
    count = torch.zeros(nh, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    for idx in distill.iterate_batches(corpus, batch_tokens, g):
        x, y = medusa_batch(corpus, idx, nh, device)
        if x.numel() == 0:
            continue
        with autocast(device):
            feats = heads(x)
        for j in range(nh):
            ok = y[:, j] >= 0
            if not bool(ok.any()):
                continue
            with autocast(device):
                logits = project(target, feats[ok, j])
            logits = logits.float()
            yj = y[ok, j]
            top = logits.topk(min(ranks, logits.shape[-1]), dim=-1).indices
            match = top == yj[:, None]
            hits[j, : match.shape[1]] += match.sum(0).double().cpu()
            nll[j] += float(torch.nn.functional.cross_entropy(logits, yj, reduction="sum"))
            count[j] += int(ok.sum())
    rank_acc = (hits / count.clamp(min=1)[:, None]).tolist()
    cum = torch.tensor(rank_acc).cumsum(-1)
    return {"rank_accuracy": [[round(a, 5) for a in row] for row in rank_acc],
            "top1": [round(float(c), 4) for c in cum[:, 0]],
            "top5": [round(float(c), 4) for c in cum[:, min(4, ranks - 1)]],
            "loss": [round(float(v), 4) for v in (nll / count.clamp(min=1))],
            "positions": [int(c) for c in count]}


def train_medusa(target, corpus: Corpus, *, num_heads: int = MEDUSA.num_heads, num_layers: int = MEDUSA.num_layers,
                 steps: int = MEDUSA.steps, lr: float = MEDUSA.lr, batch_tokens: int = MEDUSA.batch_tokens,
                 seed: int = MEDUSA.seed, holdout: Corpus | None = None):
    """Train Medusa heads on the corpus' stored last hidden states (the target stays frozen and is
    never run: only its lm_head is read). Returns (heads, TrainResult); with ``holdout``,
    ``result.heldout = {"before": ..., "after": ...}`` per-head accuracies (medusa_accuracy)."""
    from ..proposers.medusa import MedusaHeads

    require_features(corpus, target)
    device = next(target.parameters()).device
    torch.manual_seed(seed)
    heads = MedusaHeads(target.config.hidden_size, num_heads, num_layers).float().to(device).train()
    before = medusa_accuracy(target, heads, holdout, batch_tokens=batch_tokens, device=device) \
        if holdout is not None else {}
    result = fit(heads.parameters(), medusa_loss_fn(target, heads, corpus, device), corpus, steps=steps, lr=lr,
                 batch_tokens=batch_tokens, seed=seed, desc=f"Medusa heads ({num_heads})", device=device)
    heads.eval().requires_grad_(False)
    if holdout is not None:
        result.heldout = {"before": before,
                          "after": medusa_accuracy(target, heads, holdout, batch_tokens=batch_tokens, device=device)}
    return heads, result
