"""Lab 7 — block verification. Fill in the four functions below.

Token-by-token verification (lab 1) stops at the first draft whose own test fails, even when the
drafts after it would have made up for it. Block verification (Sun et al. 2024, "Block
Verification Accelerates Speculative Decoding") judges the draft as a whole and keeps the
target's distribution exactly, like the token rule. Notation: drafts x_1..x_K; p_j and q_j
(j = 0..K) are the target's and the drafter's distributions after the first j drafts, so draft
x_i was drawn from q_{i-1} (q_K = 0: nothing is drafted after the last draft).

* a weight is carried along the draft: w_0 = 1, w_i = min(1, w_{i-1} * p_{i-1}(x_i) / q_{i-1}(x_i));
* after prefix i (the first i drafts) the residual is max(w_i * p_i - q_i, 0), with mass r_i
  (after the whole draft q_K = 0, so the residual is w_K * p_K and r_K = w_K);
* prefix i passes its test with the stopping probability h_i = r_i / (r_i + 1 - w_i);
* the LONGEST prefix that passes is kept (prefix 0 when none does), and the next token is drawn
  from that prefix's residual, normalised (all drafts kept: from p_K, the bonus token).

Conventions (the same as ``specdecode_ref.verify.block_verify`` and lab 1's ``rejection_sample``):
  B = batch size, K = number of drafted tokens, V = vocabulary size.
  target_probs [B, K+1, V]: p_0..p_K (column j: the target's distribution after the first j drafts).
  draft_tokens [B, K] (long): x_1..x_K in columns 0..K-1; a row with fewer than K drafts is
    padded with -1 at the end.
  draft_probs  [B, K, V] or None: q_0..q_{K-1} (column j: the distribution x_{j+1} was drawn
    from); None means a deterministic drafter (an n-gram lookup, greedy drafting), i.e. q is
    one-hot on the drafted token.
  Prefix i (i = 0..K) means "the first i drafts"; tensors over prefixes have K+1 columns.

Use only torch. All randomness must come from the ``generator`` argument (``torch.rand(...,
generator=generator)``, ``torch.multinomial(..., generator=generator)``); never reseed it.
Run the notebook next to this file to try your code, and its last cell for a self-check.
"""
from __future__ import annotations

import torch


def prefix_weights(ratio: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The weight of every prefix of the draft, carried along it.

    ratio: [B, K] float, column i - 1 holding p_{i-1}(x_i) / q_{i-1}(x_i) for draft x_i (the
      caller passes 0 where q_{i-1}(x_i) = 0 or the slot is padding).
    valid: [B, K] bool, False at padded slots (-1 drafts).

    Returns w [B, K+1] float with w_0 = 1 and w_i = min(1, w_{i-1} * ratio[:, i-1]): the
    running product is clamped, not each ratio on its own, so a token the draft under-proposes
    (ratio > 1) can win back what an earlier over-proposed one (ratio < 1) lost. The weight of a
    prefix that reaches a padded slot is 0 (and stays 0 after it). K may be 0: then w is [B, 1]
    of ones.
    Example, one row: ratio [0.5, 1.5, 3.0] -> w [1, 0.5, 0.75, 1].
    """
    raise NotImplementedError("prefix_weights: w_0 = 1, w_i = min(1, w_{i-1} * ratio_i), 0 after a pad")


def stop_probabilities(residual_mass: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The probability h_i that prefix i passes its test, elementwise.

    residual_mass: r_i, the mass of the residual max(w_i * p_i - q_i, 0) after prefix i, any
      shape (block_verify passes [B, K+1]).
    w: the prefix weights, same shape.

    Returns h = r / (r + 1 - w), same shape. Given that no longer prefix passed (probability
    1 - w_i + r_i), prefix i must stop with probability r_i: that is the share h_i. No special
    case for the last prefix: there q = 0, so r_K = w_K and h_K = w_K. Where r + 1 - w is 0 (up
    to rounding: below 1e-12), return 0 instead of dividing by zero (never NaN).
    """
    raise NotImplementedError("stop_probabilities: r / (r + 1 - w), 0 where that divides by 0")


def prefix_residual(p: torch.Tensor, q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The distribution of the next token when block verification keeps exactly prefix i:
    max(w_i * p - q, 0), renormalised.

    p, q: [..., V] p_i and q_i, the target's and the drafter's distributions after the prefix
      (any number of leading dimensions; q is all zeros after the last draft, so there the
      result is p).
    w: [...] w_i, the prefix's weight (one number per distribution).

    Returns [..., V], each row summing to 1. With w = 1 this is lab 1's residual max(p - q, 0);
    a prefix with w < 1 leaves more of q uncovered. Zero-mass guard: where the residual has no
    mass (below 1e-12), return p for that row instead of dividing by zero (block verification
    keeps such a prefix with probability 0, so this choice cannot bias the output).
    """
    raise NotImplementedError("prefix_residual: normalise max(w * p - q, 0); fall back to p")


def block_verify(target_probs: torch.Tensor, draft_tokens: torch.Tensor,
                 draft_probs: torch.Tensor | None = None,
                 generator: torch.Generator | None = None):
    """Verify a batch of drafts as blocks; the emitted tokens must be distributed exactly as under p.

    Returns ``(tokens, num_accepted)``, as lab 1's ``rejection_sample``:
      tokens [B, K+1] long: row b holds its kept drafts, then one more token (from the residual
        of the kept prefix, or the bonus token from p_K when all K drafts are kept), then -1 up
        to K+1.
      num_accepted [B] long: how many drafts row b kept; the row emits
        ``tokens[b, :num_accepted[b] + 1]``.

    Requirements:
      * q: ``draft_probs``, or one-hot on the drafted token when ``draft_probs`` is None; q counts
        as 0 at padded slots and after the last draft;
      * the weights with :func:`prefix_weights` from the ratios p_{i-1}(x_i) / q_{i-1}(x_i) (0
        where q is 0), the residual masses r_i = sum max(w_i * p_i - q_i, 0) for i = 0..K (q_K
        = 0), the stopping probabilities with :func:`stop_probabilities`;
      * one uniform per prefix from ``generator``: prefix i passes when u_i < h_i; keep the
        LONGEST prefix that passes (the paper scans from the whole draft down to prefix 0 and
        stops at the first pass), prefix 0 when none of 1..K passes;
      * padding: a row keeps at most its real drafts (a -1 is never kept), and the token after
        its last real draft comes from p there (q = 0 at the pad, so the residual is w * p);
      * the extra token from :func:`prefix_residual` at the kept prefix;
      * K may be 0 (draft_tokens of shape [B, 0]): then just sample from p_0;
      * raise ValueError when the shapes do not fit together (target_probs [B, K+1, V],
        draft_tokens [B, K], draft_probs [B, K, V]).

    Rows are independent requests: in one batch, rows may have different p and q and different
    numbers of real drafts. The grading checks that the output is lossless in every one of these
    cases, that at temperature 0 (one-hot target rows) it keeps exactly what the token rule
    keeps, and that in expectation it never keeps fewer drafts than the token rule.
    """
    raise NotImplementedError("block_verify: weights, stopping probabilities, longest passing prefix, residual")
