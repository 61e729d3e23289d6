"""Training the EAGLE head (notebook 08) by teacher forcing on the corpus' stored features, then
(stage 2) by training-time test on its own outputs; the target is never run, only its embeddings
and lm_head are read, frozen."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from .. import decoder, kv
from ..masks import causal_mask, unrolled_mask
from . import distill
from .distill import Corpus
from .loop import TrainResult, autocast, fit, require_features, save_curve
from .recipes import EAGLE


def eagle_batch(corpus: Corpus, idx: list, device="cpu"):
    """Teacher-forcing tensors for the EAGLE head, read from the corpus alone (no target forward).

    For every sequence and t = 0..T-2 (prompt included): input feature f_t = hidden[t], input token
    x_{t+1}, target feature f_{t+1} = hidden[t+1]. Right-padded to [B, W-1]; ``valid`` marks real
    positions. Answer targets: ``rows``, ``cols`` index the head output f̂_{t+1} whose lm_head must
    match the target's top-k distribution (``t_ids``, ``t_logp``) for the answer token x_{t+2}.
    """
    require_features(corpus)
    x, _, rows, cols, t_ids, t_logp = distill.pad_batch(corpus, idx)
    B, W = x.shape
    H = corpus.hidden[idx[0]].shape[-1]
    hidden = torch.zeros(B, W, H)
    valid = torch.zeros(B, W - 1, dtype=torch.bool)
    for r, i in enumerate(idx):
        T = corpus.ids[i].numel()
        hidden[r, :T] = corpus.hidden[i].float()
        valid[r, : T - 1] = True
    # pad_batch's col c is where the target read the distribution of token c+1: hidden[c], which the
    # head predicts at output index c-1 (from input f_{c-1}, x_c). c = 0 has no head input before it.
    keep = cols >= 1
    rows, cols, t_ids, t_logp = rows[keep], cols[keep] - 1, t_ids[keep], t_logp[keep]
    to = lambda t: t.to(device)  # noqa: E731
    return (to(hidden[:, :-1]), to(x[:, 1:]), to(hidden[:, 1:]), to(valid), to(rows), to(cols), to(t_ids),
            to(t_logp))


def eagle_loss_fn(target, head, corpus: Corpus, device="cpu", feature_weight: float = EAGLE.feature_weight,
                  token_weight: float = EAGLE.token_weight, parts: dict | None = None, unroll: int = 1):
    """EAGLE's loss: feature_weight * smooth-L1(f̂_{t+1}, f_{t+1}) over all positions + token_weight *
    soft cross-entropy of lm_head(f̂_{t+1}) against the target's top-k at answer positions.
    Agreement: top-1 of lm_head(f̂) vs the target's argmax. ``parts`` (a dict) receives both terms,
    and with unroll > 1 the agreement of every step (``agreement_1``, ``agreement_2``, ...).

    unroll > 1 is training-time test: step s feeds the head its own step-(s-1) outputs in place of
    the real features, as drafting token s does at inference, and adds that step's loss (an average
    over the steps). Teacher forcing alone never shows the head its own errors, so its later draft
    positions fall off; this trains it for them. Each extra step costs one more head forward.
    """
    if unroll < 1:
        raise ValueError(f"unroll must be >= 1, got {unroll}")

    def loss_fn(idx):
        f_in, tok, f_next, valid, rows, cols, t_ids, t_logp = eagle_batch(corpus, idx, device)
        q = f_in.shape[1]
        pos = torch.arange(q, device=device)[None].expand(f_in.shape[0], -1)
        cache = kv.new_cache() if unroll > 1 else None
        out = head(f_in, tok, pos, causal_mask(q, 0, device), target, cache)
        total, agree_1 = 0.0, None
        for s in range(1, unroll + 1):
            if s > 1:  # inputs: own previous outputs f̂, next real tokens, one position later
                if q - s + 1 < 1:
                    break
                out = head(out[:, :-1], tok[:, s - 1:], pos[:, s - 1:], unrolled_mask(q, s, device), target, cache)
            ok = valid[:, s - 1:]
            f_loss = torch.nn.functional.smooth_l1_loss(out[ok].float(), f_next[:, s - 1:][ok])
            keep = cols >= s - 1
            logits = decoder.lm_head(target, out[rows[keep], cols[keep] - (s - 1)])
            t_loss = distill.soft_cross_entropy(logits, t_ids[keep], t_logp[keep])
            agree = distill.agreement(logits.detach(), t_ids[keep])
            total = total + feature_weight * f_loss + token_weight * t_loss
            if s == 1:
                agree_1 = agree
                if parts is not None:
                    parts["feature"], parts["token"] = float(f_loss), float(t_loss)
            if parts is not None:
                parts[f"agreement_{s}"] = agree
        return total / unroll, agree_1

    return loss_fn


@torch.no_grad()
def evaluate_eagle(target, head, corpus: Corpus, batch_tokens: int = EAGLE.batch_tokens, device="cpu",
                   feature_weight: float = EAGLE.feature_weight, token_weight: float = EAGLE.token_weight,
                   unroll: int = 2) -> dict:
    """Held-out loss (step 1), its feature (smooth L1) and token (soft cross-entropy) parts, and top-1
    agreement of lm_head(f̂) with the target's argmax, weighted by answer tokens; ``agreement_2`` ..
    is the agreement when the head drafts from its own previous outputs (see ``unroll``)."""
    parts: dict = {}
    # One unrolled pass gives every step; the reported loss is step 1's, rebuilt from its two parts.
    loss_fn = eagle_loss_fn(target, head, corpus, device, feature_weight, token_weight, parts, unroll=unroll)
    sums = {"loss": 0.0, "feature_loss": 0.0, "token_loss": 0.0, "agreement": 0.0}
    sums.update({f"agreement_{s}": 0.0 for s in range(2, unroll + 1)})
    n = 0
    g = torch.Generator().manual_seed(0)
    for idx in distill.iterate_batches(corpus, batch_tokens, g):
        with autocast(device):
            _, a = loss_fn(idx)
        values = {"loss": feature_weight * parts["feature"] + token_weight * parts["token"],
                  "feature_loss": parts["feature"], "token_loss": parts["token"], "agreement": a}
        values.update({f"agreement_{s}": parts.get(f"agreement_{s}", 0.0) for s in range(2, unroll + 1)})
        m = sum(corpus.ids[i].numel() - corpus.start[i] for i in idx)
        for key, v in values.items():
            sums[key] += v * m
        n += m
    return {**{k: round(v / max(n, 1), 4) for k, v in sums.items()}, "tokens": n}


def train_eagle(target, corpus: Corpus, *, steps: int = EAGLE.steps, lr: float = EAGLE.lr,
                batch_tokens: int = EAGLE.batch_tokens, seed: int = EAGLE.seed, holdout: Corpus | None = None,
                feature_weight: float = EAGLE.feature_weight, token_weight: float = EAGLE.token_weight,
                unroll: int = 1, init=None):
    """Train an EAGLE head by teacher forcing on the corpus' stored features (the target is never run:
    only its embeddings and lm_head are read, frozen). Returns (head, TrainResult); with ``holdout``,
    ``result.heldout = {"before": ..., "after": ...}`` (evaluate_eagle). unroll: training-time test
    steps (eagle_loss_fn). init: an EagleHead (or weights file) to start from instead of the copy of
    the target's last layer, e.g. to fine-tune a teacher-forced head with unroll > 1."""
    from ..proposers.eagle import build_eagle_head

    require_features(corpus, target)
    device = next(target.parameters()).device
    torch.manual_seed(seed)
    if init is None:
        head = build_eagle_head(target)
    elif isinstance(init, torch.nn.Module):
        head = copy.deepcopy(init)
    else:
        from ..proposers.eagle import load_eagle_weights
        head = load_eagle_weights(target, init)
    head = head.float().train().requires_grad_(True)
    weights = dict(feature_weight=feature_weight, token_weight=token_weight)
    before = evaluate_eagle(target, head, holdout, batch_tokens, device, **weights) if holdout is not None else {}
    result = fit(head.parameters(), eagle_loss_fn(target, head, corpus, device, **weights, unroll=unroll), corpus,
                 steps=steps, lr=lr, batch_tokens=batch_tokens, seed=seed,
                 desc="EAGLE head" + (f" (unroll {unroll})" if unroll > 1 else ""), device=device)
    head.eval().requires_grad_(False)
    if holdout is not None:
        result.heldout = {"before": before,
                          "after": evaluate_eagle(target, head, holdout, batch_tokens, device, **weights)}
    return head, result


def write_eagle(head, result: TrainResult, out: Path, settings: dict) -> None:
    """Save the head with its settings and held-out figures in the metadata, and its loss curve."""
    from ..proposers.eagle import save_eagle

    after, before = result.heldout["after"], result.heldout["before"]
    meta = {**settings, "seconds": round(result.seconds), "feature": "final normed hidden state",
            "heldout_agreement": after["agreement"], "heldout_agreement_before": before["agreement"],
            "heldout_agreement_2": after.get("agreement_2"), "heldout": json.dumps(result.heldout)}
    save_eagle(head, out, meta)
    stage2 = result.heldout.get("stage_2_starts_at_step")
    title = "EAGLE head: smooth-L1 + {:g} x soft CE".format(settings["token_weight"])
    if stage2:
        title += f"\nstage 2 from step {stage2}: training-time test, mean over {settings['unroll']} steps"
    save_curve(result, out.with_name(out.stem + "-loss"), title, ylabel="loss")
