"""Train the drafters on the target's own answers, reproducibly, on a laptop CPU.

One command per step, each with a progress bar, a fixed seed, a loss curve and safetensors written
into ``specdecode_ref/weights/``::

    python -m specdecode_ref.training data        # self-distillation corpus (distill.py), ~10 min
    python -m specdecode_ref.training draft       # 4-layer draft model (notebook 05), ~20 min
    python -m specdecode_ref.training early-exit  # exit adapters for self-speculation (notebook 06)
    python -m specdecode_ref.training medusa      # Medusa heads on the corpus' hidden states (notebook 07)
    python -m specdecode_ref.training eagle       # EAGLE feature-drafting head (notebook 08)

The target stays frozen. Every drafter minimises the soft cross-entropy against the target's top-k
next-token distribution (KL up to a constant), not only its argmax, so the same weights serve greedy
and sampled decoding. Training runs in bf16 autocast with fp32 master weights.
"""
from __future__ import annotations

import argparse
import copy
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from . import distill
from .distill import Corpus

WEIGHTS_DIR = Path(__file__).resolve().parent.parent / "weights"


@dataclass
class TrainResult:
    """What a training run produced: losses per step, held-out figures, wall time."""

    losses: list = field(default_factory=list)
    agreement: list = field(default_factory=list)  # train top-1 agreement with the target per step
    heldout: dict = field(default_factory=dict)
    seconds: float = 0.0
    steps: int = 0

    def to_json(self) -> dict:
        return {"losses": [round(x, 5) for x in self.losses], "agreement": [round(x, 4) for x in self.agreement],
                "heldout": self.heldout, "seconds": round(self.seconds, 1), "steps": self.steps}


def _batches(corpus: Corpus, batch_tokens: int, steps: int, seed: int):
    """``steps`` batches, cycling over epochs in a seeded order."""
    g = torch.Generator().manual_seed(seed)
    n = 0
    while True:
        for idx in distill.iterate_batches(corpus, batch_tokens, g):
            if n == steps:
                return
            yield idx
            n += 1


def _autocast(device):
    dtype = torch.bfloat16
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def fit(params, loss_fn, corpus: Corpus, *, steps: int, lr: float = 5e-4, batch_tokens: int = 2048,
        seed: int = 0, warmup: int = 20, desc: str = "training", device="cpu") -> TrainResult:
    """The loop every drafter shares: AdamW, linear warm-up then cosine, gradient clipping.

    loss_fn(batch_indices) -> (loss, top-1 agreement) for one batch of sequences.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("nothing to train: no parameter requires grad")
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    result = TrainResult()
    t0 = time.perf_counter()
    bar = tqdm(total=steps, desc=desc, unit="step")
    for step, idx in enumerate(_batches(corpus, batch_tokens, steps, seed)):
        for group in opt.param_groups:
            group["lr"] = distill.cosine_lr(step, steps, lr, warmup)
        with _autocast(device):
            loss, agree = loss_fn(idx)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        result.losses.append(float(loss.detach()))
        result.agreement.append(agree)
        bar.update(1)
        if distill.log_every(step + 1, steps):
            bar.set_postfix(loss=f"{sum(result.losses[-20:]) / len(result.losses[-20:]):.3f}",
                            agree=f"{sum(result.agreement[-20:]) / len(result.agreement[-20:]):.2f}")
    bar.close()
    result.seconds = time.perf_counter() - t0
    result.steps = steps
    return result


# ---- draft model ---------------------------------------------------------------------------------

def draft_loss_fn(draft, corpus: Corpus, device="cpu"):
    """Soft cross-entropy of the draft model at every answer position of a batch."""

    def loss_fn(idx):
        x, mask, rows, cols, t_ids, t_logp = distill.pad_batch(corpus, idx)
        h = draft.model(input_ids=x.to(device), attention_mask=mask.to(device)).last_hidden_state
        logits = draft.lm_head(h[rows, cols])
        return distill.soft_cross_entropy(logits, t_ids.to(device), t_logp.to(device)), \
            distill.agreement(logits.detach(), t_ids.to(device))

    return loss_fn


@torch.no_grad()
def evaluate(loss_fn, corpus: Corpus, batch_tokens: int = 2048, device="cpu") -> dict:
    """Held-out soft cross-entropy and top-1 agreement (token-weighted)."""
    total, agree, n = 0.0, 0.0, 0
    g = torch.Generator().manual_seed(0)
    for idx in distill.iterate_batches(corpus, batch_tokens, g):
        with _autocast(device):
            loss, a = loss_fn(idx)
        m = sum(corpus.ids[i].numel() - corpus.start[i] for i in idx)
        total += float(loss) * m
        agree += a * m
        n += m
    return {"loss": round(total / max(n, 1), 4), "agreement": round(agree / max(n, 1), 4), "tokens": n}


def train_draft(target, corpus: Corpus, *, init_layers=None, steps: int = 600, lr: float = 5e-4,
                batch_tokens: int = 2048, seed: int = 0, holdout: Corpus | None = None):
    """Distil a small draft model (copies of some target layers + the shared embeddings/head)."""
    from ..proposers.draft_model import DEFAULT_INIT_LAYERS, build_draft_model

    device = next(target.parameters()).device
    torch.manual_seed(seed)
    draft = build_draft_model(target, DEFAULT_INIT_LAYERS if init_layers is None else init_layers)
    draft.float().train()
    for name, p in draft.named_parameters():
        p.requires_grad_(not (name.startswith("model.embed_tokens") or name.startswith("lm_head")))
    loss_fn = draft_loss_fn(draft, corpus, device)
    before = evaluate(draft_loss_fn(draft, holdout, device), holdout) if holdout is not None else {}
    result = fit(draft.parameters(), loss_fn, corpus, steps=steps, lr=lr, batch_tokens=batch_tokens,
                 seed=seed, desc="draft model", device=device)
    draft.eval()
    if holdout is not None:
        result.heldout = {"before": before, "after": evaluate(draft_loss_fn(draft, holdout, device), holdout)}
    draft.requires_grad_(False)
    return draft, result


# ---- early-exit adapters ---------------------------------------------------------------------------

def exit_hidden_states(target, x, mask, exits):
    """The target's residual stream entering each exit layer (no grad: the target is frozen)."""
    with torch.no_grad():
        out = target.model(input_ids=x, attention_mask=mask, output_hidden_states=True)
    return {L: out.hidden_states[L] for L in exits}


def early_exit_loss_fn(target, adapters: dict, corpus: Corpus, device="cpu"):
    """Sum over exit layers of each adapter's soft cross-entropy; agreement of the deepest exit."""
    from ..proposers.early_exit import causal_mask

    exits = sorted(adapters)

    def loss_fn(idx):
        x, mask, rows, cols, t_ids, t_logp = distill.pad_batch(corpus, idx)
        x, mask = x.to(device), mask.to(device)
        hs = exit_hidden_states(target, x, mask, exits)
        pos = torch.arange(x.shape[1], device=device)[None].expand(x.shape[0], -1)
        attn = causal_mask(x.shape[1], 0, device)
        total, agree = 0.0, {}
        for L in exits:
            h = adapters[L](hs[L].float(), pos, attn, target)
            logits = target.lm_head(h[rows, cols])
            total = total + distill.soft_cross_entropy(logits, t_ids.to(device), t_logp.to(device))
            agree[L] = distill.agreement(logits.detach(), t_ids.to(device))
        return total, agree[exits[-1]]

    return loss_fn


def train_early_exit(target, corpus: Corpus, *, exits=(6, 10, 14), steps: int = 400, lr: float = 5e-4,
                     batch_tokens: int = 2048, seed: int = 0, holdout: Corpus | None = None):
    """Train one exit adapter per exit layer, jointly (one frozen target forward feeds them all)."""
    from ..proposers.early_exit import build_adapter

    device = next(target.parameters()).device
    torch.manual_seed(seed)
    adapters = {int(L): build_adapter(target, int(L)).float().train().requires_grad_(True) for L in exits}
    params = [p for a in adapters.values() for p in a.parameters()]
    result = fit(params, early_exit_loss_fn(target, adapters, corpus, device), corpus, steps=steps, lr=lr,
                 batch_tokens=batch_tokens, seed=seed, desc=f"exit adapters {list(adapters)}", device=device)
    for a in adapters.values():
        a.eval().requires_grad_(False)
    if holdout is not None:
        result.heldout = {str(L): evaluate(early_exit_loss_fn(target, {L: adapters[L]}, holdout, device), holdout)
                          for L in adapters}
    return adapters, result


# ---- files -------------------------------------------------------------------------------------------

def save_curve(result: TrainResult, path: Path, title: str, ylabel: str = "soft cross-entropy (nats)") -> None:
    """The loss curve as JSON (the numbers) and PNG (the picture)."""
    path.with_suffix(".json").write_text(json.dumps(result.to_json(), indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    w = max(1, len(result.losses) // 50)
    smooth = [sum(result.losses[max(0, i - w): i + 1]) / len(result.losses[max(0, i - w): i + 1])
              for i in range(len(result.losses))]
    ax.plot(result.losses, alpha=0.3, lw=0.8, label="per step")
    ax.plot(smooth, lw=1.8, label=f"moving mean ({w} steps)")
    if result.heldout.get("stage_2_starts_at_step"):
        ax.axvline(result.heldout["stage_2_starts_at_step"], color="k", ls=":", lw=1, label="stage 2 starts")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=80)
    plt.close(fig)


def _load_target(dtype="fp32"):
    from ..models import load_model

    return load_model(dtype=dtype)


def cmd_data(args) -> None:
    from ..measure.workloads import training_conversations

    target, tok = _load_target("bf16")
    convs = training_conversations()
    if args.limit:
        convs = convs[: args.limit]
    ckpt = Path(args.corpus).with_suffix(".answers")  # per-temperature answers, reused after an interruption
    corpus = distill.build_corpus(target, tok, convs, max_new_tokens=args.max_new_tokens,
                                  batch_size=args.batch_size, seed=args.seed, checkpoint_dir=ckpt)
    path = corpus.save(args.corpus)
    print(json.dumps(corpus.meta, indent=1))
    print(f"wrote {path}")


def _corpus(args):
    corpus = Corpus.load(args.corpus)
    train, hold = corpus.split(0.03, seed=0)
    print(f"corpus: {len(train)} train / {len(hold)} held-out sequences, "
          f"{train.num_response_tokens} answer tokens to learn from")
    return train, hold


def cmd_draft(args) -> None:
    from ..proposers.vocab import frequent_tokens, save_vocab
    from ..proposers.draft_model import DRAFT_VOCAB, DRAFT_WEIGHTS, save_draft

    train, hold = _corpus(args)
    target, tok = _load_target("fp32")
    draft, result = train_draft(target, train, steps=args.steps, lr=args.lr, batch_tokens=args.batch_tokens,
                                seed=args.seed, holdout=hold)
    out = Path(args.out or DRAFT_WEIGHTS)
    meta = {"steps": args.steps, "lr": args.lr, "seed": args.seed, "seconds": round(result.seconds),
            "heldout_agreement": result.heldout["after"]["agreement"],
            "heldout_agreement_before": result.heldout["before"]["agreement"]}
    save_draft(draft, out, meta)
    save_curve(result, out.with_name(out.stem + "-loss"), f"draft model distillation ({args.steps} steps)")
    # The frequency-ranked draft vocabulary, from the same corpus (answer tokens only).
    eos = [t for t in {tok.eos_token_id, tok.pad_token_id} if t is not None]
    vocab = frequent_tokens(distill.token_counts(train, target.config.vocab_size), args.vocab_size, always=eos)
    # Beside the weights: --out X must not overwrite the shipped vocabulary.
    vocab_path = DRAFT_VOCAB if args.out is None else out.with_name(out.stem + "-vocab.safetensors")
    save_vocab(vocab, vocab_path, {"size": len(vocab), "source": "answer-token counts of the distillation corpus"})
    print(json.dumps(result.heldout, indent=1))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) and {vocab_path.name}")


def best_exit(heldout: dict, num_layers: int, k_max: int = 8) -> int:
    """The exit layer to ship (the 50 MB budget holds one adapter): the best predicted speedup,
    taking alpha = held-out top-1 agreement and c = (L + 1) / num_layers (L target layers plus the
    adapter's one; the reduced-vocabulary projection is small), each at its best k."""
    from ..analysis import expected_speedup

    def score(L):
        a = min(heldout[str(L)]["agreement"], 0.99)
        c = (L + 1) / num_layers
        return max(expected_speedup(a, k, c) for k in range(1, k_max + 1))

    return max((int(L) for L in heldout), key=score)


def cmd_early_exit(args) -> None:
    from ..proposers.early_exit import EXIT_WEIGHTS, save_adapters

    train, hold = _corpus(args)
    target, _ = _load_target("fp32")
    exits = [int(x) for x in args.exits.split(",")]
    adapters, result = train_early_exit(target, train, exits=exits, steps=args.steps, lr=args.lr,
                                        batch_tokens=args.batch_tokens, seed=args.seed, holdout=hold)
    out = Path(args.out or EXIT_WEIGHTS)
    if args.ship == "auto":
        ship = [best_exit(result.heldout, target.config.num_hidden_layers)]
    else:
        ship = [int(x) for x in args.ship.split(",")] if args.ship else exits
    save_adapters({L: adapters[L] for L in ship}, out,
                  {"steps": args.steps, "lr": args.lr, "seed": args.seed, "seconds": round(result.seconds),
                   "heldout": json.dumps(result.heldout), "trained_exits": json.dumps(exits)})
    save_curve(result, out.with_name(out.stem + "-loss"),
               f"exit adapters {exits}: summed loss ({args.steps} steps)")
    print(json.dumps(result.heldout, indent=1))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) with exits {ship}")


# ---- Medusa heads (Medusa-1: the target frozen) -------------------------------------------------------

def medusa_batch(corpus: Corpus, idx: list, num_heads: int, device="cpu"):
    """Features and labels for Medusa heads, read from the corpus' stored hidden states (no target
    forward: this is why Medusa-1 trains cheaply).

    Rows: every position t from start-1 (the last prompt token) to T-3 of each sequence -- the
    positions whose feature a proposer reads at decode time. labels[:, i] = ids[t + 2 + i], the
    token head i predicts (an answer token, since t + 2 + i >= start + 1), or -100 past the end.
    Returns (features [M, H] float, labels [M, num_heads] long).
    """
    if corpus.hidden is None:
        raise ValueError("the corpus has no hidden states: build it with teacher_pass(..., keep_hidden=True)")
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
        with _autocast(device):
            feats = heads(x)
        for j in range(nh):
            ok = y[:, j] >= 0
            if not bool(ok.any()):
                continue
            with _autocast(device):
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


def train_medusa(target, corpus: Corpus, *, num_heads: int = 3, num_layers: int = 1, steps: int = 600,
                 lr: float = 1e-3, batch_tokens: int = 2048, seed: int = 0, holdout: Corpus | None = None):
    """Train Medusa heads on the corpus' stored last hidden states (the target stays frozen and is
    never run: only its lm_head is read). Returns (heads, TrainResult); with ``holdout``,
    ``result.heldout = {"before": ..., "after": ...}`` per-head accuracies (medusa_accuracy)."""
    from ..proposers.medusa import MedusaHeads

    if corpus.hidden is None:
        raise ValueError("the corpus has no hidden states: build it with teacher_pass(..., keep_hidden=True)")
    if corpus.hidden[0].shape[-1] != target.config.hidden_size:
        raise ValueError(f"the corpus' hidden states have size {corpus.hidden[0].shape[-1]}, the target "
                         f"{target.config.hidden_size}: they come from another model")
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


def cmd_medusa(args) -> None:
    from ..proposers.medusa import (DEFAULT_TREE_NODES, MEDUSA_WEIGHTS, derive_choices, expected_accepted,
                                   save_medusa_heads)

    train_c, hold = _corpus(args)
    target, _ = _load_target("fp32")
    heads, result = train_medusa(target, train_c, num_heads=args.heads, num_layers=args.layers, steps=args.steps,
                                 lr=args.lr, batch_tokens=args.batch_tokens, seed=args.seed, holdout=hold)
    after = result.heldout["after"]
    acc = after["rank_accuracy"]
    budgets = sorted({4, DEFAULT_TREE_NODES, 16, 32})
    derived = {b: derive_choices(acc, b) for b in budgets}
    out = Path(args.out or MEDUSA_WEIGHTS)
    meta = {"steps": args.steps, "lr": args.lr, "seed": args.seed, "seconds": round(result.seconds),
            "rank_accuracy": acc, "top1": after["top1"], "top5": after["top5"],
            "top1_before": result.heldout["before"]["top1"], "heldout_loss": after["loss"],
            "choices": derived[DEFAULT_TREE_NODES]}
    save_medusa_heads(heads, out, meta, target)
    save_curve(result, out.with_name(out.stem + "-loss"),
               f"Medusa heads ({args.heads}): summed cross-entropy ({args.steps} steps)")
    choices_path = out.with_name(out.stem + "-choices.json")
    choices_path.write_text(json.dumps(
        {str(b): {"choices": c, "expected_accepted": round(expected_accepted(acc, c), 4)} for b, c in derived.items()},
        indent=1))
    print(json.dumps({"top1": after["top1"], "top5": after["top5"], "before_top1": meta["top1_before"]}, indent=1))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB), its loss curve and {choices_path.name}")


def _add_medusa_parser(sub) -> None:
    p = sub.add_parser("medusa", help="train Medusa heads on the corpus' hidden states (target frozen)")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--heads", type=int, default=3, help="number of Medusa heads (head i predicts i+2 ahead)")
    p.add_argument("--layers", type=int, default=1, help="ResBlocks per head")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--out", default=None, help="weights file (default: the shipped one)")


# ---- EAGLE head (feature-level drafting; the target frozen) ------------------------------------------

def eagle_batch(corpus: Corpus, idx: list, device="cpu"):
    """Teacher-forcing tensors for the EAGLE head, read from the corpus alone (no target forward).

    For every sequence and t = 0..T-2 (prompt included): input feature f_t = hidden[t], input token
    x_{t+1}, target feature f_{t+1} = hidden[t+1]. Right-padded to [B, W-1]; ``valid`` marks real
    positions. Answer targets: ``rows``, ``cols`` index the head output f̂_{t+1} whose lm_head must
    match the target's top-k distribution (``t_ids``, ``t_logp``) for the answer token x_{t+2}.
    """
    if corpus.hidden is None:
        raise ValueError("the corpus has no hidden states: build it with teacher_pass(..., keep_hidden=True)")
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


def unrolled_mask(q: int, step: int, device=None) -> torch.Tensor:
    """Boolean [1, 1, q-step+1, keys] for unroll ``step`` >= 2 of training-time test (EAGLE-3's idea).

    Keys are step 1's q entries (real inputs, positions 0..q-1) followed by the entries of steps
    2..step, step s holding q-s+1 entries (index j at position j+s-1). Query j of this step sits at
    position j+step-1, as the head's (step)-th drafted token does at inference: it sees the real
    entries at positions 0..j and, from every unrolled step, its own chain's entry, index j.
    """
    rows = q - step + 1
    j = torch.arange(rows, device=device)[:, None]
    blocks = [torch.arange(q, device=device)[None] <= j]
    for s in range(2, step + 1):
        blocks.append(torch.arange(q - s + 1, device=device)[None] == j)
    return torch.cat(blocks, dim=1)[None, None]


def eagle_loss_fn(target, head, corpus: Corpus, device="cpu", feature_weight: float = 1.0,
                  token_weight: float = 0.1, parts: dict | None = None, unroll: int = 1):
    """EAGLE's loss: feature_weight * smooth-L1(f̂_{t+1}, f_{t+1}) over all positions + token_weight *
    soft cross-entropy of lm_head(f̂_{t+1}) against the target's top-k at answer positions.
    Agreement: top-1 of lm_head(f̂) vs the target's argmax. ``parts`` (a dict) receives both terms,
    and with unroll > 1 the agreement of every step (``agreement_1``, ``agreement_2``, ...).

    unroll > 1 is training-time test: step s feeds the head its own step-(s-1) outputs in place of
    the real features, as drafting token s does at inference, and adds that step's loss (an average
    over the steps). Teacher forcing alone never shows the head its own errors, so its later draft
    positions fall off; this trains it for them. Each extra step costs one more head forward.
    """
    from transformers import DynamicCache

    from ..proposers.early_exit import causal_mask

    if unroll < 1:
        raise ValueError(f"unroll must be >= 1, got {unroll}")

    def loss_fn(idx):
        f_in, tok, f_next, valid, rows, cols, t_ids, t_logp = eagle_batch(corpus, idx, device)
        q = f_in.shape[1]
        pos = torch.arange(q, device=device)[None].expand(f_in.shape[0], -1)
        cache = DynamicCache() if unroll > 1 else None
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
            logits = target.lm_head(out[rows[keep], cols[keep] - (s - 1)])
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
def evaluate_eagle(target, head, corpus: Corpus, batch_tokens: int = 2048, device="cpu",
                   feature_weight: float = 1.0, token_weight: float = 0.1, unroll: int = 2) -> dict:
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
        with _autocast(device):
            _, a = loss_fn(idx)
        values = {"loss": feature_weight * parts["feature"] + token_weight * parts["token"],
                  "feature_loss": parts["feature"], "token_loss": parts["token"], "agreement": a}
        values.update({f"agreement_{s}": parts.get(f"agreement_{s}", 0.0) for s in range(2, unroll + 1)})
        m = sum(corpus.ids[i].numel() - corpus.start[i] for i in idx)
        for key, v in values.items():
            sums[key] += v * m
        n += m
    return {**{k: round(v / max(n, 1), 4) for k, v in sums.items()}, "tokens": n}


def train_eagle(target, corpus: Corpus, *, steps: int = 600, lr: float = 5e-4, batch_tokens: int = 2048,
                seed: int = 0, holdout: Corpus | None = None, feature_weight: float = 1.0,
                token_weight: float = 0.1, unroll: int = 1, init=None):
    """Train an EAGLE head by teacher forcing on the corpus' stored features (the target is never run:
    only its embeddings and lm_head are read, frozen). Returns (head, TrainResult); with ``holdout``,
    ``result.heldout = {"before": ..., "after": ...}`` (evaluate_eagle). unroll: training-time test
    steps (eagle_loss_fn). init: an EagleHead (or weights file) to start from instead of the copy of
    the target's last layer, e.g. to fine-tune a teacher-forced head with unroll > 1."""
    from ..proposers.eagle import build_eagle_head

    if corpus.hidden is None:
        raise ValueError("the corpus has no hidden states: build it with teacher_pass(..., keep_hidden=True)")
    if corpus.hidden[0].shape[-1] != target.config.hidden_size:
        raise ValueError(f"the corpus' hidden states have size {corpus.hidden[0].shape[-1]}, the target "
                         f"{target.config.hidden_size}: they come from another model")
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


def combine_stages(first: TrainResult, second: TrainResult) -> TrainResult:
    """One record for a two-stage run: curves end to end, held-out figures before, between, after."""
    out = TrainResult(losses=first.losses + second.losses, agreement=first.agreement + second.agreement,
                      seconds=first.seconds + second.seconds, steps=first.steps + second.steps)
    out.heldout = {"before": first.heldout.get("before", {}), "after_stage_1": second.heldout.get("before", {}),
                   "after": second.heldout.get("after", {}), "stage_2_starts_at_step": first.steps}
    return out


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


def cmd_eagle(args) -> None:
    """Stage 1: teacher forcing from the copy of the target's last layer (or --init). Stage 2 (when
    --unroll > 1 and --unroll-steps > 0): training-time test, fine-tuning the stage-1 head on its own
    outputs. The shipped head is both stages with the defaults."""
    from ..proposers.eagle import EAGLE_WEIGHTS

    train_c, hold = _corpus(args)
    target, _ = _load_target("fp32")
    common = dict(batch_tokens=args.batch_tokens, seed=args.seed, holdout=hold, feature_weight=args.feature_weight,
                  token_weight=args.token_weight)
    head, result = train_eagle(target, train_c, steps=args.steps, lr=args.lr, init=args.init, **common)
    settings = {"steps": args.steps, "lr": args.lr, "seed": args.seed, "feature_weight": args.feature_weight,
                "token_weight": args.token_weight, "unroll": 1,
                "init": Path(args.init).name if args.init else "target's last layer"}
    if args.unroll > 1 and args.unroll_steps > 0:
        # The same bf16 rounding a saved stage-1 file has, so a stage 2 run with --init on that file
        # starts from the very same weights.
        start = copy.deepcopy(head).to(torch.bfloat16).float()
        head, second = train_eagle(target, train_c, steps=args.unroll_steps, lr=args.unroll_lr, init=start,
                                   unroll=args.unroll, **common)
        result = combine_stages(result, second)
        settings.update(unroll=args.unroll, unroll_steps=args.unroll_steps, unroll_lr=args.unroll_lr)
    out = Path(args.out or EAGLE_WEIGHTS)
    write_eagle(head, result, out, settings)
    print(json.dumps(result.heldout, indent=1))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) and its loss curve")


def _add_eagle_parser(sub) -> None:
    p = sub.add_parser("eagle", help="train the EAGLE head on the corpus' features (target frozen)")
    p.add_argument("--steps", type=int, default=2400, help="stage 1, teacher forcing (default: %(default)s)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--feature-weight", type=float, default=1.0, help="weight of the smooth-L1 feature loss")
    p.add_argument("--token-weight", type=float, default=1.0,
                   help="weight of the soft cross-entropy (EAGLE's paper: 0.1; 1.0 measured better here)")
    p.add_argument("--unroll", type=int, default=3,
                   help="stage 2, training-time test: steps in which the head feeds on its own outputs "
                        "(1 = no stage 2)")
    p.add_argument("--unroll-steps", type=int, default=500, help="stage 2 steps (default: %(default)s)")
    p.add_argument("--unroll-lr", type=float, default=3e-4)
    p.add_argument("--init", default=None, help="EAGLE weights file to start from (default: the target's last layer)")
    p.add_argument("--out", default=None, help="weights file (default: the shipped one)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specdecode_ref.training", description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", default=str(distill.default_corpus_path()), help="distillation corpus file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("data", help="generate the self-distillation corpus")
    p.add_argument("--max-new-tokens", type=int, default=160)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--limit", type=int, default=0, help="use only the first N training prompts")
    for name, steps in (("draft", 700), ("early-exit", 450)):
        p = sub.add_parser(name, help=f"train the {name} drafter")
        p.add_argument("--steps", type=int, default=steps)
        p.add_argument("--lr", type=float, default=5e-4)
        p.add_argument("--batch-tokens", type=int, default=2048)
        p.add_argument("--out", default=None, help="weights file (default: the shipped one)")
        if name == "draft":
            p.add_argument("--vocab-size", type=int, default=8192)
        else:
            p.add_argument("--exits", default="6,10,14", help="exit layers to train, comma-separated")
            p.add_argument("--ship", default="auto",
                           help="exit layers to write, comma-separated, or 'auto' (default): the one with "
                                "the best predicted speedup, since the weight budget holds one adapter")
    _add_medusa_parser(sub)
    _add_eagle_parser(sub)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    {"data": cmd_data, "draft": cmd_draft, "early-exit": cmd_early_exit, "medusa": cmd_medusa,
     "eagle": cmd_eagle}[args.cmd](args)


if __name__ == "__main__":
    main()
