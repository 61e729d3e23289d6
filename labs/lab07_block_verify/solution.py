"""Lab 7 — a worked solution, written the way a student would (for instructors).

It draws its random numbers differently from the reference package (one uniform per prefix and
one for the extra token, which it turns into a token by inverse CDF), which is the point: the
grading tests check distributions, not one particular stream of random numbers.
"""
from __future__ import annotations

import torch


def prefix_weights(ratio, valid):
    B, K = ratio.shape
    w = torch.ones(B, K + 1)
    for i in range(K):
        # carry the weight: clamp the running product, not each ratio on its own
        w[:, i + 1] = torch.clamp(w[:, i] * ratio[:, i], max=1.0) * valid[:, i]
    return w


def stop_probabilities(residual_mass, w):
    denom = residual_mass + 1.0 - w
    ok = denom > 1e-12
    safe = torch.where(ok, denom, torch.ones_like(denom))
    return torch.where(ok, residual_mass / safe, torch.zeros_like(denom))


def prefix_residual(p, q, w):
    r = torch.clamp(w[..., None] * p - q, min=0.0)
    mass = r.sum(dim=-1, keepdim=True)
    ok = mass > 1e-12
    return torch.where(ok, r / torch.where(ok, mass, torch.ones_like(mass)), p)


def block_verify(target_probs, draft_tokens, draft_probs=None, generator=None):
    if target_probs.dim() != 3 or draft_tokens.dim() != 2:
        raise ValueError("target_probs must be [B, K+1, V] and draft_tokens [B, K]")
    B, K1, V = target_probs.shape
    K = K1 - 1
    if tuple(draft_tokens.shape) != (B, K):
        raise ValueError(f"draft_tokens {tuple(draft_tokens.shape)} should be {(B, K)}")
    if draft_probs is not None and tuple(draft_probs.shape) != (B, K, V):
        raise ValueError(f"draft_probs {tuple(draft_probs.shape)} should be {(B, K, V)}")

    p = target_probs.float()
    valid = draft_tokens >= 0
    n_valid = valid.long().sum(dim=1)
    tok = torch.where(valid, draft_tokens, torch.zeros_like(draft_tokens))
    if draft_probs is None:
        q = torch.nn.functional.one_hot(tok, V).float()
    else:
        q = draft_probs.float()
    q = q * valid[..., None]  # a padded slot drafted nothing

    p_tok = torch.gather(p[:, :K], 2, tok[..., None])[..., 0]
    q_tok = torch.gather(q, 2, tok[..., None])[..., 0]
    ratio = torch.where(q_tok > 0, p_tok / torch.where(q_tok > 0, q_tok, torch.ones_like(q_tok)),
                        torch.zeros_like(p_tok))
    w = prefix_weights(ratio, valid)  # [B, K+1]

    # q after the last draft is 0: the residual there is w_K * p_K
    q_after = torch.cat([q, torch.zeros(B, 1, V)], dim=1)
    mass = torch.clamp(w[..., None] * p - q_after, min=0.0).sum(dim=-1)  # [B, K+1]
    h = stop_probabilities(mass, w)

    # the backward scan of the paper: from the whole draft down to prefix 0, stop at the first pass
    u = torch.rand(B, K + 2, generator=generator)
    n = torch.zeros(B, dtype=torch.long)
    decided = torch.zeros(B, dtype=torch.bool)
    for i in range(K, 0, -1):
        stop = ~decided & (u[:, i] < h[:, i]) & (n_valid >= i)
        n[stop] = i
        decided |= stop
    # rows that kept nothing stay at n = 0

    rows = torch.arange(B)
    dist = prefix_residual(p[rows, n], q_after[rows, n], w[rows, n])
    cdf = torch.cumsum(dist, dim=-1)
    target = (1.0 - u[:, K + 1:]) * cdf[:, -1:]  # in (0, total]: never a zero-probability token
    nxt = torch.searchsorted(cdf, target)[:, 0].clamp(max=V - 1)

    tokens = torch.full((B, K + 1), -1, dtype=torch.long)
    keep = torch.arange(K)[None, :] < n[:, None]
    tokens[:, :K] = torch.where(keep, draft_tokens, torch.full_like(draft_tokens, -1))
    tokens[rows, n] = nxt
    return tokens, n
