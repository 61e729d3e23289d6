"""Mutant: the padded slots (-1) are replaced by token 0 for the lookups but not masked out of the
acceptance test, so a pad can be accepted (and -1 emitted as a token).

caught by: test_padding, test_rows_padded_differently, test_lossless_in_every_case
at most: 60 %
"""
from __future__ import annotations

import torch

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def rejection_sample(target_probs, draft_tokens, draft_probs=None, generator=None):
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
    tok = torch.where(valid, draft_tokens, torch.zeros_like(draft_tokens))
    if draft_probs is None:
        q = torch.nn.functional.one_hot(tok, V).float()
    else:
        q = draft_probs.float()
    q = q * valid[..., None]  # a padded slot drafted nothing: q = 0 there

    # One uniform per draft position plus one for the extra token, drawn by inverse CDF.
    u_all = torch.rand(B, K + 1, generator=generator)
    u = u_all[:, :K]
    p_tok = torch.gather(p[:, :K], 2, tok[..., None])[..., 0]
    q_tok = torch.gather(q, 2, tok[..., None])[..., 0]
    n = accepted_length(accept_mask(p_tok, q_tok, u))  # BUG: pads take part in the test

    rows = torch.arange(B)
    p_next = p[rows, n]
    q_next = torch.zeros_like(p_next)
    rejected = n < K
    q_next[rejected] = q[rows[rejected], n[rejected]]
    cdf = torch.cumsum(residual_distribution(p_next, q_next), dim=-1)
    target = (1.0 - u_all[:, K:]) * cdf[:, -1:]  # in (0, total]: never lands on a zero-probability token
    nxt = torch.searchsorted(cdf, target)[:, 0].clamp(max=V - 1)

    tokens = torch.full((B, K + 1), -1, dtype=torch.long)
    keep = torch.arange(K)[None, :] < n[:, None]
    tokens[:, :K] = torch.where(keep, draft_tokens, torch.full_like(draft_tokens, -1))
    tokens[rows, n] = nxt
    return tokens, n
