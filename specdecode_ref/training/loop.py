"""The training loop every drafter shares, its held-out evaluation, and its record.

AdamW with a linear warm-up then a cosine decay, gradient clipping at 1, bf16 autocast (where the
hardware computes bf16 natively) with fp32 master weights; batches cycle over the corpus in a seeded
order. A family supplies only its
``loss_fn(batch_indices) -> (loss, top-1 agreement)``.
"""
from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..models import cpu_supports_bf16
from . import distill
from .distill import Corpus


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


def autocast(device):
    """bf16 autocast on ``device``: training keeps fp32 master weights.

    On a CPU without native bf16 (no AVX512-BF16 or AMX) bf16 matmuls are emulated and many times
    slower than fp32, so there the context is a no-op and the step runs in fp32."""
    device = torch.device(device)
    if device.type == "cpu" and not cpu_supports_bf16():
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def fit(params, loss_fn, corpus: Corpus, *, steps: int, lr: float, batch_tokens: int = 2048,
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
        with autocast(device):
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


@torch.no_grad()
def evaluate(loss_fn, corpus: Corpus, batch_tokens: int = 2048, device="cpu") -> dict:
    """Held-out soft cross-entropy and top-1 agreement (token-weighted)."""
    total, agree, n = 0.0, 0.0, 0
    g = torch.Generator().manual_seed(0)
    for idx in distill.iterate_batches(corpus, batch_tokens, g):
        with autocast(device):
            loss, a = loss_fn(idx)
        m = sum(corpus.ids[i].numel() - corpus.start[i] for i in idx)
        total += float(loss) * m
        agree += a * m
        n += m
    return {"loss": round(total / max(n, 1), 4), "agreement": round(agree / max(n, 1), 4), "tokens": n}


def require_features(corpus: Corpus, target=None) -> None:
    """Medusa and EAGLE learn from the target's stored hidden states: the corpus must hold them,
    and (given ``target``) from that very model."""
    if corpus.hidden is None:
        raise ValueError("the corpus has no hidden states: build it with teacher_pass(..., keep_hidden=True)")
    if target is not None and corpus.hidden[0].shape[-1] != target.config.hidden_size:
        raise ValueError(f"the corpus' hidden states have size {corpus.hidden[0].shape[-1]}, the target "
                         f"{target.config.hidden_size}: they come from another model")


def combine_stages(first: TrainResult, second: TrainResult) -> TrainResult:
    """One record for a two-stage run: curves end to end, held-out figures before, between, after."""
    out = TrainResult(losses=first.losses + second.losses, agreement=first.agreement + second.agreement,
                      seconds=first.seconds + second.seconds, steps=first.steps + second.steps)
    out.heldout = {"before": first.heldout.get("before", {}), "after_stage_1": second.heldout.get("before", {}),
                   "after": second.heldout.get("after", {}), "stage_2_starts_at_step": first.steps}
    return out


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
