"""Training the EAGLE head (notebook 08) by teacher forcing on the corpus' stored features, then
(stage 2) by training-time test on its own outputs; the target is never run, only its embeddings
and lm_head are read, frozen.

Two heads (proposers/eagle.py): EAGLE-1's reads the final normed state (``Corpus.hidden``) and is
trained on feature regression plus tokens; EAGLE-3's fused head reads the low/middle/high states
(``Corpus.fused``) and is trained on tokens alone, over its reduced draft vocabulary when it has one:
as EAGLE-3 does, positions whose target argmax lies outside that vocabulary are left out of the loss
(no draft can match them) and the target's distribution is renormalised over the vocabulary.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from .. import decoder, kv
from ..masks import causal_mask, unrolled_mask
from ..proposers.vocab import VocabHead
from . import distill
from .distill import Corpus
from .loop import TrainResult, autocast, fit, require_features, save_curve
from .recipes import EAGLE


def require_fused(corpus: Corpus, layers=None) -> None:
    """The fused head learns from ``Corpus.fused``, which must hold the layers it reads."""
    if corpus.fused is None:
        raise ValueError("the corpus has no fused features: add them with "
                         "`python -m specdecode_ref.training fused-features` (teacher_pass(..., fused_layers=...))")
    have = tuple(corpus.meta.get("fused_layers", ()))
    if layers is not None and tuple(layers) != have:
        raise ValueError(f"the head reads layers {tuple(layers)}, the corpus' fused features are layers {have}")


def eagle_batch(corpus: Corpus, idx: list, device="cpu", features: str = "final"):
    """Teacher-forcing tensors for the EAGLE head, read from the corpus alone (no target forward).

    For every sequence and t = 0..T-2 (prompt included): input feature f_t = hidden[t] (features="fused":
    the fused feature fused[t], [3H]), input token x_{t+1}, target feature f_{t+1} = hidden[t+1] (None
    for "fused": no feature loss). Right-padded to [B, W-1]; ``valid`` marks real positions. Answer
    targets: ``rows``, ``cols`` index the head output f̂_{t+1} whose lm_head must match the target's
    top-k distribution (``t_ids``, ``t_logp``) for the answer token x_{t+2}.
    """
    if features == "fused":
        require_fused(corpus)
        source = corpus.fused
    else:
        require_features(corpus)
        source = corpus.hidden
    x, _, rows, cols, t_ids, t_logp = distill.pad_batch(corpus, idx)
    B, W = x.shape
    H = source[idx[0]].shape[-1]
    hidden = torch.zeros(B, W, H)
    valid = torch.zeros(B, W - 1, dtype=torch.bool)
    for r, i in enumerate(idx):
        T = corpus.ids[i].numel()
        hidden[r, :T] = source[i].float()
        valid[r, : T - 1] = True
    # pad_batch's col c is where the target read the distribution of token c+1: hidden[c], which the
    # head predicts at output index c-1 (from input f_{c-1}, x_c). c = 0 has no head input before it.
    keep = cols >= 1
    rows, cols, t_ids, t_logp = rows[keep], cols[keep] - 1, t_ids[keep], t_logp[keep]
    to = lambda t: t.to(device)  # noqa: E731
    f_next = None if features == "fused" else to(hidden[:, 1:])
    return (to(hidden[:, :-1]), to(x[:, 1:]), f_next, to(valid), to(rows), to(cols), to(t_ids), to(t_logp))


def draft_vocab_targets(t_ids: torch.Tensor, t_logp: torch.Tensor, vocab: VocabHead):
    """The target's top-k (ids [n, K], log-probs [n, K]) seen from a reduced draft vocabulary:
    ``(index [m, K], logp [m, K], keep [n])`` -- positions whose target argmax is in the vocabulary
    (``keep``), their top-k as indices into it (0 where outside) with log-probability -inf outside,
    so the soft cross-entropy renormalises the target over the vocabulary. The full vocabulary
    (``vocab.ids`` None) keeps everything as it is."""
    if vocab.ids is None:
        return t_ids, t_logp, torch.ones(t_ids.shape[0], dtype=torch.bool, device=t_ids.device)
    to_index = torch.full((vocab.full_size,), -1, dtype=torch.long, device=t_ids.device)
    to_index[vocab.ids.to(t_ids.device)] = torch.arange(vocab.size, device=t_ids.device)
    index = to_index[t_ids]
    inside = index >= 0
    keep = inside[:, 0]
    logp = t_logp.masked_fill(~inside, float("-inf"))
    return index.clamp_min(0)[keep], logp[keep], keep


def eagle_loss_fn(target, head, corpus: Corpus, device="cpu", feature_weight: float = EAGLE.feature_weight,
                  token_weight: float = EAGLE.token_weight, parts: dict | None = None, unroll: int = 1):
    """EAGLE's loss: feature_weight * smooth-L1(f̂_{t+1}, f_{t+1}) over all positions + token_weight *
    soft cross-entropy of lm_head(f̂_{t+1}) against the target's top-k at answer positions.
    Agreement: top-1 of lm_head(f̂) vs the target's argmax. ``parts`` (a dict) receives both terms,
    and with unroll > 1 the agreement of every step (``agreement_1``, ``agreement_2``, ...).

    A fused head (EAGLE-3) has no feature term (feature_weight is not used): token_weight * soft
    cross-entropy of lm_head(norm(h)) over its draft vocabulary (draft_vocab_targets); its agreement
    still counts every answer position, a target argmax outside the vocabulary as a miss.

    unroll > 1 is training-time test: step s feeds the head its own step-(s-1) outputs in place of
    the real features, as drafting token s does at inference, and adds that step's loss (an average
    over the steps). Teacher forcing alone never shows the head its own errors, so its later draft
    positions fall off; this trains it for them. Each extra step costs one more head forward.
    """
    if unroll < 1:
        raise ValueError(f"unroll must be >= 1, got {unroll}")
    fused = head.features == "fused"
    if fused:
        require_fused(corpus, head.feature_layers)
        feature_weight = 0.0
    vocab = VocabHead(target.get_output_embeddings().weight, head.draft_ids)

    def logits_of(out):
        if vocab.ids is None:  # the target's own lm_head, as EAGLE-1 always trained
            return decoder.lm_head(target, head.readout(out))
        return vocab.logits(head.readout(out))

    def loss_fn(idx):
        f_in, tok, f_next, valid, rows, cols, t_ids, t_logp = eagle_batch(corpus, idx, device, head.features)
        sub_ids, sub_logp, in_vocab = draft_vocab_targets(t_ids, t_logp, vocab)
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
            if fused:
                f_loss = torch.zeros((), device=out.device)
            else:
                ok = valid[:, s - 1:]
                f_loss = torch.nn.functional.smooth_l1_loss(out[ok].float(), f_next[:, s - 1:][ok])
            keep = cols >= s - 1
            logits = logits_of(out[rows[keep], cols[keep] - (s - 1)])
            agree = float((vocab.to_token(logits.detach().argmax(-1)) == t_ids[keep][:, 0]).float().mean())
            k_in = in_vocab[keep]  # positions whose target argmax the draft vocabulary holds
            sub_keep = keep[in_vocab]
            if bool(k_in.any()):
                t_loss = distill.soft_cross_entropy(logits[k_in], sub_ids[sub_keep], sub_logp[sub_keep])
            else:  # no target argmax in the draft vocabulary: nothing to learn from this batch
                t_loss = logits.sum() * 0.0
            total = total + feature_weight * f_loss + token_weight * t_loss
            if s == 1:
                agree_1 = agree
                if parts is not None:
                    parts["feature"], parts["token"] = float(f_loss), float(t_loss)
                    parts["in_vocab"] = float(in_vocab.float().mean())
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
    is the agreement when the head drafts from its own previous outputs (see ``unroll``). A fused head
    reports no feature loss, and a head with a draft vocabulary ``in_vocab``: the share of answer
    positions whose target argmax it holds (a ceiling on its agreement)."""
    parts: dict = {}
    # One unrolled pass gives every step; the reported loss is step 1's, rebuilt from its two parts.
    loss_fn = eagle_loss_fn(target, head, corpus, device, feature_weight, token_weight, parts, unroll=unroll)
    sums = {"loss": 0.0, "feature_loss": 0.0, "token_loss": 0.0, "agreement": 0.0, "in_vocab": 0.0}
    sums.update({f"agreement_{s}": 0.0 for s in range(2, unroll + 1)})
    n = 0
    g = torch.Generator().manual_seed(0)
    for idx in distill.iterate_batches(corpus, batch_tokens, g):
        with autocast(device):
            _, a = loss_fn(idx)
        values = {"loss": feature_weight * parts["feature"] + token_weight * parts["token"],
                  "feature_loss": parts["feature"], "token_loss": parts["token"], "agreement": a,
                  "in_vocab": parts["in_vocab"]}
        values.update({f"agreement_{s}": parts.get(f"agreement_{s}", 0.0) for s in range(2, unroll + 1)})
        m = sum(corpus.ids[i].numel() - corpus.start[i] for i in idx)
        for key, v in values.items():
            sums[key] += v * m
        n += m
    if head.features == "fused":
        del sums["feature_loss"]
    if head.draft_ids is None:
        del sums["in_vocab"]
    return {**{k: round(v / max(n, 1), 4) for k, v in sums.items()}, "tokens": n}


def train_eagle(target, corpus: Corpus, *, steps: int = EAGLE.steps, lr: float = EAGLE.lr,
                batch_tokens: int = EAGLE.batch_tokens, seed: int = EAGLE.seed, holdout: Corpus | None = None,
                feature_weight: float = EAGLE.feature_weight, token_weight: float = EAGLE.token_weight,
                unroll: int = 1, init=None, features: str = EAGLE.features, draft_vocab=None):
    """Train an EAGLE head by teacher forcing on the corpus' stored features (the target is never run:
    only its embeddings and lm_head are read, frozen). Returns (head, TrainResult); with ``holdout``,
    ``result.heldout = {"before": ..., "after": ...}`` (evaluate_eagle). unroll: training-time test
    steps (eagle_loss_fn). init: an EagleHead (or weights file) to start from instead of the copy of
    the target's last layer, e.g. to fine-tune a teacher-forced head with unroll > 1.

    features="fused": EAGLE-3's fused head on the corpus' fused layers (``Corpus.fused``), drafting
    over ``draft_vocab`` (LongTensor of ids, e.g. ``shipped_vocab()``; None: all), trained on tokens
    alone (feature_weight is not used). With ``init`` the head's own kind decides."""
    from ..proposers.eagle import build_eagle_head

    device = next(target.parameters()).device
    torch.manual_seed(seed)
    if init is None:
        if features == "fused":
            require_fused(corpus)
            head = build_eagle_head(target, "fused", corpus.meta["fused_layers"], draft_vocab)
        else:
            head = build_eagle_head(target, features, draft_vocab=draft_vocab)
    elif isinstance(init, torch.nn.Module):
        head = copy.deepcopy(init)
    else:
        from ..proposers.eagle import load_eagle_weights
        head = load_eagle_weights(target, init)
    if head.features == "fused":
        require_fused(corpus, head.feature_layers)
        if corpus.fused[0].shape[-1] != head.fuse.in_features:
            raise ValueError(f"the corpus' fused features have size {corpus.fused[0].shape[-1]}, the head reads "
                             f"{head.fuse.in_features}: they come from another model")
    else:
        require_features(corpus, target)
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
    fused = head.features == "fused"
    feature = (f"hidden states entering layers {list(head.feature_layers)}, fused" if fused
               else "final normed hidden state")
    meta = {**settings, "seconds": round(result.seconds), "feature": feature,
            "heldout_agreement": after["agreement"], "heldout_agreement_before": before["agreement"],
            "heldout_agreement_2": after.get("agreement_2"), "heldout": json.dumps(result.heldout)}
    save_eagle(head, out, meta)
    stage2 = result.heldout.get("stage_2_starts_at_step")
    if fused:
        vocab = "full vocabulary" if head.draft_ids is None else f"{head.draft_ids.numel()}-token draft vocabulary"
        title = f"EAGLE-3 fused head: soft CE over the {vocab}"
    else:
        title = "EAGLE head: smooth-L1 + {:g} x soft CE".format(settings["token_weight"])
    if stage2:
        title += f"\nstage 2 from step {stage2}: training-time test, mean over {settings['unroll']} steps"
    save_curve(result, out.with_name(out.stem + "-loss"), title, ylabel="loss")
