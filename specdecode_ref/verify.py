"""Verification: decide which drafted tokens the target keeps, and which token it adds.

Both functions take a batch of drafts of K tokens and the target's scores at the K+1 positions
(the last committed token plus the K drafts) and return ``(tokens [B, K+1], num_accepted [B])``:
row b emits ``tokens[b, :num_accepted[b] + 1]`` (the accepted drafts, then the recovered or bonus
token) and the rest of the row is -1. Draft rows shorter than K may be padded with -1 (never
accepted; the token at that position is then sampled from the target alone).

Production counterparts: vLLM ``vllm/v1/sample/rejection_sampler.py``; transformers
``generation/utils.py`` (``_speculative_sampling``).
"""
from __future__ import annotations

import torch


def _check(scores: torch.Tensor, draft_tokens: torch.Tensor, name: str):
    if scores.dim() != 3:
        raise ValueError(f"{name} must be [B, K+1, V], got shape {tuple(scores.shape)}")
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be [B, K], got shape {tuple(draft_tokens.shape)}")
    b, k1, v = scores.shape
    if draft_tokens.shape != (b, k1 - 1):
        raise ValueError(
            f"draft_tokens {tuple(draft_tokens.shape)} does not match {name} {tuple(scores.shape)}: "
            "expected [B, K] with K+1 target positions")
    if draft_tokens.dtype != torch.long:
        raise ValueError(f"draft_tokens must be a LongTensor, got {draft_tokens.dtype}")
    if (draft_tokens >= v).any():
        raise ValueError(f"draft token id >= vocabulary size {v}: do draft and target share a vocabulary?")


def _accepted_length(accept: torch.Tensor) -> torch.Tensor:
    """Length of the all-True prefix of each row: [B, K] bool -> [B] long."""
    return torch.cumprod(accept.long(), dim=1).sum(dim=1)


def _assemble(draft_tokens, num_accepted, next_tokens):
    b, k = draft_tokens.shape
    pos = torch.arange(k + 1, device=draft_tokens.device).expand(b, k + 1)
    padded = torch.cat([draft_tokens, draft_tokens.new_full((b, 1), -1)], dim=1)
    out = torch.where(pos < num_accepted[:, None], padded, torch.full_like(padded, -1))
    out.scatter_(1, num_accepted[:, None], next_tokens[:, None])
    return out


def greedy_verify(target_logits: torch.Tensor, draft_tokens: torch.Tensor):
    """Accept drafts while they equal the target's argmax; then emit the target's argmax."""
    _check(target_logits, draft_tokens, "target_logits")
    argmax = target_logits.argmax(dim=-1)  # [B, K+1]
    num_accepted = _accepted_length(argmax[:, :-1] == draft_tokens)
    next_tokens = argmax.gather(1, num_accepted[:, None]).squeeze(1)
    return _assemble(draft_tokens, num_accepted, next_tokens), num_accepted


def rejection_sample(target_probs: torch.Tensor, draft_tokens: torch.Tensor,
                     draft_probs: torch.Tensor | None = None,
                     generator: torch.Generator | None = None):
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): output is distributed as p.

    Draft position i is accepted with probability min(1, p_i(x)/q_i(x)); at the first rejection the
    token is drawn from the residual max(p_i - q_i, 0) renormalised; if all K pass, a bonus token is
    drawn from p_K. ``draft_probs=None`` means a deterministic proposer (q one-hot on its token).
    All randomness comes from ``generator``: pass one per request and never reseed it per draw.
    """
    _check(target_probs, draft_tokens, "target_probs")
    b, k1, v = target_probs.shape
    k = k1 - 1
    p = target_probs.float()
    valid = draft_tokens >= 0
    safe_tokens = draft_tokens.clamp(min=0)
    p_draft = p[:, :k].gather(2, safe_tokens[..., None]).squeeze(-1)  # [B, K]
    if draft_probs is None:
        q_draft = torch.ones_like(p_draft)
    else:
        if draft_probs.shape != (b, k, v):
            raise ValueError(f"draft_probs must be [B, K, V] = {(b, k, v)}, got {tuple(draft_probs.shape)}")
        q_draft = draft_probs.float().gather(2, safe_tokens[..., None]).squeeze(-1)
    u = torch.rand((b, k), generator=generator, device=p.device)
    # u < p/q written without the division; q = 0 cannot be drafted, p = 0 is never accepted.
    accept = (u * q_draft < p_draft) & valid
    num_accepted = _accepted_length(accept)

    # Distribution of the one extra token at position num_accepted.
    rows = torch.arange(b, device=p.device)
    p_next = p[rows, num_accepted]  # [B, V]
    rejected = num_accepted < k  # else: bonus token from p_K
    idx = num_accepted.clamp(max=max(k - 1, 0))
    if k > 0:
        if draft_probs is None:
            q_next = torch.zeros_like(p_next)
            q_next[rows, safe_tokens[rows, idx]] = 1.0
        else:
            q_next = draft_probs[rows, idx].float()
        q_next = q_next * (rejected & valid[rows, idx])[:, None]  # padded slot or bonus: q = 0
        residual = (p_next - q_next).clamp(min=0.0)
        mass = residual.sum(dim=-1, keepdim=True)
        # p == q up to rounding leaves no residual mass: fall back to p (a rejection there has
        # probability ~0, so this cannot bias the output).
        residual = torch.where(mass > 1e-12, residual / mass.clamp(min=1e-30), p_next)
    else:
        residual = p_next
    next_tokens = torch.multinomial(residual, 1, generator=generator).squeeze(1)
    return _assemble(draft_tokens, num_accepted, next_tokens), num_accepted
