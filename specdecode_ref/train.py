"""Train the drafters on the target's own answers, reproducibly, on a laptop CPU.

One command per step, each with a progress bar, a fixed seed, a loss curve and safetensors written
into ``specdecode_ref/weights/``::

    python -m specdecode_ref.train data        # self-distillation corpus (distill.py), ~10 min
    python -m specdecode_ref.train draft       # 4-layer draft model (notebook 05), ~20 min
    python -m specdecode_ref.train early-exit  # exit adapters for self-speculation (notebook 06)

The target stays frozen. Every drafter minimises the soft cross-entropy against the target's top-k
next-token distribution (KL up to a constant), not only its argmax, so the same weights serve greedy
and sampled decoding. Training runs in bf16 autocast with fp32 master weights.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from . import distill
from .distill import Corpus

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"


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
        result.losses.append(float(loss))
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
    from .proposers.draft_model import DEFAULT_INIT_LAYERS, build_draft_model

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
    from .proposers.early_exit import causal_mask

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
    from .proposers.early_exit import build_adapter

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

def save_curve(result: TrainResult, path: Path, title: str) -> None:
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
    ax.set_xlabel("step")
    ax.set_ylabel("soft cross-entropy (nats)")
    ax.set_title(title, fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=80)
    plt.close(fig)


def _load_target(dtype="fp32"):
    from .models import load_model

    return load_model(dtype=dtype)


def cmd_data(args) -> None:
    from .workloads import training_conversations

    target, tok = _load_target("bf16")
    convs = training_conversations()
    if args.limit:
        convs = convs[: args.limit]
    corpus = distill.build_corpus(target, tok, convs, max_new_tokens=args.max_new_tokens,
                                  batch_size=args.batch_size, seed=args.seed)
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
    from .draft_vocab import frequent_tokens, save_vocab
    from .proposers.draft_model import DRAFT_VOCAB, DRAFT_WEIGHTS, save_draft

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
    save_vocab(vocab, DRAFT_VOCAB, {"size": len(vocab), "source": "answer-token counts of the distillation corpus"})
    print(json.dumps(result.heldout, indent=1))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) and {DRAFT_VOCAB.name}")


def cmd_early_exit(args) -> None:
    from .proposers.early_exit import EXIT_WEIGHTS, save_adapters

    train, hold = _corpus(args)
    target, _ = _load_target("fp32")
    exits = [int(x) for x in args.exits.split(",")]
    adapters, result = train_early_exit(target, train, exits=exits, steps=args.steps, lr=args.lr,
                                        batch_tokens=args.batch_tokens, seed=args.seed, holdout=hold)
    out = Path(args.out or EXIT_WEIGHTS)
    ship = [int(x) for x in args.ship.split(",")] if args.ship else exits
    save_adapters({L: adapters[L] for L in ship}, out,
                  {"steps": args.steps, "lr": args.lr, "seed": args.seed, "seconds": round(result.seconds),
                   "heldout": json.dumps(result.heldout), "trained_exits": json.dumps(exits)})
    save_curve(result, out.with_name(out.stem + "-loss"),
               f"exit adapters {exits}: summed loss ({args.steps} steps)")
    print(json.dumps(result.heldout, indent=1))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) with exits {ship}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specdecode_ref.train", description=__doc__.split("\n")[0])
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
            p.add_argument("--ship", default="", help="exit layers to write (default: all trained)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    {"data": cmd_data, "draft": cmd_draft, "early-exit": cmd_early_exit}[args.cmd](args)


if __name__ == "__main__":
    main()
