"""Deliberately WRONG speculative samplers: the common mistakes, kept runnable so they can be caught.

Never use these to generate text. Each one looks plausible, runs without error and accepts
drafts at a reasonable rate; the only symptom is that the output no longer follows the target
distribution p. Notebook 01 (section "Common mistakes") and tests/test_pitfalls.py show each one
failing a chi-square test that the correct :func:`specdecode_ref.verify.rejection_sample` passes.

* :func:`resample_from_target` - on rejection, draw the replacement from p instead of the
  residual max(p - q, 0). Tokens that the draft already "covered" are counted twice.
* :func:`reseed_every_draw` - the right algorithm, but the random generator is re-seeded with the
  same seed for every draw, so every draw sees the same uniform number and the same sampling noise.
* :func:`top_p_on_one_side` - the sampling settings reach only one side: with ``side="draft"``
  (the mistake) the drafter filters with top-p and the verifier builds p without it, so the output
  follows the unfiltered target. ``side="target"`` is the instructive contrast: it stays lossless
  (q is still the distribution the draft really came from) but wastes drafts.

The first two have the signature of ``rejection_sample``; the third returns the ``(p, q)`` pair a
buggy engine would hand to it.

* :func:`expected_tokens_bonus_counted_twice` - the speedup formula's popular mistake (notebook 02),
  next to the right one, ``analysis.expected_tokens_per_step``.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from .sampling import SamplingParams, logits_to_probs
from .verify import accepted_length, assemble_output, check_verify_inputs, rejection_sample


def resample_from_target(target_probs: torch.Tensor, draft_tokens: torch.Tensor,
                         draft_probs: torch.Tensor | None = None,
                         generator: torch.Generator | None = None):
    """MISTAKE: the acceptance test is right (accept with min(1, p/q)), but after a rejection the
    token is drawn from the target's own p, not from the residual max(p - q, 0) renormalised.

    The accepted path already produced token x with probability min(p(x), q(x)); drawing again
    from p adds (1 - beta) p(x) on top, so tokens where q >= p end up over-represented.
    Same arguments and return value as :func:`specdecode_ref.verify.rejection_sample`.
    """
    check_verify_inputs(target_probs, draft_tokens, "target_probs")
    b, k1, v = target_probs.shape
    k = k1 - 1
    p = target_probs.float()
    valid = draft_tokens >= 0
    safe = draft_tokens.clamp(min=0)
    p_draft = p[:, :k].gather(2, safe[..., None]).squeeze(-1)
    if draft_probs is None:
        q_draft = torch.ones_like(p_draft)
    else:
        q_draft = draft_probs.float().gather(2, safe[..., None]).squeeze(-1)
    u = torch.rand((b, k), generator=generator, device=p.device)
    num_accepted = accepted_length((u * q_draft < p_draft) & valid)
    p_next = p[torch.arange(b, device=p.device), num_accepted]
    next_tokens = torch.multinomial(p_next, 1, generator=generator).squeeze(1)  # <- the bug
    return assemble_output(draft_tokens, num_accepted, next_tokens), num_accepted


def reseed_every_draw(target_probs: torch.Tensor, draft_tokens: torch.Tensor,
                      draft_probs: torch.Tensor | None = None,
                      generator: torch.Generator | None = None, seed: int = 0):
    """MISTAKE: the correct sampler, but each draw (each row: one verification step of a request)
    gets a generator freshly seeded with the same ``seed`` - e.g. ``torch.manual_seed(seed)`` or
    ``torch.Generator().manual_seed(seed)`` inside the step function. The ``generator`` argument is
    ignored, as such code ignores the request's generator.

    Every draw then uses the same uniform u for its acceptance test and the same noise for its
    recovered token, so the output is a deterministic function of the draft: the draft x is kept
    exactly when p(x)/q(x) > u, and every rejection produces the same token for a given residual.
    """
    check_verify_inputs(target_probs, draft_tokens, "target_probs")
    rows_out, acc_out = [], []
    for row in range(target_probs.shape[0]):
        fresh = torch.Generator(device=target_probs.device).manual_seed(seed)  # <- the bug
        q = None if draft_probs is None else draft_probs[row: row + 1]
        tokens, acc = rejection_sample(target_probs[row: row + 1], draft_tokens[row: row + 1], q, fresh)
        rows_out.append(tokens)
        acc_out.append(acc)
    return torch.cat(rows_out), torch.cat(acc_out)


def top_p_on_one_side(target_logits: torch.Tensor, draft_logits: torch.Tensor, params: SamplingParams,
                      side: str = "draft"):
    """Return the ``(target_probs, draft_probs)`` an engine would use if ``params.top_p`` reached
    only one side. Temperature and top-k are applied to both.

    side="draft" (MISTAKE): the drafter samples with the user's top-p, the verifier computes p
    without it. Rejection sampling then faithfully reproduces the *unfiltered* target, so tokens
    outside the nucleus the user asked for come out. side="target": only p is filtered and the
    drafter samples (and reports) the unfiltered q. That is still lossless - the proof only needs q
    to be the distribution the draft was drawn from - but drafts outside the nucleus are always
    rejected. The fix for both: one :func:`~specdecode_ref.sampling.logits_to_probs` call with the
    same SamplingParams on each side.
    """
    if params.is_greedy:
        raise ValueError("top_p_on_one_side needs a sampling temperature > 0")
    if side not in ("draft", "target"):
        raise ValueError(f"side must be 'draft' or 'target', got {side!r}")
    without = replace(params, top_p=1.0)
    if side == "draft":
        return logits_to_probs(target_logits, without), logits_to_probs(draft_logits, params)
    return logits_to_probs(target_logits, params), logits_to_probs(draft_logits, without)


def expected_tokens_bonus_counted_twice(alpha, k):
    """MISTAKE: 1 + (1 - alpha^(k+1)) / (1 - alpha) tokens per step.

    The geometric sum 1 + alpha + ... + alpha^k already holds the target's token (its first
    term); adding "+1 for the bonus token" counts that token twice. Always exactly one token per
    step too many, so it claims 2 tokens per step for a drafter that is never right (alpha = 0).
    """
    from .analysis import expected_tokens_per_step

    return expected_tokens_per_step(alpha, k) + 1.0
