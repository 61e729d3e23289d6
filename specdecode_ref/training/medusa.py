"""Training Medusa heads (notebook 07, Medusa-1) and Hydra heads: the target stays frozen and is
never run; the heads learn from the hidden states stored in the corpus, through the target's lm_head.

Medusa heads learn the actual answer tokens (cross-entropy). Hydra heads learn by teacher forcing:
head i reads the true tokens between the feature and the token it predicts (as drafting would on a
path that is right so far), and learns the target's own distribution there -- the corpus' top-k --
with the soft cross-entropy of the other drafters (Hydra's paper calls this teacher distillation).
Given the true prefix, that stored distribution is exactly what the target would verify against.
"""
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


def hydra_batch(corpus: Corpus, idx: list, num_heads: int, device="cpu"):
    """What Hydra heads learn from, on the same rows as :func:`medusa_batch` (positions t from
    start-1 to T-3, feature h[t]).

    inputs[:, j] = ids[t + 1 + j]: the tokens teacher forcing feeds, head i reading inputs[:, :i+1]
    (the bonus token at t+1, then the true tokens up to t+1+i); 0 past the end, where no head
    needs them. labels[:, i] = ids[t + 2 + i] (-100 past the end), as medusa_batch. topk_ids and
    topk_logp [M, num_heads, K]: the target's top-k distribution for position t+2+i, which the
    corpus stores as read at t+1+i (zeros where the label is -100).
    Returns (features [M, H] float, inputs [M, num_heads] long, labels [M, num_heads] long,
    topk_ids [M, num_heads, K] long, topk_logp [M, num_heads, K] float), all on ``device``.
    """
    require_features(corpus)
    feats, inputs, labels, t_ids, t_logp = [], [], [], [], []
    for i in idx:
        ids, h, st = corpus.ids[i], corpus.hidden[i], corpus.start[i]
        T = ids.numel()
        t = torch.arange(max(st - 1, 0), T - 2)
        if t.numel() == 0:
            continue
        K = corpus.topk_ids[i].shape[-1]
        inp = torch.zeros((t.numel(), num_heads), dtype=torch.long)
        lab = torch.full((t.numel(), num_heads), -100, dtype=torch.long)
        tid = torch.zeros((t.numel(), num_heads, K), dtype=torch.long)
        tlp = torch.zeros((t.numel(), num_heads, K), dtype=torch.float)
        for j in range(num_heads):
            seen = t + 1 + j
            ok = seen <= T - 1
            inp[ok, j] = ids[seen[ok]]
            ok = seen + 1 <= T - 1
            lab[ok, j] = ids[seen[ok] + 1]
            row = seen[ok] - (st - 1)  # topk row r predicts ids[st + r], read at st - 1 + r
            tid[ok, j] = corpus.topk_ids[i][row].long()
            tlp[ok, j] = corpus.topk_logp[i][row].float()
        feats.append(h[t])
        inputs.append(inp)
        labels.append(lab)
        t_ids.append(tid)
        t_logp.append(tlp)
    if not feats:
        z = torch.zeros(0, num_heads, dtype=torch.long, device=device)
        return (torch.zeros(0, 0, device=device), z, z.clone(), torch.zeros(0, num_heads, 0, dtype=torch.long,
                device=device), torch.zeros(0, num_heads, 0, device=device))
    return (torch.cat(feats).float().to(device), torch.cat(inputs).to(device), torch.cat(labels).to(device),
            torch.cat(t_ids).to(device), torch.cat(t_logp).to(device))


def embed_tokens(target, ids: torch.Tensor) -> torch.Tensor:
    """The target's input embeddings of ``ids`` (frozen, float): what a Hydra head reads of a token."""
    return target.get_input_embeddings().weight.detach()[ids].float()


def head_features(target, heads, corpus: Corpus, idx: list, device="cpu"):
    """Every head's output feature on the batch ``idx`` and what it must predict, for Medusa and
    Hydra heads alike: (features [M, num_heads, H], labels [M, num_heads] (-100: none), and for
    Hydra the target's top-k (topk_ids, topk_logp [M, num_heads, K]), for Medusa None, None)."""
    from ..proposers.medusa import HydraHeads

    if isinstance(heads, HydraHeads):
        x, inputs, y, t_ids, t_logp = hydra_batch(corpus, idx, heads.num_heads, device)
        if x.numel() == 0:
            return x.reshape(0, heads.num_heads, 0), y, t_ids, t_logp
        return heads(x, embed_tokens(target, inputs)), y, t_ids, t_logp
    x, y = medusa_batch(corpus, idx, heads.num_heads, device)
    if x.numel() == 0:
        return x.reshape(0, heads.num_heads, 0), y, None, None
    return heads(x), y, None, None


def hydra_loss_fn(target, heads, corpus: Corpus, device="cpu"):
    """Sum over heads of the soft cross-entropy against the target's top-k at the predicted
    position (teacher forcing, see hydra_batch), through the frozen lm_head; the agreement reported
    is head 0's top-1 agreement with the target's top-1."""

    def loss_fn(idx):
        feats, y, t_ids, t_logp = head_features(target, heads, corpus, idx, device)
        return _sum_over_heads(target, feats, y,
                               lambda logits, ok, j: distill.soft_cross_entropy(logits, t_ids[ok, j], t_logp[ok, j]),
                               lambda logits, ok: distill.agreement(logits, t_ids[ok, 0]))

    return loss_fn


def _sum_over_heads(target, feats, y, head_loss, head0_agreement):
    """The loss every head family shares: ``head_loss(logits, ok, j)`` summed over the heads on the
    positions where head j has a target (``y[:, j] >= 0``), through the target's frozen lm_head;
    the agreement is ``head0_agreement(detached logits, ok)`` of head 0."""
    from ..proposers.medusa import project

    total, agree = feats.sum() * 0.0, 0.0
    for j in range(feats.shape[1]):
        ok = y[:, j] >= 0
        if not bool(ok.any()):
            continue
        logits = project(target, feats[ok, j]).float()
        total = total + head_loss(logits, ok, j)
        if j == 0:
            agree = head0_agreement(logits.detach(), ok)
    return total, agree


def medusa_loss_fn(target, heads, corpus: Corpus, device="cpu"):
    """Sum over heads of the cross-entropy against the actual answer token i+2 ahead, through the
    target's frozen lm_head; the agreement reported is head 0's top-1 accuracy."""

    def loss_fn(idx):
        x, y = medusa_batch(corpus, idx, heads.num_heads, device)
        feats = heads(x)  # [M, num_heads, H]
        return _sum_over_heads(target, feats, y,
                               lambda logits, ok, j: torch.nn.functional.cross_entropy(logits, y[ok, j]),
                               lambda logits, ok: float((logits.argmax(-1) == y[ok, 0]).float().mean()))

    return loss_fn


@torch.no_grad()
def medusa_accuracy(target, heads, corpus: Corpus, ranks: int = 10, batch_tokens: int = 2048, device="cpu") -> dict:
    """Per-head accuracy on ``corpus``: rank_accuracy[i][r] = share of positions where the actual token
    is head i's rank-r candidate (what derive_choices needs), top1 and top5 (its cumulative sums),
    cross-entropy per head, and the number of positions per head. Hydra heads are measured with
    the true tokens on their path (head_features), so their accuracies are conditional on the
    path being right: the factor derive_choices multiplies along a path."""
    from ..proposers.medusa import project

    nh = heads.num_heads
    hits = torch.zeros(nh, ranks, dtype=torch.float64)
    nll = torch.zeros(nh, dtype=torch.float64)
    count = torch.zeros(nh, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    for idx in distill.iterate_batches(corpus, batch_tokens, g):
        with autocast(device):
            feats, y, _, _ = head_features(target, heads, corpus, idx, device)
        if feats.numel() == 0:
            continue
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
                 seed: int = MEDUSA.seed, holdout: Corpus | None = None, hydra: bool = MEDUSA.hydra,
                 hydra_width: int = MEDUSA.hydra_width):
    """Train Medusa heads (``hydra=True``: Hydra heads of bottleneck ``hydra_width``) on the corpus'
    stored last hidden states (the target stays frozen and is never run: only its lm_head and, for
    Hydra, its token embeddings are read). Everything runs on the target's device. Returns (heads,
    TrainResult); with ``holdout``, ``result.heldout = {"before": ..., "after": ...}`` per-head
    accuracies (medusa_accuracy)."""
    from ..proposers.medusa import HydraHeads, MedusaHeads

    require_features(corpus, target)
    device = next(target.parameters()).device
    torch.manual_seed(seed)
    if hydra:
        heads = HydraHeads(target.config.hidden_size, num_heads, num_layers, hydra_width)
        loss_fn, desc = hydra_loss_fn(target, heads, corpus, device), f"Hydra heads ({num_heads})"
    else:
        heads = MedusaHeads(target.config.hidden_size, num_heads, num_layers)
        loss_fn, desc = medusa_loss_fn(target, heads, corpus, device), f"Medusa heads ({num_heads})"
    heads = heads.float().to(device).train()
    before = medusa_accuracy(target, heads, holdout, batch_tokens=batch_tokens, device=device) \
        if holdout is not None else {}
    result = fit(heads.parameters(), loss_fn, corpus, steps=steps, lr=lr,
                 batch_tokens=batch_tokens, seed=seed, desc=desc, device=device)
    heads.eval().requires_grad_(False)
    if holdout is not None:
        result.heldout = {"before": before,
                          "after": medusa_accuracy(target, heads, holdout, batch_tokens=batch_tokens, device=device)}
    return heads, result
