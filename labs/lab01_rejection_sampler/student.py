"""Lab 1 — the rejection sampler. Fill in the four functions below.

Speculative sampling keeps the target model's distribution p exactly although the tokens were
proposed by a cheaper draft distribution q:

* draft token x at position i is accepted with probability min(1, p_i(x) / q_i(x));
* at the first rejection the token is replaced by one drawn from the *residual*
  max(p_i - q_i, 0), renormalised;
* when all K drafts pass, one *bonus* token is drawn from p_K, the target's distribution after
  the last draft.

Conventions (the same as ``specdecode_ref.verify.rejection_sample``):
  B = batch size, K = number of drafted tokens, V = vocabulary size.
  target_probs [B, K+1, V]: p at the K draft positions and the one after them.
  draft_tokens [B, K] (long): the drafts; a row with fewer than K drafts is padded with -1.
  draft_probs  [B, K, V] or None: q at each draft position; None means a deterministic drafter
  (an n-gram lookup, greedy drafting), i.e. q is one-hot on the drafted token.

Use only torch. All randomness must come from the ``generator`` argument (``torch.rand(...,
generator=generator)``, ``torch.multinomial(..., generator=generator)``); never reseed it.
Run the notebook next to this file to try your code, and its last cell for a self-check.
"""
from __future__ import annotations

import torch


def accept_mask(p_draft: torch.Tensor, q_draft: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Which drafts pass the acceptance test, elementwise.

    p_draft: target probability p_i(x_i) of each drafted token, any shape.
    q_draft: draft probability q_i(x_i) of the same tokens, same shape.
    u:       uniform random numbers in [0, 1), same shape.

    Returns a bool tensor: True where u < p/q, i.e. where the draft is accepted with probability
    min(1, p/q). Write the test without dividing (u * q < p): q may be 0, and p = 0 must never
    be accepted.
    """
    raise NotImplementedError("accept_mask: accept where u * q < p")


def accepted_length(accept: torch.Tensor) -> torch.Tensor:
    """Number of accepted drafts per row: the length of the all-True prefix.

    accept: bool tensor [B, K]. Returns a long tensor [B]. Everything after the first False is
    discarded, because those drafts were conditioned on a token the target did not keep.
    Example: [[True, True, False, True], [False, True, True, True]] -> [2, 0].
    """
    raise NotImplementedError("accepted_length: length of the leading run of True")


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The distribution to sample from after a rejection: max(p - q, 0), renormalised.

    p, q: probability tensors of the same shape [..., V] (any number of leading dimensions).
    Returns a tensor of that shape whose last dimension sums to 1.

    Zero-mass guard: where p and q are equal (up to rounding) the residual has no mass; return p
    for those rows instead of dividing by zero (a rejection there has probability ~0, so this
    choice cannot bias the output).
    """
    raise NotImplementedError("residual_distribution: normalise max(p - q, 0); fall back to p")


def rejection_sample(target_probs: torch.Tensor, draft_tokens: torch.Tensor,
                     draft_probs: torch.Tensor | None = None,
                     generator: torch.Generator | None = None):
    """Verify a batch of drafts; the emitted tokens must be distributed exactly as under p.

    Returns ``(tokens, num_accepted)``:
      tokens [B, K+1] long: row b holds its accepted drafts, then one more token (the recovered
        token after a rejection, or the bonus token when all drafts passed), then -1 up to K+1.
      num_accepted [B] long: how many drafts row b accepted; the row emits
        ``tokens[b, :num_accepted[b] + 1]``.

    Requirements:
      * one uniform per draft position from ``generator``; accept with :func:`accept_mask`,
        keep the prefix with :func:`accepted_length`;
      * the extra token is drawn from :func:`residual_distribution` of p and q at the first
        rejected position, or from p_K (the last row of target_probs) when all K passed;
      * ``draft_probs=None``: q is one-hot on the drafted token;
      * padding: a draft token of -1 is never accepted, and q there counts as 0 (so the token at
        that position is drawn from p itself);
      * K may be 0 (draft_tokens of shape [B, 0]): then just sample from p_0;
      * raise ValueError when the shapes do not fit together (target_probs [B, K+1, V],
        draft_tokens [B, K], draft_probs [B, K, V]).

    Rows are independent requests: in one batch, rows may have different p and q and different
    numbers of real drafts (each padded with -1 to K). The grading checks that the output is
    lossless in every one of these cases; that check alone is 40 % of the points.
    """
    raise NotImplementedError("rejection_sample: accept test, residual, bonus")
