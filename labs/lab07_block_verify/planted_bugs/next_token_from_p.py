"""Planted bug: the token after the kept prefix is drawn from p there instead of that prefix's
residual max(w p - q, 0): tokens the draft proposes come out too often (kept as drafts *and*
drawn again).

caught by: test_papers_two_token_example, test_joint_law_follows_target, test_lossless_in_every_case
at most: 60 %
"""
from __future__ import annotations

import torch

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution, one function replaced below


@patch
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
    dist = p[rows, n]  # BUG: should be the prefix's residual
    cdf = torch.cumsum(dist, dim=-1)
    target = (1.0 - u[:, K + 1:]) * cdf[:, -1:]  # in (0, total]: never a zero-probability token
    nxt = torch.searchsorted(cdf, target)[:, 0].clamp(max=V - 1)

    tokens = torch.full((B, K + 1), -1, dtype=torch.long)
    keep = torch.arange(K)[None, :] < n[:, None]
    tokens[:, :K] = torch.where(keep, draft_tokens, torch.full_like(draft_tokens, -1))
    tokens[rows, n] = nxt
    return tokens, n
