"""Training exit adapters for self-speculation (notebook 06): one adapter per exit layer, all fed
by one frozen target forward, each learning to turn its layer's residual stream into the target's
next-token distribution; :func:`best_exit` picks the one to ship."""
from __future__ import annotations

import torch

from .. import decoder
from ..masks import causal_mask
from . import distill
from .distill import Corpus
from .loop import evaluate, fit
from .recipes import EARLY_EXIT


def exit_hidden_states(target, x, mask, exits):
    """The target's residual stream entering each exit layer (no grad: the target is frozen)."""
    with torch.no_grad():
        states = decoder.residual_streams(target, x, mask)
    return {L: states[L] for L in exits}


def early_exit_loss_fn(target, adapters: dict, corpus: Corpus, device="cpu"):
    """Sum over exit layers of each adapter's soft cross-entropy; agreement of the deepest exit."""
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
            logits = decoder.lm_head(target, h[rows, cols])
            total = total + distill.soft_cross_entropy(logits, t_ids.to(device), t_logp.to(device))
            agree[L] = distill.agreement(logits.detach(), t_ids.to(device))
        return total, agree[exits[-1]]

    return loss_fn


def train_early_exit(target, corpus: Corpus, *, exits=EARLY_EXIT.exits, steps: int = EARLY_EXIT.steps,
                     lr: float = EARLY_EXIT.lr, batch_tokens: int = EARLY_EXIT.batch_tokens,
                     seed: int = EARLY_EXIT.seed, holdout: Corpus | None = None):
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


def best_exit(heldout: dict, num_layers: int, k_max: int = 8) -> int:
    """The exit layer to ship (the 60 MB budget holds one adapter): the best predicted speedup,
    taking alpha = held-out top-1 agreement and c = (L + 1) / num_layers (L target layers plus the
    adapter's one; the reduced-vocabulary projection is small), each at its best k."""
    from ..analysis import expected_speedup

    def score(L):
        a = min(heldout[str(L)]["agreement"], 0.99)
        c = (L + 1) / num_layers
        return max(expected_speedup(a, k, c) for k in range(1, k_max + 1))

    return max((int(L) for L in heldout), key=score)
